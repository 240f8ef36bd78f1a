"""Plumbing several workloads share: background iperf3 runs, percentiles, interface counters, tool lookup."""

from __future__ import annotations

import json
import platform
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunnelbench.core.results import Outcome, WorkloadError
from tunnelbench.instruments.base import CaseEnds
from tunnelbench.instruments.iperf3 import client_argv, sized, start_server
from tunnelbench.lab.host import Host, Process, host_arch, remote_build


def tool(name: str) -> str:
    """A tool's path: PATH first, then where `go install` puts binaries for root (hey)."""
    found = shutil.which(name)
    if found:
        return found
    for d in (Path("/usr/local/bin"), Path.home() / "go" / "bin", Path("/root/go/bin")):
        if (d / name).exists():
            return str(d / name)
    raise WorkloadError(f"{name} not found; run scripts/setup.sh")


def script_argv(host: Host, script: str, name: str) -> list[str]:
    """A stdlib-only agent (crr_agent, stream_agent) as `host` runs it: this file with this Python here (a plain
    script, not -m: that would import every workload first); on a remote host the file copied into its work
    folder once per run as `name`, run by its python3 (nothing of tunnelbench is installed there)."""
    if not host.remote:
        return [sys.executable, script]
    path = host.workdir / "agents" / name
    key = f"_tb_agent_{name}"
    if host.__dict__.get(key) != path:
        host.write_file(path, Path(script).read_bytes(), 0o755)
        host.__dict__[key] = path
    return ["python3", str(path)]


def tool_on(host: Host, name: str) -> str:
    """A built tool (hey, quicperf: built here, not a Debian package) as `host` runs it: this machine's build
    in the namespace lab; on a remote host lab.host.remote_build's answer (the same build copied there when
    the architectures are equal, else the host's own)."""
    if not host.remote:
        return tool(name)
    try:
        local: str | None = tool(name)
    except WorkloadError:
        local = None
    found = remote_build(host, name, Path(local) if local else None)
    if found is None:
        arch = host_arch(host)
        why = (
            f"this machine's build is for {platform.machine()}, the host is {arch}" if local else "none here"
        )
        raise WorkloadError(f"{name} is not on {host.name} ({why}): put a {name} for {arch} on its PATH")
    return found


def add_percentiles(
    out: Outcome, prefix: str, values: Iterable[float], unit: str = "ms", qs: Iterable[int] = (50, 90, 99)
) -> None:
    vals = np.asarray(list(values), dtype=float)
    if vals.size == 0:
        return
    for q in qs:
        out.add(f"{prefix}_p{q}_{unit}", float(np.percentile(vals, q)))


@dataclass
class Iperf3Run:
    """An iperf3 client started in the background (JSON to a file) against a one-off server."""

    server: Process
    client: Process
    json_path: Path  # on the client host
    label: str
    local_json: Path | None = None  # where a remote client's JSON is copied (the case's artifact folder)

    def wait(self, timeout: float) -> dict[str, Any]:
        if self.client.wait(timeout) is None and self.client.alive():
            self.client.stop(grace=1)
            self.server.stop(grace=1)
            raise WorkloadError(f"iperf3 {self.label} did not finish within {timeout:.0f} s")
        self.server.stop(grace=2)
        self.client.stop(grace=1)  # releases the journal entry
        host = self.client.host
        raw = host.read_file(self.json_path) if host.exists(self.json_path) else b""
        if self.local_json is not None and raw:
            self.local_json.write_bytes(raw)
        text = raw.decode(errors="replace")
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError:
            raise WorkloadError(f"iperf3 {self.label} printed no JSON: {text[-300:]}") from None
        if "error" in data:
            raise WorkloadError(f"iperf3 {self.label}: {data['error']}")
        return data

    def stop(self) -> None:
        self.client.stop(grace=1)
        self.server.stop(grace=1)


def start_iperf3(
    ctx: CaseEnds,
    client: Host,
    server: Host,
    server_ip: str,
    port: int,
    args: list[str],
    duration_s: float,
    label: str,
    omit_s: float = 0.0,
    mss: int | None = None,
) -> Iperf3Run:
    """Start a one-off iperf3 server on `server` (bound to server_ip:port) and a client on `client`."""
    log = ctx.artifact_dir / f"{label}-server.log"
    srv = start_server(server, server_ip, port, f"iperf3-server-{label}", log)
    local_json = ctx.artifact_dir / f"{label}-client.json"
    # iperf3 writes its JSON where it runs: a remote client into its work folder (copied back by wait())
    json_path = client.workdir / "iperf3" / local_json.name if client.remote else local_json
    client.remove(json_path)  # a previous case's
    if client.remote:
        client.mkdir(json_path.parent)
    argv = client_argv(
        server_ip, port, duration_s, omit_s, mss, ["--logfile", str(json_path), *sized(args, client, server)]
    )
    cli = client.spawn(
        argv, label=f"iperf3-client-{label}", log_path=ctx.artifact_dir / f"{label}-client.log"
    )
    return Iperf3Run(srv, cli, json_path, label, local_json if client.remote else None)


def link_counters(host: Host, ifname: str) -> dict[str, int]:
    """rx/tx bytes and packets of one interface on a host (from sysfs, read inside its namespace)."""
    base = f"/sys/class/net/{ifname}/statistics"
    names = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
    out = host.run(["cat", *[f"{base}/{n}" for n in names]]).stdout.split()
    return {n: int(v) for n, v in zip(names, out, strict=True)}


def interface_of(host: Host, ip: str) -> str | None:
    """The interface that holds address `ip` on the host (the tunnel interface of a VPN, eth0 for internal)."""
    out = host.run(["ip", "-o", "-4", "addr", "show", "to", ip], check=False).stdout.split()
    return out[1].split("@")[0] if len(out) > 1 else None
