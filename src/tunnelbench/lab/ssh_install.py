"""`tunnelbench install --inventory F`: the pinned VPNs and the lab's tools on every inventory host.

Debian packages are installed with apt-get on the host (an `apt-get update` only if the first try fails).
Registry builds (Go modules, Rust crates) are never built on the targets: the binaries of the local cache
(`tunnelbench install NAME` fills it) are copied to the host's bin dir (`tunnelbench_bin_dir`, default
/usr/local/bin) when the host's architecture is this machine's; a binary already on the host's PATH is
left alone. The bin dir comes first on PATH for every command tunnelbench runs there, so drivers find the
copies by their bare names. Installs are deliberate and permanent (not in any run journal)."""

from __future__ import annotations

import platform
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from tunnelbench.lab.host import CommandError
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.ssh import SshError, SshHost
from tunnelbench.vpns.install import Apt, Source

# what every host needs for the lab's workloads and checks, and what the router host needs on top
TOOLS_APT = Apt(("iproute2", "iputils-ping", "fping", "iperf3", "procps", "python3-minimal"))
ROUTER_APT = Apt(("iproute2", "nftables", "iptables"))


@dataclass
class RemoteResult:
    host: str
    what: str  # vpn name or "tools"
    source: str
    status: str  # present | installed | copied | failed
    seconds: float
    detail: str = ""


def _apt(h: SshHost, s: Apt) -> tuple[str, str]:
    q = " ".join(shlex.quote(p) for p in s.packages)
    probe = f"for p in {q}; do dpkg-query -W -f='${{Status}}\\n' \"$p\" 2>/dev/null | grep -q 'ok installed' || echo \"$p\"; done"
    r = h.run(["sh", "-c", probe], check=False)
    need = r.stdout.split()
    if r.returncode != 0:
        return "failed", "dpkg-query failed (not a Debian host?)"
    if not need:
        return "present", "debian"
    if h.which(["apt-get"])["apt-get"] is None:
        return "failed", f"apt-get not found; install {' '.join(need)} by hand"
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    inst = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *need]
    r = h.run(inst, check=False, env=env, timeout=900)
    if r.returncode != 0:  # stale package lists on a fresh machine
        h.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
        r = h.run(inst, check=False, env=env, timeout=900)
    if r.returncode != 0:
        return "failed", (r.stdout + r.stderr).strip()[-300:]
    return "installed", "apt " + " ".join(need)


def _copy(h: SshHost, s: Source, arch: str) -> tuple[str, str]:
    where = h.which(list(s.binaries))
    missing = [b for b, p in where.items() if p is None]
    if not missing:
        return "present", ", ".join(f"{p}" for p in where.values())
    if arch != platform.machine():
        return "failed", (f"{h.name} is {arch}, this machine {platform.machine()}: the local build cannot be "
                          f"copied; install {', '.join(missing)} there by hand")  # fmt: skip
    if not s.cached():
        return "failed", f"not in the local cache: run `tunnelbench install` for it here first ({s.label})"
    bin_dir = Path(h.bin_dir)
    for b in missing:
        local = s.bin_dir() / b  # type: ignore[operator]
        h.write_file(bin_dir / b, local.read_bytes(), 0o755)
    return "copied", f"{', '.join(missing)} -> {bin_dir}"


def install_host(inv: InvHost, vpns: list[str], router: bool, tools: bool = True) -> list[RemoteResult]:
    from tunnelbench.vpns import DRIVERS

    h = SshHost(inv.name, inv, None, None)
    out: list[RemoteResult] = []
    try:
        h.connect()
        arch = h.run(["uname", "-m"]).stdout.strip()
        todo: list[tuple[str, Source]] = []
        if tools:
            todo.append(("tools", TOOLS_APT))
            if router:
                todo.append(("router tools", ROUTER_APT))
        for n in vpns:
            todo += [(n, s) for s in DRIVERS[n].installs]
        for what, s in todo:
            t0 = time.monotonic()
            try:
                status, detail = _apt(h, s) if isinstance(s, Apt) else _copy(h, s, arch)
            except (CommandError, OSError, TimeoutError) as e:
                status, detail = "failed", str(e)[-300:]
            out.append(RemoteResult(inv.name, what, s.label, status, time.monotonic() - t0, detail))
    except SshError as e:
        out.append(RemoteResult(inv.name, "ssh", "", "failed", 0.0, str(e)))
    finally:
        h.close()
    return out


def install_inventory(inventory: Inventory, vpns: list[str]) -> list[RemoteResult]:
    """Every host at once (hosts are independent; apt on each is the slow part)."""
    from concurrent.futures import ThreadPoolExecutor

    hosts = [inventory.hosts[n] for n in inventory.order]
    router = inventory.router()
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        futs = [pool.submit(install_host, h, [] if "router" in h.roles and "peer" not in h.roles else vpns,
                            router is not None and h.name == router.name) for h in hosts]  # fmt: skip
        return [r for f in futs for r in f.result()]
