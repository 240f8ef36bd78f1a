"""One short iperf3 TCP test between two hosts: the measuring step of calibration, the engine benchmark,
the engine-tax check and the per-round drift reference (workloads have their own, richer runner)."""

from __future__ import annotations

import json
import time
from typing import Any

from tunnelbench.lab.host import Host


def iperf3_tcp(
    src: Host, dst: Host, dst_ip: str, seconds: float, port: int, streams: int = 1, omit_s: float = 0.0
) -> dict[str, Any]:
    """iperf3 -c dst_ip for `seconds` (one-off server on dst bound to dst_ip); returns iperf3's JSON."""
    srv = dst.spawn(
        ["iperf3", "-s", "-1", "-p", str(port), "-B", dst_ip], label="iperf3-check", log_path=None
    )
    try:
        deadline = time.monotonic() + 5
        while not dst.run(["ss", "-Hltn", f"sport = :{port}"], check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"iperf3 server on {dst.name}:{port} did not listen")
            time.sleep(0.01)
        argv = ["iperf3", "-c", dst_ip, "-p", str(port), "-J", "-t", f"{seconds:g}", "-P", str(streams)]
        if omit_s:
            argv += ["-O", f"{omit_s:g}"]
        r = src.run(argv, timeout=seconds + omit_s + 30, check=False)
        try:
            data: dict[str, Any] = json.loads(r.stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"iperf3 printed no JSON (exit {r.returncode}): {r.stderr[-300:]}") from None
        if "error" in data:
            raise RuntimeError(f"iperf3: {data['error']}")
        return data
    finally:
        srv.stop(grace=2)


def goodput_mbps(data: dict[str, Any]) -> float:
    bps: float = data["end"]["sum_received"]["bits_per_second"]
    return bps / 1e6
