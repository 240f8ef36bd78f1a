"""`tunnelbench doctor`: what this machine (or, with `--inventory`, each SSH host) can and cannot do, and what
that means for results.

Kernel features are probed for real inside a scratch namespace (deleted afterwards), not guessed. The VPN and
workload rows come from one function, `vpn_and_workload_checks`, which `tunnelbench list` shows too."""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.lab.host import host_arch
from tunnelbench.lab.tags import TAG_PREFIX
from tunnelbench.lab.tools import DOCTOR_TOOLS

if TYPE_CHECKING:
    from tunnelbench.lab.inventory import Inventory, InvHost
    from tunnelbench.lab.kernel import Runner
    from tunnelbench.lab.ssh_host import SshHost


@dataclass
class Check:
    group: str
    name: str
    ok: bool
    detail: str
    meaning: str = ""
    state: str = ""  # a VPN's: available | installable | impossible here (`list` colours it)


TOOLS = DOCTOR_TOOLS  # the lab's tools and what each is for: lab/tools.py


class _Ran(Protocol):  # a subprocess.CompletedProcess, or an SSH host's lab.host.Result
    returncode: int
    stdout: str
    stderr: str


class _Sh(Protocol):
    def __call__(self, argv: list[str], input: str | None = None) -> _Ran: ...


def _sh(argv: list[str], input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, input=input)


def tunnel_checks(where: str = "local", run: Runner | None = None) -> list[Check]:
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
        why = have[f]
        out.append(
            Check(
                "kernel tunnels",
                f"{what} ({module})",
                why is None,
                "available" if why is None else why,
                need if why is not None else "",
            )
        )
    return out


def _probe_kernel(sh: _Sh = _sh) -> list[Check]:
    """`sh(argv, input=None)` runs a command here or, for `doctor --inventory`, on an SSH host."""
    ns = f"{TAG_PREFIX}doc{secrets.token_hex(2)}"
    checks: list[Check] = []
    if sh(["ip", "netns", "add", ns]).returncode != 0:
        return [
            Check("kernel", "network namespaces", False, "ip netns add failed", "the embedded lab cannot run")
        ]
    try:

        def run(*argv: str, input: str | None = None) -> _Ran:
            return sh(["ip", "netns", "exec", ns, *argv], input=input)

        checks.append(Check("kernel", "network namespaces", True, "ip netns add works"))
        run("ip", "link", "set", "lo", "up")
        r = run("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        checks.append(
            Check("kernel", "veth", r.returncode == 0, r.stderr.strip() or "ok", "hosts cannot be wired")
        )
        r = run("ip", "tuntap", "add", "t0", "mode", "tun")
        checks.append(
            Check(
                "kernel",
                "TUN/TAP",
                r.returncode == 0,
                r.stderr.strip() or "/dev/net/tun usable",
                "userspace VPNs cannot create interfaces",
            )
        )
        r = run("tc", "qdisc", "add", "dev", "v0", "root", "netem", "delay", "1ms")
        checks.append(
            Check(
                "kernel",
                "tc netem",
                r.returncode == 0,
                r.stderr.strip() or "available",
                "delay/jitter/reorder need the native engine (native/impaird over NFQUEUE)",
            )
        )
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
        checks.append(
            Check(
                "kernel",
                "tc tbf",
                r.returncode == 0,
                r.stderr.strip() or "available",
                "rate limits cannot be applied",
            )
        )
        r = run("ip", "link", "add", "wg0", "type", "wireguard")
        checks.append(
            Check(
                "kernel",
                "kernel WireGuard",
                r.returncode == 0,
                r.stderr.strip() or "module present",
                "only userspace WireGuard (wireguard-go, boringtun) can be measured",
            )
        )
        r = run(
            "nft",
            "-f",
            "-",
            input="table inet t {\n chain c {\n type filter hook forward priority 0;\n queue num 0\n }\n}\n",
        )
        checks.append(
            Check(
                "kernel",
                "nftables queue",
                r.returncode == 0,
                r.stderr.strip().splitlines()[0][:120] if r.returncode else "available",
                "packets are queued with the iptables NFQUEUE target instead",
            )
        )
        r = run("iptables", "-t", "mangle", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0")
        checks.append(
            Check(
                "kernel",
                "iptables NFQUEUE",
                r.returncode == 0,
                r.stderr.strip()[:120] or "available",
                "the native impairment engine cannot receive packets",
            )
        )
        r = run(
            "ip", "link", "add", "vx0", "type", "vxlan", "id", "1", "dstport", "4789", "local", "127.0.0.1"
        )
        checks.append(
            Check(
                "kernel",
                "VXLAN",
                r.returncode == 0,
                r.stderr.strip() or "available",
                "the unencrypted overlay baseline cannot run",
            )
        )
        cc = run("sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout.strip()
        checks.append(
            Check("kernel", "TCP congestion control", True, cc or "unknown", "recorded with every run")
        )
    finally:
        sh(["ip", "netns", "del", ns])
    return checks


def component_tools() -> set[str]:
    """Every binary a VPN driver runs and every tool a workload needs."""
    names: set[str] = set()
    for d in DRIVERS.values():
        names.update(d.binaries)
    for wl in WORKLOADS.values():
        names.update(wl.tools)
    return names


def vpn_and_workload_checks(
    where: dict[str, str | None] | None = None, host: SshHost | None = None
) -> list[Check]:
    """One row per VPN and per workload, as `doctor`, `doctor --inventory` and `list` show them.

    On this machine (no arguments): each VPN's availability (binaries, version, kernel features) and the VPNs
    that have no driver (vpns/impossible.py); each workload's tools on PATH. On an SSH host: `where` is the
    host's `command -v` answer for at least `component_tools()` (one round trip for all of them) and `host`
    the host itself, for the kernel probes of the drivers that need kernel features there."""
    checks: list[Check] = []
    for name, cls in DRIVERS.items():
        if where is None:
            a = cls.availability()
            detail = a.version if a.ok else f"{a.state}: {a.reason}"
            checks.append(Check("vpns", name, a.ok, detail or "", cls.summary, a.state))
            continue
        missing = [  # not on its PATH: the host may still keep it off PATH (strongSwan's charon)
            b
            for b in cls.binaries
            if where.get(b) is None and (host is None or host.binary(b, cls.installs) == b)
        ]
        why = cls.impossible_on([host]) if host is not None else None  # its kernel's own answer
        detail = (
            f"impossible here: {why}"
            if why
            else "binaries present"
            if not missing
            else f"missing {', '.join(missing)} (`tunnelbench install --inventory F {name}`)"
        )
        state = "impossible here" if why else "available" if not missing else "installable"
        checks.append(Check("vpns", name, not missing and not why, detail, cls.summary, state))
    if where is None:
        from tunnelbench.vpns.impossible import IMPOSSIBLE

        for name, imp in IMPOSSIBLE.items():
            checks.append(
                Check("vpns", name, False, f"impossible here: {imp.reason}", imp.summary, "impossible here")
            )
    found = where if where is not None else {t: shutil.which(t) for w in WORKLOADS.values() for t in w.tools}
    copied = _copied_at_run_time(found, host) if host is not None else set()
    for name, wl in WORKLOADS.items():
        missing = [t for t in wl.tools if found.get(t) is None and t not in copied]
        here = [t for t in wl.tools if t in copied and found.get(t) is None]
        ready = "ready" + (
            f" ({', '.join(here)}: this machine's build, copied there by the run)" if here else ""
        )
        checks.append(
            Check(
                "workloads",
                name,
                not missing,
                ready if not missing else f"missing {', '.join(missing)}",
                wl.summary,
            )
        )
    return checks


def _copied_at_run_time(found: dict[str, str | None], host: SshHost) -> set[str]:
    """The built tools (hey, quicperf) a host lacks that a run copies there from this machine's build
    (lab.host.remote_build): when this machine has the build and the host its architecture."""
    from tunnelbench.core.results import WorkloadError
    from tunnelbench.instruments.common import tool

    lacking = [t for t in ("hey", "quicperf") if t in found and found[t] is None]
    if not lacking or host_arch(host) != platform.machine():
        return set()
    out: set[str] = set()
    for t in lacking:
        try:
            tool(t)
        except WorkloadError:
            continue
        out.add(t)
    return out


def run_doctor() -> list[Check]:
    checks: list[Check] = []
    root = os.geteuid() == 0
    checks.append(
        Check(
            "system",
            "root",
            root,
            "uid 0" if root else f"uid {os.geteuid()}",
            "namespaces, veth and nftables need root",
        )
    )
    for tool, what in TOOLS.items():
        path = shutil.which(tool)
        checks.append(Check("tools", tool, path is not None, path or "missing", what))
    checks.append(machine_load())
    from tunnelbench.lab.kernel import probes_held

    held = probes_held()
    if root and shutil.which("ip") and held:  # the probe makes a namespace: never beside a running lab
        checks.append(Check("kernel", "probe", True, f"not probed now: {held}", "run doctor again later"))
        checks += tunnel_checks()  # this boot's last probe record, or "not probed"
    elif root and shutil.which("ip"):
        checks += _probe_kernel()
        checks += tunnel_checks()
    return checks + vpn_and_workload_checks() + kubernetes_checks(root)


def kubernetes_checks(probe: bool = True) -> list[Check]:
    """The opt-in Kubernetes layer (kube/): its build, and what this kernel has and lacks for it."""
    from tunnelbench.kube.checks import build_check, kernel_checks
    from tunnelbench.lab import kernel

    rows = [build_check()]
    if probe and shutil.which("ip"):
        rows += kernel_checks(kernel.missing(("vxlan",)))
    return [Check("kubernetes", c.name, c.ok, c.detail, c.meaning) for c in rows]


def machine_load(seconds: float = 1.0) -> Check:
    """What else takes this machine's CPUs now (lab/interference.py), against the runs' default line: a busy
    machine is said before a run, not found out in its numbers."""
    from tunnelbench.lab.interference import DISTURBED_PCT, quick_reading

    r = quick_reading(seconds)
    return Check(
        "system",
        "machine load",
        not r.disturbed(DISTURBED_PCT),
        f"{r.text('this machine’s')} over {seconds:.0f} s",
        f"cases measured while {DISTURBED_PCT:.0f}% or more is taken are measured again or labelled disturbed",
    )


# -- doctor --inventory: the same checks on each SSH host, plus clock, CPU and NICs --------------------------
def doctor_host(inv: InvHost) -> list[Check]:
    """The local doctor's checks, run on one inventory host over SSH, plus clock, CPU and NICs."""
    from tunnelbench.lab.host import CommandError
    from tunnelbench.lab.ssh_host import SshHost
    from tunnelbench.lab.ssh_transport import SshError

    h = SshHost(inv.name, inv, None, None)
    checks: list[Check] = []
    try:
        h.connect()
    except SshError as e:
        return [Check("ssh", "reachable", False, str(e), "nothing else can be checked")]
    try:
        checks.append(Check("ssh", "reachable", True, inv.describe()))
        uid = h.run(["id", "-u"]).stdout.strip()
        checks.append(
            Check(
                "system", "root", uid == "0", f"uid {uid}", "namespaces, TUN devices and nftables need root"
            )
        )
        where = h.which(sorted({*TOOLS, "timedatectl", "chronyc", "tc", *component_tools()}))
        for tool, what in TOOLS.items():
            checks.append(Check("tools", tool, where[tool] is not None, where[tool] or "missing", what))
        checks += _probe_kernel(sh=lambda argv, input=None: h.run(argv, input=input, check=False, timeout=20))
        checks += tunnel_checks(h.name, lambda argv: h.run(argv, check=False, timeout=60).stdout)
        lsmod = h.run(["sh", "-c", "cat /proc/modules 2>/dev/null; ls /sys/module"], check=False).stdout
        checks.append(
            Check(
                "kernel",
                "wireguard module",
                "wireguard" in lsmod,
                "loaded" if "wireguard" in lsmod else "not loaded (it may still load on demand)",
                "kernel WireGuard cannot be measured",
            )
        )
        checks.append(
            Check(
                "kernel",
                "sch_netem module",
                "netem" in lsmod,
                "loaded" if "netem" in lsmod else "not loaded (the tc netem probe above is authoritative)",
            )
        )
        tun = h.run(["test", "-c", "/dev/net/tun"], check=False).returncode == 0
        checks.append(
            Check(
                "kernel",
                "/dev/net/tun",
                tun,
                "present" if tun else "missing",
                "userspace VPNs cannot create interfaces",
            )
        )
        kernel = h.run(["uname", "-srm"], check=False).stdout.strip()
        checks.append(Check("system", "kernel", True, kernel))
        checks.append(clock_check(h, where))
        cpu = h.run(
            ["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2; nproc"], check=False
        ).stdout
        lines = [x.strip() for x in cpu.splitlines() if x.strip()]
        checks.append(
            Check(
                "system",
                "CPU",
                True,
                f"{lines[0] if len(lines) > 1 else 'unknown model'} x {lines[-1] if lines else '?'}",
            )
        )
        checks.append(nic_check(h))
        checks += vpn_and_workload_checks(where, h)
    except (CommandError, SshError, TimeoutError) as e:
        checks.append(Check("ssh", "checks", False, f"interrupted: {e}"))
    finally:
        h.close()
    return checks


def clock_check(h: SshHost, where: dict[str, str | None]) -> Check:
    meaning = "one-way delays and timestamps across hosts cannot be compared"
    if where.get("timedatectl"):
        r = h.run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"], check=False)
        v = r.stdout.strip()
        if r.returncode == 0 and v in ("yes", "no"):
            return Check("system", "clock sync", v == "yes", f"timedatectl NTPSynchronized={v}", meaning)
    if where.get("chronyc"):
        r = h.run(["chronyc", "tracking"], check=False)
        if r.returncode == 0:
            status = next(
                (x.split(":", 1)[1].strip() for x in r.stdout.splitlines() if x.startswith("Leap status")),
                "?",
            )
            offset = next(
                (x.split(":", 1)[1].strip() for x in r.stdout.splitlines() if x.startswith("System time")),
                "?",
            )
            return Check("system", "clock sync", status == "Normal", f"chrony: {status}, {offset}", meaning)
    return Check("system", "clock sync", True, "unknown (no timedatectl or chronyc answer)", meaning)


def nic_check(h: SshHost) -> Check:
    r = h.run(["ip", "-j", "link"], check=False)
    try:
        links = json.loads(r.stdout)
    except json.JSONDecodeError:
        return Check("system", "NICs", False, "ip -j link failed")
    parts = []
    for link in links:
        name = link.get("ifname", "?")
        if name == "lo":
            continue
        speed = h.run(["cat", f"/sys/class/net/{name}/speed"], check=False).stdout.strip()
        speed = f"{speed} Mb/s" if speed.lstrip("-").isdigit() and not speed.startswith("-") else "speed n/a"
        parts.append(f"{name} mtu {link.get('mtu')} {link.get('operstate', '?').lower()} {speed}")
    return Check("system", "NICs", bool(parts), "; ".join(parts) or "none")


def doctor_inventory(inventory: Inventory) -> list[tuple[InvHost, list[Check]]]:
    """Every host at once (each check is a round trip; hosts are independent)."""
    hosts = [inventory.hosts[n] for n in inventory.order]
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return list(zip(hosts, pool.map(doctor_host, hosts), strict=True))
