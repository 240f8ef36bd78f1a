"""What `doctor` and `plan` say about the Kubernetes layer: whether the build is cached, and what this machine's
kernel has and lacks for it, each read from the kernel itself (a scratch namespace's VXLAN device,
/proc/filesystems, the cgroup mounts, this process's capability bounding set, /proc/sys)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunnelbench.kube import build
from tunnelbench.kube.system import hierarchies

CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class KubeCheck:
    name: str
    ok: bool
    detail: str
    meaning: str = ""  # what it means when not ok


def build_check() -> KubeCheck:
    rec = build.record()
    if build.installed() and rec is not None:
        size = int(str(rec.get("size_bytes", 0))) / 1e6
        return KubeCheck(
            "kubernetes build",
            True,
            f"{build.VERSION} in {build.cache_dir()} ({size:.0f} MB; built in {rec.get('seconds')} s)",
        )
    return KubeCheck(
        "kubernetes build",
        False,
        f"not installed (no complete build in {build.cache_dir()})",
        "opt-in: `tunnelbench install kubernetes` (the pod_* workloads, scenario k8s-underlay; ~15 CPU-min)",
    )


def cgroup_mode(mountinfo: str | None = None) -> str:
    """ "v1 (hybrid)", "v1", "v2" or "none", from the mounted hierarchies."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    kinds = set()
    for line in text.splitlines():
        post = line.partition(" - ")[2]
        if post.startswith(("cgroup ", "cgroup2 ")):
            kinds.add(post.split()[0])
    if kinds == {"cgroup2"}:
        return "v2"
    if "cgroup" in kinds:
        return "v1 (hybrid)" if "cgroup2" in kinds else "v1"
    return "none"


def has_cap(status: str, cap: int, field: str = "CapBnd") -> bool:
    """Whether capability number `cap` is in the /proc/PID/status field (hex mask)."""
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def _sysctl(key: str) -> str:
    try:
        return (Path("/proc/sys") / key.replace(".", "/")).read_text().strip()
    except OSError:
        return "?"


def kernel_checks(vxlan_missing: str | None) -> list[KubeCheck]:
    """vxlan_missing: lab.kernel.missing(("vxlan",)), probed by the caller (it needs a scratch namespace)."""
    out = [
        KubeCheck("VXLAN (the pod overlay)", vxlan_missing is None, vxlan_missing or "available",
                  "the overlay cannot be built: no pod-to-pod traffic between nodes"),
    ]  # fmt: skip
    fs = Path("/proc/filesystems").read_text()
    out.append(
        KubeCheck(
            "overlayfs",
            "overlay" in fs.split(),
            "available" if "overlay" in fs.split() else "missing",
            "containerd's overlayfs snapshotter and the nodes' private /var/lib cannot mount",
        )  # fmt: skip
    )
    mode = cgroup_mode()
    out.append(
        KubeCheck(
            "cgroup mode",
            mode != "none",
            f"{mode}, {len(hierarchies())} hierarchies"
            + (
                "; Kubernetes 1.35+ refuses v1 by default (failCgroupV1): the lab pins 1.34"
                if mode.startswith("v1")
                else ""
            ),
            "no cgroups mounted: the kubelet cannot run",
        )
    )
    status = Path("/proc/self/status").read_text()
    cap = has_cap(status, CAP_SYS_RESOURCE)
    out.append(
        KubeCheck(
            "CAP_SYS_RESOURCE",
            True,  # worked around, not missing for the lab
            "in the bounding set"
            if cap
            else "not in the bounding set: containerd runs with restrict_oom_score_adj (pods' oom_score_adj is "
            "not lowered); the kubelet cannot raise its open-files limit",
        )
    )
    out.append(
        KubeCheck(
            "pids and inotify",
            True,
            f"kernel.pid_max {_sysctl('kernel.pid_max')}, fs.inotify.max_user_instances "
            f"{_sysctl('fs.inotify.max_user_instances')} (shared by every kubelet and containerd)",
        )
    )
    return out
