"""The machine-wide state a cluster touches, journaled before it is changed and undone after, also by
`tunnelbench clean` after a kill (the kinds below are registered with lab.journal.register_undo when this
module is imported; cli `clean` imports it).

  kube_sysctl  the six global sysctls every kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go,
               setupKernelTunables; values in k8s.io/component-helpers node/util/sysctl): vm.overcommit_memory
               = 1, vm.panic_on_oom = 0, kernel.panic = 10, kernel.panic_on_oops = 1, kernel.keys.root_maxkeys
               = 1000000, kernel.keys.root_maxbytes = 25000000. The values before are journaled, restored
               when the cluster goes (panic_on_oops = 1 on a shared machine is not harmless).
  kube_cgroup  a node's cgroupRoot (/<tag>-hN) in every mounted hierarchy (the kubelet refuses to start unless
               it exists, and makes kubepods/... below it): undone by killing every process left in the tree
               (pods outlive a killed kubelet and containerd: the shims and their children) and removing the
               folders deepest first.

A node's daemons run in the host's network namespace joined with nsenter (`ip netns exec` mounts a fresh
/sys, which hides the cgroup mounts from runc: "no cgroup mount found in mountinfo") and in the node's private
mount namespace (kube/node.py): `NsenterHost` is that host."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunnelbench.lab.host import Host
from tunnelbench.lab.journal import register_undo
from tunnelbench.lab.journaling import HostJournaling
from tunnelbench.lab.tags import carries_tag, tag_of

KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CGROUP_FS = Path("/sys/fs/cgroup")


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def read_sysctls(keys: Sequence[str] = KUBELET_SYSCTLS) -> dict[str, str]:
    return {k: _sysctl_path(k).read_text().strip() for k in keys}


def write_sysctls(values: dict[str, str]) -> list[str]:
    """Write each value; the keys whose write failed."""
    bad = []
    for k, v in values.items():
        try:
            _sysctl_path(k).write_text(v + "\n")
        except OSError:
            bad.append(k)
    return bad


def save_sysctls(journal: HostJournaling | None) -> dict[str, Any]:
    """Journal the global sysctls a kubelet will change, before any kubelet starts; the entry restores them."""
    entry = {"kind": "kube_sysctl", "values": read_sysctls()}
    return journal.add(entry) if journal is not None else entry


def restore_sysctls(entry: dict[str, Any], journal: HostJournaling | None) -> list[str]:
    """Put the journaled values back; what could not be (the entry stays open for `clean` then)."""
    bad = write_sysctls(dict(entry["values"]))
    if not bad and journal is not None:
        journal.release(entry)
    return [f"sysctl {k} not restored to {entry['values'][k]}" for k in bad]


def _undo_sysctl(_host: Host, entry: dict[str, Any]) -> str | None:
    now = read_sysctls(list(entry["values"]))
    changed = {k: v for k, v in entry["values"].items() if now.get(k) != v}
    if write_sysctls(changed):
        return None
    return f"sysctls {', '.join(f'{k}={v}' for k, v in changed.items())} restored" if changed else None


# -- cgroups ------------------------------------------------------------------------------------------
def hierarchies(mountinfo: str | None = None) -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, named ones, the unified v2), from /proc/self/mountinfo."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    out = []
    for line in text.splitlines():
        pre, _, post = line.partition(" - ")
        fstype = post.split()[0] if post else ""
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(pre.split()[4]))
    return sorted(set(out))


def cgroup_dirs(name: str, mounts: Sequence[Path] | None = None) -> list[Path]:
    return [m / name.strip("/") for m in (mounts if mounts is not None else hierarchies())]


def make_cgroup_root(name: str, journal: HostJournaling | None) -> dict[str, Any]:
    """Journal, then create /<name> in every hierarchy; the cpuset one gets its parent's CPUs and memory nodes
    (v1 leaves them empty). Not the lab's CPU placement for the host: the kubelet writes every CPU it sees into
    kubepods/cpuset.cpus below, which a narrower parent refuses ("permission denied": the kubelet exits), so
    pods run on every CPU of the machine; the VPN daemons keep their placement."""
    dirs = cgroup_dirs(name)
    entry = {"kind": "kube_cgroup", "name": name, "dirs": [str(d) for d in dirs]}
    if journal is not None:
        journal.add(entry)
    for d in dirs:
        d.mkdir(exist_ok=True)
        if (d / "cpuset.cpus").exists():
            parent = d.parent
            (d / "cpuset.cpus").write_text((parent / "cpuset.cpus").read_text())
            (d / "cpuset.mems").write_text((parent / "cpuset.mems").read_text())
    return entry


def tree_pids(dirs: Sequence[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        for procs in d.rglob("cgroup.procs") if d.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(x) for x in procs.read_text().split()}
    return pids


def remove_cgroup_tree(dirs: Sequence[Path], wait_s: float = 10.0) -> list[str]:
    """Kill every process in the trees, then remove their folders deepest first; what is left."""
    end = time.monotonic() + wait_s
    while (pids := tree_pids(dirs)) and time.monotonic() < end:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    left = []
    for d in dirs:
        if not d.is_dir():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()
        try:
            d.rmdir()
        except OSError as e:
            left.append(f"cgroup {d}: {e.strerror}")
    if pids:
        left.append(f"processes {sorted(pids)[:10]} still in cgroups {dirs[0].name}")
    return left


def drop_cgroup_root(entry: dict[str, Any], journal: HostJournaling | None) -> list[str]:
    left = remove_cgroup_tree([Path(d) for d in entry["dirs"]])
    if not left and journal is not None:
        journal.release(entry)
    return left


def _undo_cgroup(_host: Host, entry: dict[str, Any]) -> str | None:
    dirs = [Path(d) for d in entry["dirs"]]
    if not any(d.exists() for d in dirs):
        return None
    left = remove_cgroup_tree(dirs)
    if left:  # clean names it; the entry stays in the copy of the journal for the next clean
        return f"cgroup {entry['name']}, in part (left: {'; '.join(left)})"
    return f"cgroup {entry['name']} in {len(dirs)} hierarchies (and its processes)"


def _sysctl_refusal(entry: dict[str, Any], _run_id: str) -> str | None:
    """Only the kubelet's own sysctls, each to a plain integer: a journal cannot make clean write others."""
    values = entry.get("values")
    if not isinstance(values, dict) or not values:
        return "kube_sysctl: no values"
    bad = [k for k, v in values.items() if k not in KUBELET_SYSCTLS or not str(v).lstrip("-").isdigit()]
    return (
        f"kube_sysctl: not the kubelet's sysctls or not integers: {', '.join(map(str, bad))}" if bad else None
    )


def _cgroup_refusal(entry: dict[str, Any], run_id: str) -> str | None:
    """Only the run's own cgroup roots (/<its tag>-hN) directly below a hierarchy of /sys/fs/cgroup."""
    tag = tag_of(run_id)
    dirs, name = entry.get("dirs"), str(entry.get("name", "")).strip("/")
    if not tag or not isinstance(dirs, list) or not dirs or not carries_tag(name, tag):
        return f"kube_cgroup {name!r}: not run {run_id}'s cgroup root"
    for d in map(Path, map(str, dirs)):
        if d.name != name or CGROUP_FS not in (d.parent, d.parent.parent) or ".." in d.parts:
            return f"kube_cgroup {d}: not a hierarchy's top folder named {name}"
    return None


register_undo("kube_sysctl", _undo_sysctl, _sysctl_refusal)
register_undo("kube_cgroup", _undo_cgroup, _cgroup_refusal)


# -- hosts joined with nsenter --------------------------------------------------------------------
class NsenterHost(Host):
    """A lab host's network namespace joined with nsenter, optionally in a private mount namespace (that of
    process `mount_pid`): what runc needs, where `ip netns exec` would hide the cgroups."""

    def __init__(self, base: Host, netns: str, mount_pid: int | None = None):
        self.base = base
        self.name = base.name
        self.netns = netns
        self.mount_pid = mount_pid
        self.underlay_ip = base.underlay_ip
        self.underlay_if = base.underlay_if
        self.journal = base.journal
        self.workdir = base.workdir
        self.cpus = base.cpus

    def argv(self, argv: Sequence[str]) -> list[str]:
        mnt = [f"--mount=/proc/{self.mount_pid}/ns/mnt"] if self.mount_pid else []
        pin = ["taskset", "-c", self.cpus] if self.cpus and argv else []
        return ["nsenter", f"--net=/run/netns/{self.netns}", *mnt, "--", *pin, *argv]
