"""The mesh-scale curve (`tunnelbench mesh-scale`): how a mesh VPN behaves as it grows, every host a peer of every other.

One point = a fresh N-host lab (direct path, full mesh), the VPN configured for all N and started host by host,
then measured:
  start_s      seconds until the driver had started every host's daemon(s)
  ready_s      seconds from the first start until every ordered pair answered a ping over the tunnel (and each
               pair's own time: pair_ready_p50_s / _p95_s, so one straggler shows as such). Probed
               in parallel (PROBE_THREADS fping runs at once, each host to the peers it has not reached yet,
               1 ms apart), so the resolution is one probe round, which is printed (`probe_round_s`)
  idle         after IDLE_S of no traffic: each daemon's RSS and CPU share over the idle window, grouped by
               the daemon's label, so a control plane (headscale, innernet-server, the nebula lighthouse's
               own process counts as a peer) is its own row
  rtt_ms       median of RTT_PINGS pings h1 -> hN over the tunnel (the mesh's far corner)
The sizes run in order; a VPN stops at the first size that fails (not ready within the timeout) or that the
machine's memory cannot hold (estimated from the previous size's RSS per node), and the result says which
bound was reached and why. A JSON artifact is rewritten after every point (an interrupted sweep keeps what
it measured)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tunnelbench.catalog import DRIVERS
from tunnelbench.core.files import check_destination, write_atomic
from tunnelbench.lab.make import lab_session
from tunnelbench.lab.procstat import read_stat
from tunnelbench.lab.spec import LabCfg
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.vpns.session import mesh_session

DEFAULT_SIZES = (10, 25, 50, 100)
IDLE_S = 10.0
RTT_PINGS = 20
PROBE_THREADS = 16
MEMORY_HEADROOM = 0.7  # a size runs only if its estimated RSS fits in this share of MemAvailable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def ready_timeout(n: int) -> float:
    """Seconds a mesh of n gets, after its last daemon started, to answer on every pair (n(n-1) of them)."""
    return 60.0 + 2.0 * n


def mem_available_mb() -> float:
    m = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return int(m.group(1)) / 1024 if m else 0.0


def probe_until_ready(mesh: Mesh, t0: float, timeout: float) -> tuple[float, float, int, list[float]]:
    """(seconds from t0 until every ordered pair answered, the longest probe round, rounds, each pair's
    seconds until its first answer). A pair that answered once stays answered. Raises TimeoutError naming how
    many pairs never answered."""
    hosts = mesh.hosts
    pending = {h.name: {mesh.tunnel_ip(p): p.name for p in mesh.driver.peers(h)} for h in hosts}
    by_name = {h.name: h for h in hosts}

    def probe(name: str) -> tuple[str, set[str]]:
        targets = pending[name]
        res = by_name[name].run(["fping", "-a", "-r", "0", "-i", "1", "-t", "500", *targets], check=False,
                                timeout=30 + len(targets) / 100)  # fmt: skip
        return name, set(res.stdout.split())

    worst, rounds = 0.0, 0
    answered: list[float] = []
    with ThreadPoolExecutor(PROBE_THREADS) as pool:
        while any(pending.values()):
            if time.monotonic() - t0 > timeout:
                left = sum(len(v) for v in pending.values())
                raise TimeoutError(
                    f"{left} of {len(hosts) * (len(hosts) - 1)} pairs not answering "
                    f"{timeout:.0f} s after the first start"
                )
            r0 = time.monotonic()
            for name, alive in pool.map(probe, [n for n, v in pending.items() if v]):
                now = time.monotonic() - t0
                answered += [now] * len(alive & set(pending[name]))
                pending[name] = {ip: p for ip, p in pending[name].items() if ip not in alive}
            worst, rounds = max(worst, time.monotonic() - r0), rounds + 1
    return time.monotonic() - t0, worst, rounds, answered


def idle_usage(mesh: Mesh, idle_s: float) -> dict[str, dict[str, Any]]:
    """Per daemon label: count, RSS (MB) median and max, CPU % of one core mean and max, over `idle_s`."""
    procs = [p for h in mesh.hosts for p in mesh.driver.daemons(h)]
    before = {p.pid: read_stat(p.pid) for p in procs}
    time.sleep(idle_s)
    after = {p.pid: read_stat(p.pid) for p in procs}
    per: dict[str, dict[str, list[float]]] = {}
    for p in procs:
        a, b = before[p.pid], after[p.pid]
        if a is None or b is None:
            continue
        d = per.setdefault(p.label, {"rss": [], "cpu": []})
        d["rss"].append(b.rss * PAGE / 2**20)
        d["cpu"].append(100 * (b.utime + b.stime - a.utime - a.stime) / CLK_TCK / idle_s)
    return {
        label: {
            "daemons": len(d["rss"]),
            "rss_mb_median": round(statistics.median(d["rss"]), 1),
            "rss_mb_max": round(max(d["rss"]), 1),
            "rss_mb_total": round(sum(d["rss"]), 1),
            "cpu_pct_mean": round(statistics.fmean(d["cpu"]), 2),
            "cpu_pct_max": round(max(d["cpu"]), 2),
        }
        for label, d in per.items()
    }


def median_rtt_ms(mesh: Mesh) -> float | None:
    a, b = mesh.hosts[0], mesh.hosts[-1]
    res = a.run(["ping", "-n", "-c", str(RTT_PINGS), "-i", "0.05", "-W", "1", mesh.tunnel_ip(b)], check=False,
                timeout=RTT_PINGS + 10)  # fmt: skip
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", res.stdout)]
    return round(statistics.median(rtts), 3) if rtts else None


def point(vpn: str, n: int, workdir: Path, idle_s: float = IDLE_S) -> dict[str, Any]:
    """One mesh of n hosts for one VPN, in its own lab (built and destroyed here)."""
    out: dict[str, Any] = {"n": n, "pairs": n * (n - 1)}
    try:
        with (
            lab_session(LabCfg(hosts=n), workdir, out) as pt,
            mesh_session(DRIVERS[vpn], pt.lab, None, out) as (mesh, st),  # readiness: measured below
        ):
            t0, started = st.started_at, st.start_s
            out["start_s"] = round(started, 2)
            try:
                # the timeout runs from the last start: a control plane that enrols nodes one by one (headscale)
                # takes minutes at N = 100 before the first probe, and that is start_s, not a failure to connect
                # (the unrounded time: a rounded-up start_s would give a zero timeout a moment's grace)
                ready, worst, rounds, pairs = probe_until_ready(mesh, t0, started + ready_timeout(n))
            except TimeoutError as e:
                out.update(result="failed", why=f"not ready: {e}")
                return out
            q = statistics.quantiles(pairs, n=20, method="inclusive") if len(pairs) > 1 else [ready] * 19
            out.update(
                ready_s=round(ready, 2),
                pair_ready_p50_s=round(statistics.median(pairs), 2),
                pair_ready_p95_s=round(q[18], 2),
                probe_round_s=round(worst, 2),
                probe_rounds=rounds,
            )
            out["idle"] = idle_usage(mesh, idle_s)
            out["rtt_ms"] = median_rtt_ms(mesh)
            out["result"] = "ok"
            return out
    except Exception as e:  # a point that cannot be measured is recorded and ends the VPN's sweep
        out.update(result="failed", why=f"{type(e).__name__}: {e}"[:400])
        return out


def memory_bound(last: dict[str, Any] | None, n: int) -> str | None:
    """Why a mesh of n would not fit in memory, judged from the last measured size; None if it fits."""
    if last is None or last.get("result") != "ok":
        return None
    per_node = sum(g["rss_mb_total"] for g in last["idle"].values()) / last["n"]
    need, have = per_node * n, mem_available_mb()
    if need > MEMORY_HEADROOM * have:
        return (
            f"memory: {n} nodes x {per_node:.0f} MB RSS per node (measured at N = {last['n']}) = "
            f"{need:.0f} MB > {MEMORY_HEADROOM:.0%} of {have:.0f} MB available"
        )
    return None


def run_sweep(
    vpns: list[str],
    sizes: list[int],
    workdir: Path,
    out_json: Path | None = None,
    idle_s: float = IDLE_S,
    progress: Callable[[str], object] = print,
) -> dict[str, Any]:
    if out_json is not None:  # before the first cell: a folder we cannot write, or a link there, is said now
        out_json.parent.mkdir(parents=True, exist_ok=True)
        check_destination(out_json)
    result: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "sizes": sizes,
        "idle_s": idle_s,
        "cores": os.cpu_count(),
        "mem_total_mb": _mem_total_mb(),
        "vpns": {},
    }
    for vpn in vpns:
        a = DRIVERS[vpn].availability()
        row: dict[str, Any] = {"version": a.version, "points": []}
        result["vpns"][vpn] = row
        if not a.ok:
            row["unavailable"] = a.reason
            progress(f"{vpn}: unavailable ({a.reason})")
            continue
        last = None
        for n in sizes:
            why = memory_bound(last, n)
            if why:
                row["bound"] = {"n": n, "why": why}
                progress(f"{vpn}: N = {n} not run: {why}")
                break
            p = point(vpn, n, workdir, idle_s)
            row["points"].append(p)
            progress(
                f"{vpn}: N = {n}: {p['result']}"
                + (
                    f", all {p['pairs']} pairs answering after "
                    f"{p['ready_s']} s, {per_node_mb(p):.1f} MB per node"
                    if p["result"] == "ok"
                    else f": {p.get('why', '')}"
                )
                + f" ({p['seconds']} s)"
            )
            if out_json is not None:
                write_atomic(out_json, json.dumps(result, indent=2) + "\n")
            if p["result"] != "ok":
                row["bound"] = {"n": n, "why": p.get("why", "failed")}
                break
            last = p
        ok = [p["n"] for p in row["points"] if p["result"] == "ok"]
        row["largest_n"] = max(ok, default=None)
    result["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if out_json is not None:
        write_atomic(out_json, json.dumps(result, indent=2) + "\n")
    return result


def per_node_mb(p: dict[str, Any]) -> float:
    total: float = sum(g["rss_mb_total"] for g in p.get("idle", {}).values())
    nodes: int = p["n"]
    return total / nodes


def _mem_total_mb() -> float:
    m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return round(int(m.group(1)) / 1024) if m else 0.0


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per VPN x size: the curve as the terminal prints it."""
    head = [
        "VPN",
        "N",
        "pairs",
        "start s",
        "ready s (pairs p50/p95)",
        "probe round s",
        "RSS MB / node",
        "daemons (label: RSS median MB, CPU % mean)",
        "RTT h1->hN ms",
    ]
    rows = []
    for vpn, row in result["vpns"].items():
        if "unavailable" in row:
            rows.append([vpn, "-", "-", "-", "-", "-", "-", f"unavailable: {row['unavailable']}"[:80], "-"])
            continue
        for p in row["points"]:
            if p["result"] != "ok":
                rows.append(
                    [
                        vpn,
                        str(p["n"]),
                        str(p["pairs"]),
                        str(p.get("start_s", "-")),
                        "failed",
                        "-",
                        "-",
                        p.get("why", "")[:120],
                        "-",
                    ]
                )
                continue
            groups = "; ".join(
                f"{k} x{g['daemons']}: {g['rss_mb_median']}, {g['cpu_pct_mean']}"
                for k, g in p["idle"].items()
            )
            rows.append(
                [
                    vpn,
                    str(p["n"]),
                    str(p["pairs"]),
                    f"{p['start_s']}",
                    f"{p['ready_s']} ({p.get('pair_ready_p50_s', '-')}/{p.get('pair_ready_p95_s', '-')})",
                    f"{p['probe_round_s']}",
                    f"{per_node_mb(p):.1f}",
                    groups,
                    "-" if p["rtt_ms"] is None else f"{p['rtt_ms']}",
                ]
            )
        if "bound" in row:
            rows.append([vpn, str(row["bound"]["n"]), "", "", "bound", "", "", row["bound"]["why"][:160], ""])
    return head, rows


def plot_svg(result: dict[str, Any]) -> str | None:
    """ready_s and RSS per node against N (log x axis), one line per VPN."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tunnelbench.report.plots import to_svg

    lines = {
        vpn: [p for p in row.get("points", []) if p["result"] == "ok"] for vpn, row in result["vpns"].items()
    }
    lines = {v: ps for v, ps in lines.items() if ps}
    if not lines:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for vpn, ps in lines.items():
        a1.plot([p["n"] for p in ps], [p["ready_s"] for p in ps], marker="o", label=vpn)
        a2.plot([p["n"] for p in ps], [per_node_mb(p) for p in ps], marker="o", label=vpn)
    for ax, y in ((a1, "seconds until every pair answers"), (a2, "daemon RSS per node at idle (MB)")):
        ax.set_xscale("log")
        ax.set_xlabel("mesh size N (hosts, log scale)")
        ax.set_ylabel(y)
        ax.grid(True, alpha=0.3)
    a1.legend(fontsize=8)
    fig.suptitle(f"full-mesh scale on {result['cores']} cores, {result['mem_total_mb']:.0f} MB")
    return to_svg(fig)
