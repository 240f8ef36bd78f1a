"""The cluster's configuration, kubelet-free: what each part is told, checked against the format's own reader
(tomllib for containerd's TOML, json for the CNI and kubelet configs, `cryptography` and `openssl verify` for the
certificates), against the addressing plan worked out by hand, and the journaled global state's undo on files
made for the test (a private /proc/sys stand-in, a private cgroup tree)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from cryptography import x509

from tunnelbench.kube import config, pki, system
from tunnelbench.kube.overlay import OverlayNode, vxlan_commands
from tunnelbench.lab.host import THIS_MACHINE


def test_addressing_plan_by_hand() -> None:
    assert str(config.pod_subnet(2)) == "10.244.2.0/24"
    assert config.vxlan_ip(3) == "10.244.3.0" and config.pod_gateway(3) == "10.244.3.1"
    assert config.control_pod_ip(2) == "10.244.2.250"
    assert config.API_SERVICE_IP == "10.112.0.1"
    assert config.overlay_mtu(1280) == 1230 and config.overlay_mtu(1500) == 1450  # seed 000's two MTUs
    assert config.vxlan_mac(2) == "02:6b:38:00:00:02"
    lab = ipaddress.ip_network("10.100.0.0/14")
    for net in (config.POD_NETWORK, config.SERVICE_NETWORK):
        assert not net.overlaps(lab) and not net.overlaps(ipaddress.ip_network("10.64.0.0/12"))
    with pytest.raises(ValueError, match="outside 1..254"):
        config.pod_subnet(255)


def test_containerd_config_is_valid_toml_with_a_private_root_and_the_machine_workarounds(tmp_path) -> None:
    dirs = config.NodeDirs(tmp_path / "h2")
    cfg = tomllib.loads(config.containerd_toml(dirs, Path("/c/bin/runc"), Path("/c/cni"), "tb/pause:3.10.1"))
    assert cfg["version"] == 2 and cfg["root"] == "/var/lib/containerd" and cfg["state"] == "/run/containerd"
    assert cfg["grpc"]["address"] == "/run/containerd/containerd.sock"
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE here: every sandbox failed without it
    assert cri["netns_mounts_under_state_dir"] is True  # pod namespaces not in the machine's /run/netns
    assert cri["sandbox_image"] == "tb/pause:3.10.1"
    assert cri["cni"] == {"bin_dir": "/c/cni", "conf_dir": str(dirs.cni_conf), "max_conf_num": 1}
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/c/bin/runc", "SystemdCgroup": False}
    assert cfg["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith(
        "/var/lib/containerd"
    )  # not /opt


def test_cni_config_masquerades_only_what_leaves_the_pod_network(tmp_path) -> None:
    conf = config.cni_conflist(3, 1230, tmp_path / "ipam")
    (ptp,) = conf["plugins"]
    assert ptp["type"] == "ptp" and ptp["ipMasq"] is True and ptp["mtu"] == 1230
    ((r,),) = ptp["ipam"]["ranges"]
    # ptp masquerades all but the IPAM subnet: the whole pod network, so pod-to-pod keeps its addresses
    assert r == {
        "subnet": "10.244.0.0/16",
        "rangeStart": "10.244.3.2",
        "rangeEnd": "10.244.3.239",
        "gateway": "10.244.3.1",
    }
    assert ptp["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert ipaddress.ip_address(config.control_pod_ip(3)) > ipaddress.ip_address(
        r["rangeEnd"]
    )  # never handed out


def test_kubelet_config_keeps_every_path_per_node_and_the_node_ip_the_tunnel_address(tmp_path) -> None:
    dirs = config.NodeDirs(tmp_path / "h2")
    c = config.kubelet_config("10.64.0.2", "/tbab12-h2", tmp_path / "ca.crt", dirs, tmp_path / "resolv.conf")
    assert c["kind"] == "KubeletConfiguration" and c["address"] == "10.64.0.2"
    assert c["cgroupRoot"] == "/tbab12-h2" and c["cgroupDriver"] == "cgroupfs" and c["failCgroupV1"] is False
    assert c["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"
    assert c["readOnlyPort"] == 0 and c["authentication"]["anonymous"]["enabled"] is False
    assert set(c["evictionHard"].values()) == {"0%"}
    argv = config.kubelet_argv(Path("/k/kubelet"), tmp_path / "k.json", tmp_path / "kc", "h2", "10.64.0.2")
    assert "--node-ip=10.64.0.2" in argv and "--hostname-override=h2" in argv


def test_the_apiserver_serves_on_the_tunnel_address_and_asks_kubelets_by_internal_ip(tmp_path) -> None:
    argv = config.apiserver_argv(Path("/k/kube-apiserver"), "10.64.0.1", config.Pki(tmp_path))
    assert "--bind-address=10.64.0.1" in argv and "--advertise-address=10.64.0.1" in argv
    assert "--kubelet-preferred-address-types=InternalIP" in argv
    assert "--service-cluster-ip-range=10.112.0.0/16" in argv


def test_mount_script_mounts_nothing_outside_its_namespace(tmp_path) -> None:
    script = config.mount_script(config.NodeDirs(tmp_path / "h2"), tmp_path / "ready")
    lines = script.splitlines()
    assert lines[0] == "set -e" and lines[-1] == "exec sleep infinity"
    mounts = [x for x in lines if x.startswith("mount ")]
    # every target is one of the daemons' default paths, every source the node's folder or a fresh fs
    targets = sorted(m.split()[-1] for m in mounts)
    assert targets == sorted(
        ["/run", "/var/lib", "/var/log", "/var/lib/containerd", "/var/lib/kubelet", "/var/log/pods"]
    )
    assert all(str(tmp_path) in m or m.startswith("mount -t tmpfs") for m in mounts)


def test_vxlan_commands_for_a_node_name_each_peer_by_its_tunnel_address() -> None:
    me, peer = OverlayNode(THIS_MACHINE, 2, "10.64.0.2"), OverlayNode(THIS_MACHINE, 3, "10.64.0.3")
    cmds = [" ".join(c) for c in vxlan_commands(me, [me, peer], "tbab12v2", 1370)]
    assert cmds[0] == ("ip link add kvx0 address 02:6b:38:00:00:02 type vxlan id 1 dev tbab12v2 local 10.64.0.2 "
                       "dstport 8472 nolearning")  # fmt: skip
    assert "ip link set kvx0 mtu 1370 up" in cmds
    assert "bridge fdb append 02:6b:38:00:00:03 dev kvx0 dst 10.64.0.3" in cmds
    assert "ip neigh replace 10.244.3.0 lladdr 02:6b:38:00:00:03 dev kvx0 nud permanent" in cmds
    assert "ip route replace 10.244.3.0/24 via 10.244.3.0 dev kvx0 onlink" in cmds
    assert not any("10.244.2.0/24" in c for c in cmds)  # no route to its own pods through the overlay


def test_certificates_chain_to_the_ca_and_carry_the_identities_rbac_reads(tmp_path) -> None:
    ca = pki.make_ca()
    node = pki.issue(ca, "system:node:h2", ["system:nodes"], client=True)
    srv = pki.issue(ca, "kube-apiserver", ips=["10.64.0.1", "10.112.0.1"], dns=["kubernetes"], server=True)
    cert = x509.load_pem_x509_certificate(node.cert_pem)
    assert cert.subject.rfc4514_string() == "CN=system:node:h2,O=system:nodes"
    sans = x509.load_pem_x509_certificate(srv.cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert {str(i) for i in sans.value.get_values_for_type(x509.IPAddress)} == {"10.64.0.1", "10.112.0.1"}
    if shutil.which("openssl"):  # an independent verifier of the chain and the purposes
        (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
        (tmp_path / "n.crt").write_bytes(node.cert_pem)
        (tmp_path / "s.crt").write_bytes(srv.cert_pem)
        ok = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-purpose", "sslclient",
                             str(tmp_path / "n.crt")], capture_output=True, text=True)  # fmt: skip
        assert ok.returncode == 0, ok.stdout + ok.stderr
        bad = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-purpose", "sslclient",
                              str(tmp_path / "s.crt")], capture_output=True, text=True)  # fmt: skip
        assert bad.returncode != 0  # a serving certificate is no client certificate


class _Journal:
    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.released: list[dict] = []

    def add(self, e: dict) -> dict:
        self.entries.append(e)
        return e

    def release(self, e: dict) -> None:
        self.released.append(e)


def test_sysctls_are_journaled_before_and_the_undo_puts_them_back(tmp_path, monkeypatch) -> None:
    proc = tmp_path / "sys"
    for k, v in {"vm.overcommit_memory": "0", "vm.panic_on_oom": "0", "kernel.panic": "1", "kernel.panic_on_oops": "0",
                 "kernel.keys.root_maxkeys": "1000000", "kernel.keys.root_maxbytes": "25000000"}.items():  # fmt: skip
        p = proc / k.replace(".", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(v + "\n")
    monkeypatch.setattr(system, "_sysctl_path", lambda k: proc / k.replace(".", "/"))
    j = _Journal()
    entry = system.save_sysctls(j)
    assert j.entries == [entry] and entry["values"]["kernel.panic"] == "1"
    # the kubelet's writes (container_manager_linux.go setupKernelTunables)
    (proc / "kernel/panic").write_text("10\n")
    (proc / "kernel/panic_on_oops").write_text("1\n")
    (proc / "vm/overcommit_memory").write_text("1\n")
    what = system._undo_sysctl(THIS_MACHINE, entry)  # what `clean` runs after a kill
    assert what is not None and "kernel.panic=1" in what and "kernel.panic_on_oops=0" in what
    assert (proc / "kernel/panic").read_text().strip() == "1"
    assert (proc / "vm/overcommit_memory").read_text().strip() == "0"
    assert system._undo_sysctl(THIS_MACHINE, entry) is None  # nothing changed any more


def test_cgroup_hierarchies_from_mountinfo_and_a_tree_removed_deepest_first(tmp_path) -> None:
    mountinfo = (
        "25 24 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:6 - cgroup cgroup rw,cpu\n"
        "38 25 0:34 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"
        "39 25 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert system.hierarchies(mountinfo) == [Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/systemd"),
                                             Path("/sys/fs/cgroup/unified")]  # fmt: skip
    root = tmp_path / "cpu" / "tbab12-h2"
    (root / "kubepods" / "besteffort" / "pod1").mkdir(parents=True)
    assert system.remove_cgroup_tree([root, tmp_path / "absent" / "tbab12-h2"]) == []
    assert not root.exists()


def test_the_kinds_clean_undoes_are_registered_on_import() -> None:
    from tunnelbench.lab.journal import undo_handler

    assert undo_handler("kube_sysctl") is system._undo_sysctl
    assert undo_handler("kube_cgroup") is system._undo_cgroup
    # cli `clean` imports the module that registers them
    src = (Path(system.__file__).parents[1] / "cli" / "lab.py").read_text()
    assert "import tunnelbench.kube.system" in src


def test_kubeconfig_names_the_server_and_the_user_files(tmp_path) -> None:
    kc = config.kubeconfig(
        "https://10.64.0.1:6443", tmp_path / "ca", tmp_path / "c", tmp_path / "k", "system:node:h2"
    )
    json.dumps(kc)
    (cluster,) = kc["clusters"]
    assert cluster["cluster"] == {
        "server": "https://10.64.0.1:6443",
        "certificate-authority": str(tmp_path / "ca"),
    }
    assert kc["users"][0]["user"]["client-key"] == str(tmp_path / "k")


def test_freeze_stops_every_daemon_and_thaw_continues_the_controller_manager_last(tmp_path) -> None:
    """The control's freeze, on real processes: stopped (state T) while frozen; thawed with the controller
    manager after the others (its node monitor must see the kubelets' fresh leases first)."""
    from tunnelbench.kube.cluster import Cluster, Plan
    from tunnelbench.lab.host import Process
    from tunnelbench.lab.procstat import read_stat

    sent: list[tuple[str, int]] = []

    class Rec(type(THIS_MACHINE)):  # this machine, recording the signals it sends
        def signal(self, pid: int, sig: int) -> None:
            sent.append((labels[pid], sig))
            super().signal(pid, sig)

    host = Rec()
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    labels = dict(
        zip((p.pid for p in procs), ("etcd", "kube-apiserver", "kube-controller-manager"), strict=True)
    )
    try:
        c = Cluster(Plan("tbtest", host, "10.64.0.1", [], tmp_path, 1370))
        c.cp = [Process(host, labels[p.pid], ["sleep"], p.pid, None, p) for p in procs]
        c._leases_after = lambda t: True  # the kubelets renewed (no apiserver here)
        c.freeze()

        def states(want: str) -> bool:  # a signal lands asynchronously: wait up to 5 s for the state
            end = time.monotonic() + 5
            while time.monotonic() < end:
                if all((st := read_stat(p.pid)) is not None and st.state in want for p in procs):
                    return True
                time.sleep(0.01)
            return False

        assert states("T")
        assert sent[0] == ("kube-controller-manager", 19)  # SIGSTOP, the controller manager first
        sent.clear()
        c.thaw()
        assert states("SR")
        order = [x for x, _ in sent]
        assert order.index("kube-controller-manager") == len(order) - 1 == 2  # once, after the others
        assert {s for _, s in sent} == {18}  # SIGCONT
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_cri_log_lines_give_back_the_containers_text() -> None:
    from tunnelbench.kube.cluster import cri_log_text

    log = (
        "2026-11-28T17:55:14.615088440Z stdout F {\n"
        '2026-11-28T17:55:14.615110773Z stdout P \t"start": \n'  # split by the runtime: continued below
        "2026-11-28T17:55:14.615113848Z stdout F {}\n"
        "2026-11-28T17:55:14.615120000Z stderr F warning: x y\n"
        "2026-11-28T17:55:14.615130000Z stdout F \n"
    )
    assert cri_log_text(log) == '{\n\t"start": {}\nwarning: x y\n\n'


def test_clean_undoes_only_the_runs_own_machine_wide_kube_state(tmp_path):
    """The cluster's global state is undone outside the run's namespaces (the kubelet's sysctls, its cgroup
    roots), so its kinds carry their own rule (lab/journal.py register_undo's machine_wide): a journal cannot
    make `clean` write another sysctl or remove another cgroup; the run's own entries pass."""
    import tunnelbench.kube.system  # noqa: F401  (registers the kinds)
    from tunnelbench.lab.clean import _local_refusal
    from tunnelbench.lab.journal import Leftovers

    run = Leftovers("20261128-195607-tbe958", tmp_path, 0, 0, [])
    own = {"kind": "kube_sysctl", "values": {"kernel.panic": "1", "vm.overcommit_memory": "0"}}
    assert _local_refusal(own, run) is None
    other = {"kind": "kube_sysctl", "values": {"kernel.core_pattern": "|/tmp/x"}}
    assert "not the kubelet's sysctls" in str(_local_refusal(other, run))
    not_int = {"kind": "kube_sysctl", "values": {"kernel.panic": "1; reboot"}}
    assert _local_refusal(not_int, run) is not None
    dirs = [f"/sys/fs/cgroup/{h}/tbe958-h2" for h in ("cpu", "memory")]
    assert _local_refusal({"kind": "kube_cgroup", "name": "tbe958-h2", "dirs": dirs}, run) is None
    foreign = [f"/sys/fs/cgroup/{h}/system.slice" for h in ("cpu",)]
    assert _local_refusal({"kind": "kube_cgroup", "name": "system.slice", "dirs": foreign}, run) is not None
    deep = ["/sys/fs/cgroup/cpu/user.slice/tbe958-h2"]
    assert _local_refusal({"kind": "kube_cgroup", "name": "tbe958-h2", "dirs": deep}, run) is not None
    elsewhere = ["/tmp/tbe958-h2"]
    assert _local_refusal({"kind": "kube_cgroup", "name": "tbe958-h2", "dirs": elsewhere}, run) is not None
