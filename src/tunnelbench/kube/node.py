"""A worker node on a lab host: containerd and the kubelet in the host's network namespace and in a private
mount namespace of the node's own, so two nodes on one machine do not share /run/containerd, /var/lib/kubelet
(its device-plugin socket is not configurable), /var/log/pods or /var/lib/cni.

The mount namespace is held by a `sleep` started with `unshare --mount --propagation private` (its mounts:
config.mount_script); containerd and the kubelet join it with nsenter (they must share it: the kubelet hands
containerd paths below its root folder), and so do containerd's shims. Nothing is mounted in the machine's own
mount namespace: when the last process of the node's namespace ends, its mounts go with it. The kubelet's
cgroupRoot (/<tag>-hN, every hierarchy) is made and removed by kube/system.py, journaled."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunnelbench.kube import build, config
from tunnelbench.kube.system import NsenterHost, drop_cgroup_root, make_cgroup_root
from tunnelbench.lab.host import Host, Process

READY_S = 20.0  # the holder's mounts and containerd's socket, each
DAEMON_ENV = {"PATH": f"{build.cache_dir() / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}


class NodeError(RuntimeError):
    pass


def mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pids_in_mount_ns(ns: str) -> list[int]:
    """Every process of the machine in the mount namespace `ns` (its /proc/PID/ns/mnt link text)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and mount_ns(int(d)) == ns:
            out.append(int(d))
    return out


@dataclass
class Worker:
    """One worker node: host hI, node IP = its tunnel address, its folder in the cluster's folder."""

    host: Host
    netns: str
    index: int
    node_ip: str
    tag: str
    dirs: config.NodeDirs
    procs: list[Process] = field(default_factory=list)
    holder: Process | None = None
    mount_ns: str | None = None
    cgroup_entry: dict[str, Any] | None = None
    nh: NsenterHost | None = None
    tables_before: set[str] | None = None  # the host's nftables tables before the node started
    links_before: set[str] | None = None  # the host's interfaces before the node started

    @property
    def name(self) -> str:
        return self.host.name

    def _wait(self, what: str, ok: Any, proc: Process | None, timeout: float = READY_S) -> None:
        end = time.monotonic() + timeout
        while not ok():
            if proc is not None and not proc.alive():
                raise NodeError(f"{self.name}: {what}: {proc.label} exited: {proc.log_tail(800)}")
            if time.monotonic() > end:
                raise NodeError(
                    f"{self.name}: {what} after {timeout:.0f} s" + (f": {proc.log_tail(600)}" if proc else "")
                )
            time.sleep(0.1)

    def start_runtime(self, mtu: int) -> None:
        """The node's mount namespace, cgroupRoot, containerd with its CNI config, and the lab's images."""
        for d in self.dirs.all():
            d.mkdir(parents=True, exist_ok=True)
        self.tables_before = self.nft_tables()
        self.links_before = self.links()
        logs = self.dirs.root / "logs"
        self.cgroup_entry = make_cgroup_root(
            config.cgroup_root(self.tag, self.name).lstrip("/"), self.host.journal
        )
        ready = self.dirs.root / "holder.ready"
        ready.unlink(missing_ok=True)
        script = config.mount_script(self.dirs, ready)
        plain = NsenterHost(self.host, self.netns)
        self.holder = plain.spawn(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            label=f"mountns-{self.name}",
            log_path=logs / "holder.log",
        )
        self._wait("private mounts", ready.exists, self.holder)
        self.mount_ns = mount_ns(self.holder.pid)
        nh = self.nh = NsenterHost(self.host, self.netns, self.holder.pid)
        conf = self.dirs.root / "containerd.toml"
        conf.write_text(
            config.containerd_toml(self.dirs, build.bin_path("runc"), build.cni_dir(), build.PAUSE_IMAGE)
        )
        (self.dirs.cni_conf / "10-tunnelbench.conflist").write_text(
            json.dumps(config.cni_conflist(self.index, mtu, self.dirs.cni_data), indent=1) + "\n"
        )
        ctrd = nh.spawn([str(build.bin_path("containerd")), "--config", str(conf)], label="containerd",
                        log_path=logs / "containerd.log", env=DAEMON_ENV)  # fmt: skip
        self.procs.append(ctrd)
        self._wait("containerd's socket", lambda: self.ctr(["version"], check=False).returncode == 0, ctrd)
        for image in ("pause.tar", "tools.tar"):
            self.ctr(["-n", "k8s.io", "images", "import", str(build.images_dir() / image)], timeout=120)

    def ctr(self, args: list[str], check: bool = True, timeout: float = 30.0) -> Any:
        assert self.nh is not None
        return self.nh.run([str(build.bin_path("ctr")), "--address", config.CONTAINERD_SOCK, *args],
                           check=check, timeout=timeout, env=DAEMON_ENV)  # fmt: skip

    def start_kubelet(self, ca: Path, kubeconfig_path: Path) -> None:
        assert self.nh is not None
        resolv = self.dirs.root / "resolv.conf"
        resolv.write_text("")  # no DNS in the lab; the pods need none
        cfg = self.dirs.root / "kubelet.json"
        cgroup = config.cgroup_root(self.tag, self.name)
        cfg.write_text(
            json.dumps(config.kubelet_config(self.node_ip, cgroup, ca, self.dirs, resolv), indent=1)
        )
        argv = config.kubelet_argv(build.bin_path("kubelet"), cfg, kubeconfig_path, self.name, self.node_ip)
        self.procs.append(self.nh.spawn(argv, label="kubelet", log_path=self.dirs.root / "logs" / "kubelet.log",
                                        env=DAEMON_ENV))  # fmt: skip

    def daemons(self) -> list[Process]:
        return [p for p in self.procs if p.alive()]

    def pids(self) -> list[int]:
        """The node's own processes: everything in its mount namespace (containerd, kubelet, the shims), not
        the pods' (each has a mount namespace of its own)."""
        return pids_in_mount_ns(self.mount_ns) if self.mount_ns else []

    def signal_daemons(self, sig: int, labels: tuple[str, ...]) -> None:
        for p in self.procs:
            if p.label in labels and p.alive():
                self.host.signal(p.pid, sig)

    def nft_tables(self) -> set[str]:
        """The host namespace's nftables tables ("family name"), iptables-nft's included."""
        out = self.host.run(["nft", "list", "tables"], check=False).stdout
        return {line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")}

    def drop_kubelet_chains(self) -> None:
        """The iptables chains the kubelet makes in the host's network namespace at start
        (pkg/kubelet/kubelet_network_linux.go: KUBE-FIREWALL jumped to from INPUT and OUTPUT, KUBE-IPTABLES-HINT,
        KUBE-KUBELET-CANARY), both families, then every table the node's run made (iptables-nft's filter, nat,
        mangle with their base chains): the next VPN on this host finds what the node found. (Pods' masquerade
        chains go with the pods: the CNI's DEL.)"""
        for ipt in ("iptables", "ip6tables"):
            steps = [["-D", "INPUT", "-j", "KUBE-FIREWALL"], ["-D", "OUTPUT", "-j", "KUBE-FIREWALL"],
                     ["-F", "KUBE-FIREWALL"], ["-X", "KUBE-FIREWALL"]]  # fmt: skip
            cmds = [[ipt, "-w", "-t", "filter", *s] for s in steps]
            cmds += [
                [ipt, "-w", "-t", t, op, "KUBE-KUBELET-CANARY"]
                for t in ("mangle", "nat", "filter")
                for op in ("-F", "-X")
            ]
            cmds += [[ipt, "-w", "-t", "mangle", "-X", "KUBE-IPTABLES-HINT"]]
            for c in cmds:
                self.host.run(c, check=False)
        if self.tables_before is not None:
            for table in sorted(self.nft_tables() - self.tables_before):
                self.host.run(["nft", "delete", "table", *table.split()], check=False)

    def stop(self) -> list[str]:
        """Kubelet, then containerd, then whatever is left of the node (pods by its cgroups, shims by its mount
        namespace), then the holder; the cgroupRoot removed. What could not be undone."""
        problems: list[str] = []
        for p in reversed(self.procs):  # kubelet first: it would restart what containerd stops
            if not p.stop(grace=10):
                problems.append(f"{self.name}: {p.label} (pid {p.pid}) survived SIGKILL")
        if self.cgroup_entry is not None:
            problems += drop_cgroup_root(self.cgroup_entry, self.host.journal)
        if self.mount_ns is not None:
            for pid in pids_in_mount_ns(self.mount_ns):
                if self.holder is None or pid != self.holder.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self.drop_kubelet_chains()
        if self.holder is not None and not self.holder.stop(grace=1):
            problems.append(f"{self.name}: the mount namespace's holder survived SIGKILL")
        if self.mount_ns is not None:
            left = pids_in_mount_ns(self.mount_ns)
            if left:
                problems.append(f"{self.name}: processes {left[:8]} still in the node's mount namespace")
        return problems + self.drop_pod_links()

    def links(self) -> set[str]:
        out = self.host.run(["ip", "-j", "link", "show"], check=False).stdout
        return {x["ifname"] for x in json.loads(out or "[]")}

    def drop_pod_links(self, wait_s: float = 10.0) -> list[str]:
        """The host ends of the pods' veths go with the pods' network namespaces, which the kernel frees a moment
        after their last holder (a pod process, or the bind mount in containerd's state folder: the node's mount
        namespace) is gone: wait for them, then delete what is left; the next VPN's leftover check must find
        only what it made."""
        if self.links_before is None:
            return []
        before = self.links_before

        def pods() -> set[
            str
        ]:  # the CNI's host ends: "veth" + 8 hex digits (ptp, plugins/pkg/ip/link_linux.go)
            return {x for x in self.links() - before if x.startswith("veth")}

        end = time.monotonic() + wait_s
        while (extra := pods()) and time.monotonic() < end:
            time.sleep(0.1)
        for name in sorted(extra):
            self.host.run(["ip", "link", "del", name], check=False)
        return [f"{self.name}: interface {x} of the node still there" for x in sorted(pods())]
