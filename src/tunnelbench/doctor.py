"""`tunnelbench doctor`: what this machine can and cannot do, and what that means for results.

Kernel features are probed for real inside a scratch namespace (deleted afterwards), not guessed."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

from tunnelbench.lab.tags import TAG_PREFIX
from tunnelbench.vpns import DRIVERS
from tunnelbench.workloads import WORKLOADS


@dataclass
class Check:
    group: str
    name: str
    ok: bool
    detail: str
    meaning: str = ""


TOOLS = {
    "ip": "iproute2: namespaces, veth, routes (required)",
    "nft": "nftables: the router's guard table (required)",
    "iptables": "iptables: NFQUEUE target for the native impairment engine",
    "tc": "traffic control: rate limiting (TBF/HTB), netem where the kernel has it",
    "iperf3": "TCP/UDP throughput workloads (required)",
    "ping": "latency and readiness probes (required)",
    "fping": "mesh readiness checks (required)",
    "ss": "socket state, iperf3 server readiness (required)",
    "ethtool": "offload settings recorded with each run",
}


def _sh(argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, input=input)


def tunnel_checks(where: str = "local", run=None) -> list[Check]:
    """Every kernel data path lab/kernel.py probes (on this machine, or on the SSH host `where` through `run`),
    with the drivers that need it: `doctor` lists which tunnel types each target's kernel has."""
    from tunnelbench.lab import kernel

    have = kernel.features(where, run) if run else kernel.features(where)
    out = []
    for f, (what, module, _) in kernel.FEATURES.items():
        users = sorted(n for n, d in DRIVERS.items() if f in d.kernel_features)
        if not users:
            continue
        need = f"{', '.join(users)} cannot run"
        out.append(Check("kernel tunnels", f"{what} ({module})", have[f] is None,
                         "available" if have[f] is None else have[f], need if have[f] is not None else ""))  # fmt: skip
    return out


def _probe_kernel(sh=_sh) -> list[Check]:
    """`sh(argv, input=None)` runs a command here or, for `doctor --inventory`, on an SSH host."""
    ns = f"{TAG_PREFIX}doc{secrets.token_hex(2)}"
    checks: list[Check] = []
    if sh(["ip", "netns", "add", ns]).returncode != 0:
        return [
            Check("kernel", "network namespaces", False, "ip netns add failed", "the embedded lab cannot run")
        ]
    try:

        def run(*argv: str, input: str | None = None) -> subprocess.CompletedProcess:
            return sh(["ip", "netns", "exec", ns, *argv], input=input)

        checks.append(Check("kernel", "network namespaces", True, "ip netns add works"))
        run("ip", "link", "set", "lo", "up")
        r = run("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        checks.append(
            Check("kernel", "veth", r.returncode == 0, r.stderr.strip() or "ok", "hosts cannot be wired")
        )
        r = run("ip", "tuntap", "add", "t0", "mode", "tun")
        checks.append(Check("kernel", "TUN/TAP", r.returncode == 0, r.stderr.strip() or "/dev/net/tun usable",
                            "userspace VPNs cannot create interfaces"))  # fmt: skip
        r = run("tc", "qdisc", "add", "dev", "v0", "root", "netem", "delay", "1ms")
        checks.append(Check("kernel", "tc netem", r.returncode == 0, r.stderr.strip() or "available",
                            "delay/jitter/reorder need the native engine (native/impaird over NFQUEUE)"))  # fmt: skip
        run("tc", "qdisc", "del", "dev", "v0", "root")
        r = run(
            "tc",
            "qdisc",
            "add",
            "dev",
            "v0",
            "root",
            "tbf",
            "rate",
            "10mbit",
            "burst",
            "32kb",
            "latency",
            "50ms",
        )
        checks.append(Check("kernel", "tc tbf", r.returncode == 0, r.stderr.strip() or "available",
                            "rate limits cannot be applied"))  # fmt: skip
        r = run("ip", "link", "add", "wg0", "type", "wireguard")
        checks.append(Check("kernel", "kernel WireGuard", r.returncode == 0, r.stderr.strip() or "module present",
                            "only userspace WireGuard (wireguard-go, boringtun) can be measured"))  # fmt: skip
        r = run(
            "nft",
            "-f",
            "-",
            input="table inet t {\n chain c {\n type filter hook forward priority 0;\n queue num 0\n }\n}\n",
        )
        checks.append(Check("kernel", "nftables queue", r.returncode == 0, r.stderr.strip().splitlines()[0][:120] if r.returncode else "available",
                            "packets are queued with the iptables NFQUEUE target instead"))  # fmt: skip
        r = run("iptables", "-t", "mangle", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0")
        checks.append(Check("kernel", "iptables NFQUEUE", r.returncode == 0, r.stderr.strip()[:120] or "available",
                            "the native impairment engine cannot receive packets"))  # fmt: skip
        r = run(
            "ip", "link", "add", "vx0", "type", "vxlan", "id", "1", "dstport", "4789", "local", "127.0.0.1"
        )
        checks.append(Check("kernel", "VXLAN", r.returncode == 0, r.stderr.strip() or "available",
                            "the unencrypted overlay baseline cannot run"))  # fmt: skip
        cc = run("sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout.strip()
        checks.append(
            Check("kernel", "TCP congestion control", True, cc or "unknown", "recorded with every run")
        )
    finally:
        sh(["ip", "netns", "del", ns])
    return checks


def run_doctor() -> list[Check]:
    checks: list[Check] = []
    root = os.geteuid() == 0
    checks.append(Check("system", "root", root, "uid 0" if root else f"uid {os.geteuid()}",
                        "namespaces, veth and nftables need root"))  # fmt: skip
    for tool, what in TOOLS.items():
        path = shutil.which(tool)
        checks.append(Check("tools", tool, path is not None, path or "missing", what))
    if root and shutil.which("ip"):
        checks += _probe_kernel()
        checks += tunnel_checks()
    for name, cls in DRIVERS.items():
        a = cls.availability()
        detail = a.version if a.ok else f"{a.state}: {a.reason}"
        checks.append(Check("vpns", name, a.ok, detail or "", cls.summary))
    from tunnelbench.vpns.impossible import IMPOSSIBLE

    for name, imp in IMPOSSIBLE.items():
        checks.append(Check("vpns", name, False, f"impossible here: {imp.reason}", imp.summary))
    for name, wl in WORKLOADS.items():
        missing = [t for t in wl.tools if shutil.which(t) is None]
        checks.append(Check("workloads", name, not missing,
                            "ready" if not missing else f"missing {', '.join(missing)}", wl.summary))  # fmt: skip
    return checks
