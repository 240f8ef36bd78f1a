"""`tunnelbench bench-engine`: the impairment engine's ceiling next to the raw path, in one run, and its tables.

TCP goodput (1 and 4 streams) and packets/s through the router, raw and through the engine at 0 ms and
20 ms added delay, with the engine's CPU per packet (from its own stats: CPU seconds / packets)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from tunnelbench.impair.backend import Backend, NativeBackend
from tunnelbench.impair.profiles import Profile
from tunnelbench.impair.session import impair_lab
from tunnelbench.lab.host import Host

if TYPE_CHECKING:
    from tunnelbench.impair.tax import TaxCheck


@dataclass
class BenchRow:
    path: str
    streams: int
    goodput_gbps: float
    kpps: float  # wire packets/s the router forwarded toward the receiver, thousands
    engine_cpu_us_per_pkt: float | None
    engine_cpu_pct: float | None
    retransmits: int


WIRE_FRAME = 1514  # a full-size Ethernet frame at MTU 1500


def _tx_packets(router: Host, ifname: str) -> tuple[int, int]:
    out = json.loads(router.run(["ip", "-j", "-s", "link", "show", ifname]).stdout)
    tx = out[0]["stats64"]["tx"]
    return int(tx["packets"]), int(tx["bytes"])


def wire_packets(packets: int, nbytes: int) -> int:
    """Packets as they would cross a wire: the raw path forwards GRO/GSO super-packets (up to 64 KB, one
    counted packet), the engine's path wire-size ones; counting full frames in the bytes makes both
    comparable (at most a few % low: a super-packet carries one set of headers)."""
    return max(packets, nbytes // WIRE_FRAME)


def _iperf(src: Host, dst: Host, streams: int, seconds: float) -> dict[str, Any]:
    srv = dst.spawn(
        ["iperf3", "-s", "-1", "-p", "5298", "-B", dst.underlay_ip], label="iperf3-bench", log_path=None
    )
    try:
        deadline = time.monotonic() + 5
        while not dst.run(["ss", "-Hltn", "sport = :5298"], check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise RuntimeError("iperf3 server did not listen")
            time.sleep(0.01)
        r = src.run(["iperf3", "-c", dst.underlay_ip, "-p", "5298", "-J", "-t", f"{seconds:g}", "-P", str(streams)],
                    timeout=seconds + 30)  # fmt: skip
        data: dict[str, Any] = json.loads(r.stdout)
        return data
    finally:
        srv.stop(grace=2)


def measure(
    be: Backend, router: Host, src: Host, dst: Host, label: str, streams: int, seconds: float
) -> BenchRow:
    s0 = be.stats()
    p0, b0 = _tx_packets(router, dst.name)
    t0 = time.monotonic()
    data = _iperf(src, dst, streams, seconds)
    dt = time.monotonic() - t0
    p1, b1 = _tx_packets(router, dst.name)
    s1 = be.stats()
    end = data["end"]
    cpu_pp = cpu_pct = None
    if s0 and s1 and s1.get("packets_in", 0) > s0.get("packets_in", 0):
        pk = s1["packets_in"] - s0["packets_in"]
        cpu = s1["cpu_s"] - s0["cpu_s"]
        cpu_pp = 1e6 * cpu / pk
        cpu_pct = 100 * cpu / dt
    return BenchRow(
        label,
        streams,
        end["sum_received"]["bits_per_second"] / 1e9,
        wire_packets(p1 - p0, b1 - b0) / dt / 1e3,
        cpu_pp,
        cpu_pct,
        int(end["sum_sent"].get("retransmits", 0)),
    )


def run_bench(
    root: Path,
    seconds: float = 5.0,
    big_buffers: bool = True,
    placement_mode: str = "auto",
    vpns: list[str] | None = None,
    tax_rounds: int = 3,
) -> tuple[str, list[BenchRow], list[TaxCheck], str]:
    """Rows: the raw path, then the engine at 0 and 20 ms in both modes (GSO super-packets whole, every wire
    packet). With `vpns`, each VPN's engine tax (TaxCheck per mode). Returns (engine version, rows, tax
    checks, placement summary)."""
    from tunnelbench.impair import tax
    from tunnelbench.lab import cpus

    rows: list[BenchRow] = []
    checks: list[TaxCheck] = []
    with impair_lab(root) as (lab, be):
        h1, h2 = lab.hosts
        pl = cpus.plan(placement_mode, isinstance(be, NativeBackend), [h.name for h in lab.hosts])
        pl.pin(lab.hosts)
        if isinstance(be, NativeBackend):
            be.place(pl.engine)
        if big_buffers:
            # a 20 ms path needs a window larger than the default 4 MiB tcp_wmem ceiling to be engine-limited
            for h in (h1, h2):
                h.run(["sysctl", "-qw", "net.ipv4.tcp_wmem=4096 131072 33554432"])
                h.run(["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 131072 33554432"])
        version = be.version() if isinstance(be, NativeBackend) else be.name
        for streams in (1, 4):
            rows.append(measure(be, lab.router, h1, h2, "raw (no engine)", streams, seconds))
        modes = (
            [("gso", "auto"), ("per wire packet", "segment")] if isinstance(be, NativeBackend) else [("", "")]
        )
        for delay in (0.0, 20.0):
            for mode_label, gso_mode in modes:
                if isinstance(be, NativeBackend):
                    be.gso_mode = gso_mode
                be.apply(Profile(name=f"engine-{delay:g}ms", delay_ms=delay), force_engine=True)
                label = f"{be.name} +{delay:g} ms" + (f" ({mode_label})" if mode_label else "")
                try:
                    for streams in (1, 4):
                        rows.append(measure(be, lab.router, h1, h2, label, streams, seconds))
                        why = be.health()
                        if why:
                            raise RuntimeError(why)
                finally:
                    be.clear()
        if vpns and isinstance(be, NativeBackend):
            from tunnelbench.catalog import resolve
            from tunnelbench.vpns.session import mesh_session

            for name in vpns:
                cls = resolve(name)
                avail = cls.availability(lab.hosts)
                if not avail.ok:
                    raise RuntimeError(f"{name}: {avail.reason}")
                out: dict[str, Any] = {}
                with mesh_session(cls, lab, 60, out) as (mesh, _):
                    checks += tax.measure_tax(
                        be,
                        f"{name} {avail.version}",
                        h1,
                        h2,
                        mesh.tunnel_ip(h2),
                        max(1, round(seconds)),
                        ["gso", "segment"],
                        rounds=tax_rounds,
                    )
                if "stop_error" in out:  # the next VPN must not start on what this one left
                    raise RuntimeError(f"{name}: stopping the mesh failed: {out['stop_error']}")
                if "leftovers" in out:
                    raise RuntimeError(f"{name}: teardown left {out['leftovers']}")
    return version, rows, checks, pl.summary()


def tables(
    version: str, rows: list[BenchRow], checks: list[TaxCheck], seconds: float, rounds: int
) -> list[Table]:
    """`tunnelbench bench-engine`'s tables: the engine against the raw path, then the engine tax per VPN."""
    t = Table(
        title=f"impairment engine benchmark ({version}), TCP h1 -> h2, {seconds:g} s per cell",
        title_justify="left",
        caption="µs CPU/pkt counts wire packets in both modes (a GSO super-packet counts as the wire packets it "
        "stands for); kpkt/s counts wire-size packets on both",
        caption_justify="left",
    )
    for c in (
        "path",
        "streams",
        "goodput Gbit/s",
        "kpkt/s",
        "engine µs CPU/pkt",
        "engine CPU %",
        "retransmits",
    ):
        t.add_column(c, justify="left" if c == "path" else "right")
    for r in rows:
        t.add_row(
            r.path,
            str(r.streams),
            f"{r.goodput_gbps:.2f}",
            f"{r.kpps:.0f}",
            "–" if r.engine_cpu_us_per_pkt is None else f"{r.engine_cpu_us_per_pkt:.2f}",
            "–" if r.engine_cpu_pct is None else f"{r.engine_cpu_pct:.0f}",
            str(r.retransmits),
        )
    if not checks:
        return [t]
    tt = Table(
        title=f"engine tax, TCP {max(1, round(seconds))} s legs, {rounds} off/on alternations",
        title_justify="left",
    )
    for c in ("VPN", "engine mode", "without engine Mbit/s", "with engine Mbit/s", "tax", "engine CPU %"):
        tt.add_column(c, justify="left" if c in ("VPN", "engine mode") else "right")
    for tc in checks:
        tt.add_row(
            tc.vpn,
            tc.mode,
            f"{statistics.median(tc.off_mbps):,.0f}",
            f"{statistics.median(tc.on_mbps):,.0f}",
            Text(f"{tc.tax_pct:+.1f}%", style="red" if tc.flagged else ""),
            f"{statistics.median(tc.engine_cpu_pct):.0f}" if tc.engine_cpu_pct else "–",
        )
    return [t, tt]
