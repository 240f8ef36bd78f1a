"""The one list of the lab's own tools (not any VPN's): each tool, the Debian package that provides it, and
who needs it. The runner's preflight, `doctor`, the SSH lab's check and `install --inventory` all derive
their lists from TOOLS."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    name: str
    package: str  # the Debian package that provides it
    doctor: str = ""  # what `doctor` says it is for ("": doctor does not list it)
    lab: bool = False  # the namespace lab refuses to run without it (runner preflight, lab tests)
    host: str = ""  # on every SSH host: "need" (checked and installed), "install" (installed only)
    router: bool = False  # installed on the SSH router host on top


TOOLS: tuple[Tool, ...] = (
    Tool(
        "ip", "iproute2", "iproute2: namespaces, veth, routes (required)", lab=True, host="need", router=True
    ),
    Tool("nft", "nftables", "nftables: the router's guard table (required)", lab=True, router=True),
    Tool("iptables", "iptables", "iptables: NFQUEUE target for the native impairment engine", router=True),
    Tool("tc", "iproute2", "traffic control: rate limiting (TBF/HTB), netem where the kernel has it"),
    Tool("iperf3", "iperf3", "TCP/UDP throughput workloads (required)", lab=True, host="need"),
    Tool("ping", "iputils-ping", "latency and readiness probes (required)", lab=True, host="need"),
    Tool("fping", "fping", "mesh readiness checks (required)", lab=True, host="need"),
    Tool("ss", "iproute2", "socket state, iperf3 server readiness (required)", lab=True, host="need"),
    Tool("ethtool", "ethtool", "offload settings recorded with each run"),
    Tool("sysctl", "procps", lab=True, host="need"),
    Tool("taskset", "util-linux", lab=True),
    Tool("python3", "python3-minimal", host="install"),
)

# the namespace lab's tools, in order
LAB_TOOLS: tuple[str, ...] = tuple(t.name for t in TOOLS if t.lab)
# checked on every SSH host before a run
HOST_TOOLS: tuple[str, ...] = tuple(t.name for t in TOOLS if t.host == "need")
# what `doctor` lists, with what each is for
DOCTOR_TOOLS: dict[str, str] = {t.name: t.doctor for t in TOOLS if t.doctor}


def packages(tools: tuple[Tool, ...]) -> tuple[str, ...]:
    """The Debian packages that provide `tools`, each once, in order."""
    return tuple(dict.fromkeys(t.package for t in tools))


# installed on every SSH host, and on the router host on top
HOST_PACKAGES: tuple[str, ...] = packages(tuple(t for t in TOOLS if t.host))
ROUTER_PACKAGES: tuple[str, ...] = packages(tuple(t for t in TOOLS if t.router))
