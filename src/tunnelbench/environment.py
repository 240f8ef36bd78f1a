"""What can change a result, recorded with every run: kernel, CPU, congestion control, offloads, sysctls,
tool versions."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tunnelbench import __version__

if TYPE_CHECKING:
    from tunnelbench.lab.host import Host

SYSCTLS = (
    "net.ipv4.tcp_congestion_control",
    "net.core.default_qdisc",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.core.rmem_max",
    "net.core.wmem_max",
)


def _out(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "missing"
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "error"
    return (p.stdout or p.stderr).strip()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def tool_versions() -> dict[str, str]:
    return {
        "iperf3": _out(["iperf3", "--version"]).splitlines()[0] if shutil.which("iperf3") else "missing",
        "ping": _out(["ping", "-V"]).splitlines()[0] if shutil.which("ping") else "missing",
        "fping": _out(["fping", "--version"]).splitlines()[0] if shutil.which("fping") else "missing",
        "iproute2": _out(["ip", "-V"]),
        "nft": _out(["nft", "--version"]),
        # the HTTP workloads' tools: nginx prints its version on stderr, hey has no version flag (pinned in setup.sh)
        "nginx": _out(["nginx", "-v"]) if shutil.which("nginx") else "missing",
        "curl": _out(["curl", "--version"]).splitlines()[0] if shutil.which("curl") else "missing",
        "hey": "github.com/rakyll/hey v0.1.5 (pinned)" if shutil.which("hey") else "missing",
        "quicperf": _out(["quicperf", "version"]) if shutil.which("quicperf") else "missing",
        "ristsender": _out(["ristsender", "-h"]).split("ristsender version:")[-1].split("\n")[0].strip()
        if shutil.which("ristsender")
        else "missing",
    }


def collect(host_argv_prefix: list[str] | None = None) -> dict[str, object]:
    """Environment of the machine; sysctls and offloads are read inside a lab host when a prefix is given."""
    pre = host_argv_prefix or []
    env: dict[str, object] = {
        "tunnelbench_version": __version__,
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        env["mem_total_kb"] = int(Path("/proc/meminfo").read_text().split()[1])
    for k in SYSCTLS:
        env[f"sysctl.{k}"] = _out([*pre, "sysctl", "-n", k])
    if pre:
        env["offloads.eth0"] = _offloads(pre)
    for name, v in tool_versions().items():
        env[f"tool.{name}"] = v
    return env


def _offloads(pre: list[str]) -> str:
    out = _out([*pre, "ethtool", "-k", "eth0"])
    keep = (
        "tcp-segmentation-offload",
        "generic-segmentation-offload",
        "generic-receive-offload",
        "tx-checksumming",
        "rx-checksumming",
    )
    return "; ".join(line.strip() for line in out.splitlines() if line.split(":")[0].strip() in keep)


def collect_remote(host: Host) -> dict[str, object]:
    """The same record for a host reached over SSH (lab/ssh_host.py): everything is read on that host."""

    def out(*argv: str) -> str:
        try:
            r = host.run(list(argv), check=False, timeout=15)
        except Exception:  # noqa: BLE001 (a missing tool or a slow host must not fail the run)
            return "error"
        if r.returncode == 127:
            return "missing"
        return (r.stdout or r.stderr).strip()

    def first(s: str) -> str:
        return s.splitlines()[0] if s else s

    env: dict[str, object] = {
        "tunnelbench_version": __version__,
        "kernel": out("uname", "-r"),
        "kernel_version": out("uname", "-v"),
        "machine": out("uname", "-m"),
        "cpu_model": out("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'")
        or "unknown",
        "python": platform.python_version(),
        "hostname": out("hostname"),
        "controller_hostname": platform.node(),
    }
    with contextlib.suppress(ValueError):
        env["cpu_count"] = int(out("nproc"))
    with contextlib.suppress(ValueError, IndexError):
        env["mem_total_kb"] = int(out("head", "-1", "/proc/meminfo").split()[1])
    for k in SYSCTLS:
        env[f"sysctl.{k}"] = out("sysctl", "-n", k)
    ifname = getattr(host, "underlay_if", "eth0")
    o = out("ethtool", "-k", ifname)
    keep = (
        "tcp-segmentation-offload",
        "generic-segmentation-offload",
        "generic-receive-offload",
        "tx-checksumming",
        "rx-checksumming",
    )
    env[f"offloads.{ifname}"] = "; ".join(
        line.strip() for line in o.splitlines() if line.split(":")[0].strip() in keep
    )
    env["tool.iperf3"] = first(out("iperf3", "--version"))
    env["tool.ping"] = first(out("ping", "-V"))
    env["tool.fping"] = first(out("fping", "--version"))
    env["tool.iproute2"] = out("ip", "-V")
    env["tool.nft"] = out("nft", "--version")
    return env
