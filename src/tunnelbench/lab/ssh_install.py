"""Installing on SSH hosts: the transport of `tunnelbench install --inventory F` (vpns/remote_install.py decides
what goes on which host).

Debian packages are installed with apt-get on the host (an `apt-get update` only if the first try fails).
Registry builds (Go modules, Rust crates) are never built on the targets: the binaries of the local cache are
copied to the host's bin dir (`tunnelbench_bin_dir`, default /usr/local/bin) when the host's architecture is
this machine's, unless the bin dir already holds the same build (SHA-256); a different one is replaced. The bin dir comes first on PATH for every
command tunnelbench runs there, so drivers find the copies by their bare names. Installs are deliberate and
permanent (not in any run journal)."""

from __future__ import annotations

import hashlib
import platform
import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tunnelbench.lab.host import CommandError
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.ssh_host import SshHost
from tunnelbench.lab.ssh_transport import SshError
from tunnelbench.lab.tools import HOST_PACKAGES, ROUTER_PACKAGES


@dataclass(frozen=True)
class DebianPackages:
    """Debian packages the lab itself needs on a host (its tools, not any VPN's)."""

    packages: tuple[str, ...]

    @property
    def label(self) -> str:
        return "apt " + " ".join(self.packages)


# what every host needs for the lab's workloads and checks, and what the router host needs on top
TOOLS_APT = DebianPackages(HOST_PACKAGES)  # from the one list, lab/tools.py
ROUTER_APT = DebianPackages(ROUTER_PACKAGES)


@dataclass
class RemoteResult:
    host: str
    what: str  # vpn name or "tools"
    source: str
    status: str  # present | installed | copied | failed
    seconds: float
    detail: str = ""


# one thing to install on a host: (what it is for, where it comes from, do(host, host's arch) -> (status, detail))
Step = tuple[str, str, Callable[[SshHost, str], tuple[str, str]]]


def apt_install(h: SshHost, packages: Sequence[str]) -> tuple[str, str]:
    """The Debian packages the host lacks, with apt-get; ("present" | "installed" | "failed", detail)."""
    q = " ".join(shlex.quote(p) for p in packages)
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


def copy_binaries(
    h: SshHost, binaries: Sequence[str], local_dir: Path | None, label: str, arch: str
) -> tuple[str, str]:
    """Put the local build's binaries (`local_dir`; None: not built here) in the host's bin dir, which comes
    first on PATH for every command tunnelbench runs there: a copy whose SHA-256 equals the local build's is
    left alone, a missing or different one (a stale version) is replaced. Without a local build for the host's
    architecture, a binary the host already has on its PATH is used as it is. ("present" | "copied" |
    "failed", detail)."""
    bin_dir = Path(h.bin_dir)
    if local_dir is None or arch != platform.machine():
        where = h.which(list(binaries))
        missing = [b for b, p in where.items() if p is None]
        if not missing:
            return "present", ", ".join(f"{p}" for p in where.values()) + " (the host's own: not compared)"
        if local_dir is None:
            return "failed", f"not in the local cache: run `tunnelbench install` for it here first ({label})"
        return "failed", (
            f"{h.name} is {arch}, this machine {platform.machine()}: the local build cannot be "
            f"copied; install {', '.join(missing)} there by hand"
        )
    want = {b: hashlib.sha256((local_dir / b).read_bytes()).hexdigest() for b in binaries}
    paths = " ".join(shlex.quote(str(bin_dir / b)) for b in binaries)
    r = h.run(["sh", "-c", f"sha256sum {paths} 2>/dev/null; true"], check=False)
    have = {
        Path(line.split(None, 1)[1].strip()).name: line.split()[0]
        for line in r.stdout.splitlines()
        if " " in line
    }
    stale = [b for b in binaries if b in have and have[b] != want[b]]
    todo = [b for b in binaries if have.get(b) != want[b]]
    if not todo:
        return "present", f"{', '.join(str(bin_dir / b) for b in binaries)} (the pinned build: SHA-256 equal)"
    for b in todo:
        h.write_file(bin_dir / b, (local_dir / b).read_bytes(), 0o755)
    return "copied", f"{', '.join(todo)} -> {bin_dir}" + (
        f" (replaced a different build: {', '.join(stale)})" if stale else ""
    )


def install_host(inv: InvHost, steps: list[Step]) -> list[RemoteResult]:
    """Run the steps on one host over one SSH connection, each timed; a failed step does not stop the next."""
    h = SshHost(inv.name, inv, None, None)
    out: list[RemoteResult] = []
    try:
        h.connect()
        arch = h.run(["uname", "-m"]).stdout.strip()
        for what, label, do in steps:
            t0 = time.monotonic()
            try:
                status, detail = do(h, arch)
            except (CommandError, OSError, TimeoutError) as e:
                status, detail = "failed", str(e)[-300:]
            out.append(RemoteResult(inv.name, what, label, status, time.monotonic() - t0, detail))
    except SshError as e:
        out.append(RemoteResult(inv.name, "ssh", "", "failed", 0.0, str(e)))
    finally:
        h.close()
    return out


def install_hosts(inventory: Inventory, steps_for: Callable[[InvHost], list[Step]]) -> list[RemoteResult]:
    """Every host at once (hosts are independent; apt on each is the slow part), results in inventory order."""
    hosts = [inventory.hosts[n] for n in inventory.order]
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        futs = [pool.submit(install_host, h, steps_for(h)) for h in hosts]
        return [r for f in futs for r in f.result()]
