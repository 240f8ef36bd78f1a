"""Provisioning SSH hosts through Ansible: the transport of `tunnelbench install --inventory F`
(vpns/remote_install.py decides what goes on which host).

One play (lab/install.yml) runs by ansible-runner over the inventory's own file, so Ansible reaches each host
exactly as it does for the user's other playbooks, every host at once. Debian packages are installed with
apt-get when missing (an `apt-get update` only if the first try fails). Registry builds (Go modules, Rust
crates) are never built on the targets: the binaries of the local cache are copied to the host's bin dir
(`tunnelbench_bin_dir`, default /usr/local/bin) when the host has this machine's architecture, unless the
bin dir already holds the same build (Ansible's copy compares checksums); a different one is replaced. The bin
dir comes first on PATH for every command tunnelbench runs there. Installs are deliberate and permanent (not
in any run journal); a second run changes nothing."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import secrets
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunnelbench.lab.ansible_inventory import ansible_env
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.kernel import FEATURES, parse, probe_script
from tunnelbench.lab.ssh_host import DEFAULT_BIN_DIR
from tunnelbench.lab.tags import TAG_PREFIX
from tunnelbench.lab.tools import HOST_PACKAGES, ROUTER_PACKAGES

PLAYBOOK = Path(__file__).with_name("install.yml")
# the play's task names, as its results are read (tests/lab/test_provision_units.py checks each against install.yml)
T_ARCH = "architecture and the builds already there"
T_APT = "debian packages"
T_COPY = "registry builds"
T_OWN = "the host's own builds"
T_KERNEL = "kernel features"
T_CLOCK = "clock"


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


@dataclass(frozen=True)
class AptStep:
    what: str  # vpn name or "tools"
    label: str
    packages: tuple[str, ...]
    # per package, the version this machine has installed (the one its namespace lab measures), "" if none:
    # a host that lacks the package gets that version when its sources have it
    pins: tuple[str, ...] = ()

    def pin(self, package: str) -> str:
        return dict(zip(self.packages, self.pins, strict=False)).get(package, "")


@dataclass(frozen=True)
class CopyStep:
    what: str
    label: str
    binaries: tuple[str, ...]
    local_dir: Path | None  # the local cache's build; None: not built here


@dataclass(frozen=True)
class KernelStep:
    what: str
    label: str
    features: tuple[str, ...]  # lab/kernel.py's FEATURES names


Step = AptStep | CopyStep | KernelStep


@dataclass
class RemoteResult:
    host: str
    what: str  # vpn name or "tools"
    source: str
    # present | installed | copied | loaded | failed; warnings: unsynced (a clock), differs (a Debian package at
    # another version than this machine's, left as it is)
    status: str
    detail: str = ""


@dataclass
class _Item:
    """One step on one host, filled from the play's events."""

    host: str
    step: Step
    changed: list[str] = field(default_factory=list)  # what changed: packages, or copied binaries
    replaced: list[str] = field(default_factory=list)  # binaries whose earlier copy differed
    failed: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)  # the host's own binaries (another architecture)
    # Debian package -> the host's version after the play
    versions: dict[str, str] = field(default_factory=dict)
    seen: bool = False  # Ansible reported on this step: a step it never reached is not "present"

    def result(self, bin_dir: str, host_error: str | None) -> RemoteResult:
        s = self.step
        status, detail = "present", "debian"
        if not self.seen:
            status, detail = "failed", host_error or "Ansible reported nothing for this step"
        elif self.failed:
            status, detail = "failed", "; ".join(self.failed)[-300:]
        elif isinstance(s, AptStep):
            status, detail = self._apt(s)
        elif isinstance(s, KernelStep):
            status = "loaded" if self.changed else "present"
            detail = (
                ", ".join(s.features)
                + " work"
                + (f" (loaded {', '.join(self.changed)})" if self.changed else "")
            )
        elif self.found:
            detail = ", ".join(self.found) + " (the host's own: not compared)"
        elif self.changed:
            status = "copied"
            detail = f"{', '.join(self.changed)} -> {bin_dir}" + (
                f" (replaced a different build: {', '.join(self.replaced)})" if self.replaced else ""
            )
        else:
            detail = f"{', '.join(f'{bin_dir}/{b}' for b in s.binaries)} (the pinned build: checksum equal)"
        return RemoteResult(self.host, s.what, s.label, status, detail)

    def _apt(self, s: AptStep) -> tuple[str, str]:
        """Installed (with the versions), or present; a package at another version than this machine's is
        said, and a present one is left as it is (a system package other software on the host may need)."""
        other = [
            f"{p} {self.versions[p]} here, {s.pin(p)} on this machine"
            for p in s.packages
            if s.pin(p) and self.versions.get(p, s.pin(p)) != s.pin(p)
        ]
        if self.changed:
            detail = "apt " + " ".join(
                f"{p}={self.versions[p]}" if p in self.versions else p for p in self.changed
            )
            return "installed", detail + (
                f" (not this machine's version: {'; '.join(other)})" if other else ""
            )
        if other:
            return "differs", "; ".join(other) + ": left as it is (`apt-get install PACKAGE=VERSION` pins it)"
        pinned = all(s.pin(p) for p in s.packages)
        return "present", "debian" + (", this machine's versions" if pinned and self.versions else "")


def bin_dir(h: InvHost) -> str:
    return str(h.vars.get("tunnelbench_bin_dir") or DEFAULT_BIN_DIR)


def plan_of(h: InvHost, steps: Sequence[Step]) -> dict[str, Any]:
    """The play's tb_plan entry for one host (a build's i is the index of its step)."""
    plan: dict[str, Any] = {"packages": [], "builds": [], "own": [], "features": [], "modules": []}
    where = bin_dir(h)
    for i, s in enumerate(steps):
        if isinstance(s, AptStep):
            have = {e.split("=", 1)[0] for e in plan["packages"]}
            plan["packages"] += [f"{p}={s.pin(p)}" if s.pin(p) else p for p in s.packages if p not in have]
            continue
        if isinstance(s, KernelStep):
            plan["features"] += [f for f in s.features if f not in plan["features"]]
            plan["modules"] += [FEATURES[f][1] for f in s.features if FEATURES[f][1] not in plan["modules"]]
            continue
        for b in s.binaries:
            item = {"i": i, "bin": b, "bin_dir": where}
            if s.local_dir is None:
                plan["own"].append(item)
            else:
                src = s.local_dir / b
                plan["builds"].append(
                    {**item, "src": str(src), "dest": f"{where}/{b}", "sha256": _sha256(src)}
                )
    return plan


@functools.cache
def _sha256(path: Path) -> str:
    """A local build's checksum, read once per process (not once per host: a Go build is tens of MB)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _first_line(res: dict[str, Any]) -> str:
    """What a failed task said: a module that did not run says it on its stdout (e.g. no Python there)."""
    for key in ("stderr", "module_stdout", "msg", "stdout"):
        text = str(res.get(key) or "").strip()
        if text:
            return text.splitlines()[0].strip()
    return "failed"


def _own_missing(it: _Item, binary: str) -> str:
    why = (
        "not in the local cache: run `tunnelbench install` for it here first"
        if isinstance(it.step, CopyStep) and it.step.local_dir is None
        else "another architecture than this machine's: install it there by hand"
    )
    return f"{binary}: not on the host's PATH ({why}; {it.step.label})"


def _read_host_task(
    kind: str, task: str, res: dict[str, Any], items: list[_Item], before: list[str], clock: list[str]
) -> None:
    """A task's result on one host (not a loop item): the packages step and the host's own builds."""
    if task == T_APT:
        apt = [it for it in items if isinstance(it.step, AptStep)]
        out = str(res.get("stdout", ""))
        installed = next((ln.split()[1:] for ln in out.splitlines() if ln.startswith("TB-INSTALLED")), [])
        versions = {
            f[1]: f[2] for f in (ln.split() for ln in out.splitlines()) if len(f) == 4 and f[0] == "TB-PKG"
        }
        for it in apt:
            it.seen = True
            assert isinstance(it.step, AptStep)
            if kind == "runner_on_failed":
                it.failed.append(_first_line(res))
            else:
                it.changed += [p for p in it.step.packages if p in installed]
                it.versions.update({p: versions[p] for p in it.step.packages if versions.get(p, "-") != "-"})
    elif task == T_KERNEL:
        out = str(res.get("stdout", ""))
        loaded = [
            f[1] for f in (line.split() for line in out.splitlines()) if len(f) == 2 and f[0] == "TB-LOADED"
        ]
        verdict = parse(out) if kind == "runner_on_ok" else {}
        for it in items:
            if isinstance(it.step, KernelStep):
                it.seen = True
                it.changed += [FEATURES[f][1] for f in it.step.features if FEATURES[f][1] in loaded]
                it.failed += [
                    f"{FEATURES[f][0]} (module {FEATURES[f][1]}): {verdict.get(f, _first_line(res))}"
                    for f in it.step.features
                    if verdict.get(f, "failed") is not None
                ]
    elif task == T_OWN and kind == "runner_on_ok":
        for line in str(res.get("stdout", "")).splitlines():
            f = line.split()
            if len(f) == 4 and f[0] == "TB":
                it = items[int(f[1])]
                it.seen = True
                if f[3] == "-":
                    it.failed.append(_own_missing(it, f[2]))
                else:
                    it.found.append(f[3])
    elif task == T_CLOCK:
        clock.append(str(res.get("stdout", "")).strip() or _first_line(res))
    elif task == T_ARCH and kind == "runner_on_ok":
        before += [line.split()[-1] for line in str(res.get("stdout", "")).splitlines()[1:] if " " in line]


def _read_events(
    events: Iterable[dict[str, Any]],
    items: dict[str, list[_Item]],
    unreachable: dict[str, str],
    seconds: dict[str, float],
    host_error: dict[str, str],
    clocks: dict[str, list[str]] | None = None,
) -> None:
    before: dict[str, list[str]] = {h: [] for h in items}  # builds' paths that existed before the copies
    clocks = clocks if clocks is not None else {}
    for ev in events:
        kind, data = ev.get("event", ""), ev.get("event_data") or {}
        host, res, task = str(data.get("host", "")), data.get("res") or {}, str(data.get("task", ""))
        if host not in items:
            continue
        if kind == "runner_on_unreachable":
            unreachable[host] = _first_line(res)
            continue
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_skipped"):
            seconds[host] += float(data.get("duration") or 0)  # a task's time on the host, its items in it
            if "results" not in res:  # a loop's summary repeats its items
                _read_host_task(kind, task, res, items[host], before[host], clocks.setdefault(host, []))
            if kind == "runner_on_failed" and task == T_ARCH:
                host_error.setdefault(host, f"{task}: {_first_line(res)}")  # the host stops there
            continue
        item = res.get("item")
        if task != T_COPY or not isinstance(item, dict):
            continue
        it = items[host][int(item["i"])]
        it.seen = True
        if kind == "runner_item_on_failed":
            it.failed.append(f"{item['bin']}: {_first_line(res)}")
        elif kind == "runner_item_on_ok" and res.get("changed"):
            it.changed.append(str(item["bin"]))
            if item["dest"] in before[host]:
                it.replaced.append(str(item["bin"]))


def install_hosts(
    inventory: Inventory, steps_for: Callable[[InvHost], list[Step]], insecure: bool = False
) -> tuple[list[RemoteResult], dict[str, tuple[int, float]]]:
    """Every host at once through one Ansible play; results in inventory order (one per host and thing
    installed, a host Ansible could not reach as one failed "ssh" row), and per host Ansible's count of
    changes and the seconds its tasks took there."""
    import ansible_runner

    assert inventory.path is not None, "an inventory read from a file"
    steps = {n: steps_for(inventory.hosts[n]) for n in inventory.order}
    items = {n: [_Item(n, s) for s in steps[n]] for n in inventory.order}
    plan = {n: plan_of(inventory.hosts[n], steps[n]) for n in inventory.order}
    for n in inventory.order:  # a scratch namespace per host (hosts may share a kernel), with the run prefix:
        plan[n]["probe"] = probe_script(f"{TAG_PREFIX}kp{secrets.token_hex(3)}")  # `clean` finds a killed one
    env = {"ANSIBLE_HOST_KEY_CHECKING": "False"} if insecure else {}
    # ansible-playbook from this Python's environment (a venv's bin may not be on PATH)
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    with tempfile.TemporaryDirectory(prefix="tb-ansible-") as private:
        run = ansible_runner.run(
            private_data_dir=private,
            playbook=str(PLAYBOOK),
            inventory=str(inventory.path.resolve()),
            extravars={
                "tb_plan": plan,
                "tb_local_arch": platform.machine(),
            },
            # pipelining: a module runs over the open connection, no temp file copied first (fewer round trips)
            envvars={
                **env,
                **ansible_env(),  # the INI and YAML inventory plugins only: an inventory script is not run
                "ANSIBLE_RETRY_FILES_ENABLED": "False",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_PIPELINING": "True",
            },
            forks=min(16, max(5, len(inventory.order))),
            quiet=True,
            suppress_env_files=True,
        )
        unreachable: dict[str, str] = {}
        seconds = dict.fromkeys(inventory.order, 0.0)
        host_error: dict[str, str] = {}
        clocks: dict[str, list[str]] = {}
        _read_events(run.events, items, unreachable, seconds, host_error, clocks)
        stats = run.stats or {}
        if run.rc not in (0, 2, 4) and not any(seconds.values()) and not unreachable:
            why = (run.stdout.read() if run.stdout else "").strip().splitlines()[-3:]
            raise RuntimeError(f"ansible-playbook failed (rc {run.rc}): {' / '.join(why)}")
    out: list[RemoteResult] = []
    for n in inventory.order:
        if n in unreachable:
            out.append(RemoteResult(n, "ssh", "", "failed", f"unreachable: {unreachable[n]}"))
            continue
        out += [it.result(bin_dir(inventory.hosts[n]), host_error.get(n)) for it in items[n]]
        if clocks.get(n):
            out.append(clock_row(n, clocks[n][0]))
    changed = {n: int((stats.get("changed") or {}).get(n, 0)) for n in inventory.order}
    return out, {n: (changed[n], seconds[n]) for n in inventory.order}


def clock_row(host: str, said: str) -> RemoteResult:
    """The clock task's answer (timedatectl's NTPSynchronized, chrony's leap status): a warning when it is
    known to be unsynchronised."""
    synced = said in ("yes", "chrony Normal")
    known = said not in ("unknown", "")
    status = "present" if synced or not known else "unsynced"
    detail = f"{said}" + ("" if synced else ": one-way delays and timestamps across hosts cannot be compared")
    return RemoteResult(
        host, "clock", "time sync", status, detail if known else "unknown (no timedatectl or chronyc)"
    )
