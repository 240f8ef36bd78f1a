"""A real Kubernetes cluster over a VPN, run by the CLI as a user runs it (`tunnelbench run`), and a run of one
killed with SIGKILL in the middle of a case, then `tunnelbench clean RUN_ID`: nothing of it may be left.

Needs the opt-in build (`tunnelbench install kubernetes`); without it these tests are skipped with exactly
NOT_CACHED, the one skip of them tests/skipguard.py accepts. The references are the kernel's and the store's
own records, read here: the nodes' addresses as the apiserver registered them (nodes.json) against the VPN's
tunnel addresses, the router's nft counters, /sys/fs/cgroup, every process's mountinfo, /proc/sys."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tb

from tunnelbench.kube.system import KUBELET_SYSCTLS, hierarchies, read_sysctls

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.usefixtures("cluster_parts")]


def scenario(vpn: str, duration_s: int, api_count: int) -> str:
    """The API test first (it brings the cluster up: no pair path check runs on it), then the pods' transfers,
    then the control (with the cluster frozen: its CPU must read 0)."""
    return f"""
name = "k8s-test"
vpns = ["{vpn}"]
[run]
repetitions = 1
retries = 0
drift_check_s = 0
[lab]
hosts = 3
client = "h2"
server = "h3"
[[workloads]]
name = "pod_api"
count = {api_count}
rate_per_s = 10
[[workloads]]
name = "pod_tcp"
duration_s = {duration_s}
omit_s = 0
[[workloads]]
name = "pod_udp"
duration_s = {duration_s}
omit_s = 0
[[workloads]]
name = "pod_tcp"
control = true
duration_s = {duration_s}
omit_s = 0
"""


def metrics(run_dir: Path) -> dict[str, dict[str, float]]:
    """{case label: {metric: value}} of the run's ok cases (one repetition)."""
    db = sqlite3.connect(run_dir / "results.sqlite")
    rows = db.execute(
        'SELECT c.label, m.name, m.value FROM "case" c JOIN metric m ON m.case_id = c.id WHERE c.status = "ok"'
    ).fetchall()
    out: dict[str, dict[str, float]] = {}
    for label, name, value in rows:
        out.setdefault(label, {})[name] = value
    return out


def leftovers(tag: str) -> dict[str, list[str]]:
    """What of a run's tag is on the machine: cgroup folders, mounts in any process, processes whose command
    line names it, network namespaces."""
    cgroups = [str(p) for h in hierarchies() for p in h.glob(f"{tag}-*")]
    mounts, procs = set(), set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if tag in (d / "mountinfo").read_text():
                mounts.add(d.name)
            if tag.encode() in (d / "cmdline").read_bytes():
                procs.add(d.name)
        except OSError:
            continue
    netns = [n for n in os.listdir("/run/netns") if n.startswith(tag)] if os.path.isdir("/run/netns") else []
    return {"cgroups": cgroups, "mounts": sorted(mounts), "processes": sorted(procs), "netns": netns}


def test_a_cluster_over_wireguard_go_measures_pods_and_leaves_nothing(tmp_path) -> None:
    before = read_sysctls()
    (tmp_path / "s.toml").write_text(scenario("wireguard-go", 2, 20))
    r = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "results"), "--no-html", timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    m = metrics(run_dir)
    assert set(m) == {"pod-tcp-control", "pod-tcp", "pod-udp", "pod-api-10rps"}, m
    for label in ("pod-tcp-control", "pod-tcp", "pod-udp"):
        assert m[label]["goodput_mbps"] > 0
        # the router never saw a pod or service address, nor VXLAN in the clear: all of it inside wireguard-go
        assert m[label]["underlay_pod_packets"] == 0 and m[label]["underlay_vxlan_packets"] == 0, (
            label,
            m[label],
        )
        assert m[label]["overlay_mtu_bytes"] == 1420 - 50  # wireguard-go's interface MTU minus VXLAN's 50
    assert m["pod-api-10rps"]["error_rate_pct"] == 0 and m["pod-api-10rps"]["request_p50_ms"] > 0
    assert m["pod-tcp"]["k8s_cpu_pct"] > 0 and m["pod-tcp"]["k8s_rss_mib"] > 100
    assert m["pod-tcp-control"]["k8s_cpu_pct"] == 0  # the control ran with the cluster stopped
    # the nodes registered with the address the kernel has on the VPN's interface (wireguard-go's, named by the
    # run's tag; not the lab's eth0): the apiserver's record against the kernel's
    (nodes_file,) = run_dir.glob("kube/*/nodes.json")
    overlay = json.loads(nodes_file.with_name("overlay.json").read_text())
    tag = run_dir.name.rsplit("-", 1)[1]
    nodes = {
        n["metadata"]["name"]: next(
            a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP"
        )
        for n in json.loads(nodes_file.read_text())
    }
    assert set(nodes) == {"h2", "h3"}
    for host, ip in nodes.items():
        assert overlay["underlay"][host].startswith(tag) and ip in overlay["underlay_addresses"][host], (
            nodes,
            overlay,
        )
    assert read_sysctls() == before
    assert leftovers(tag) == {"cgroups": [], "mounts": [], "processes": [], "netns": []}


def test_kill_9_in_a_case_then_clean_leaves_nothing(tmp_path) -> None:
    before = read_sysctls()
    (tmp_path / "s.toml").write_text(scenario("internal", 60, 20))
    env = {**os.environ, "COLUMNS": "200"}
    p = subprocess.Popen([sys.executable, "-m", "tunnelbench.cli", "run", str(tmp_path / "s.toml"), "--results",
                          str(tmp_path / "results"), "--no-html"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=env)  # fmt: skip
    try:
        end = time.monotonic() + 600
        # the cluster is up and the pod_tcp case runs: its client pod's log folder exists on h2
        while not list((tmp_path / "results").glob("*/kube/*/h2/pods/tb_pod-tcp-*")):
            assert p.poll() is None and time.monotonic() < end, "the run ended or never reached the pod case"
            time.sleep(1)
        time.sleep(5)
        (run_dir,) = (tmp_path / "results").iterdir()
        tag = run_dir.name.rsplit("-", 1)[1]
        there = leftovers(tag)
        assert there["cgroups"] and there["mounts"] and there["processes"] and there["netns"], there
        assert read_sysctls()["kernel.panic_on_oops"] == "1"  # a kubelet ran: the global sysctls are its
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    c = tb("clean", run_dir.name, timeout=300)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "sysctls" in c.stdout and f"cgroup {tag}-h2" in c.stdout, c.stdout
    assert leftovers(tag) == {"cgroups": [], "mounts": [], "processes": [], "netns": []}
    assert read_sysctls() == before, {k: (before[k], read_sysctls()[k]) for k in KUBELET_SYSCTLS}


def test_a_hosts_namespace_is_as_the_cluster_found_it(lab_factory, tmp_path) -> None:
    """Links, addresses, routes and nftables of every host (the kernel's listing) are the same after a cluster
    came and went: the next VPN of a run finds no chain of the kubelet's, no table iptables-nft made, no
    VXLAN device, no route to the pod network."""
    from conftest import lab_state

    from tunnelbench.catalog import DRIVERS
    from tunnelbench.kube.layer import layer_for
    from tunnelbench.vpns.base import MeshSpec
    from tunnelbench.vpns.mesh import Mesh

    lab = lab_factory(3)
    mesh = Mesh(DRIVERS["internal"](MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir)))
    mesh.start()

    def state() -> dict[str, list[str]]:
        nft = {h.name: h.run(["nft", "list", "ruleset"]).stdout.splitlines() for h in lab.hosts}
        return {h: [*links, *nft[h]] for h, links in lab_state(lab).items()}

    try:
        before = state()
        lay = layer_for(mesh, lab.hosts[0], list(lab.hosts[1:]), lab.router, lab.tag, lab.run_dir / "kube")
        lay.ensure_cluster()
        during = state()
        assert any("KUBE-FIREWALL" in x for x in during["h2"]) and any("kvx0" in x for x in during["h2"])
        assert any("unreachable 10.244.0.0/16" in x for x in during["h1"])
        assert lay.stop() == []
        assert state() == before
    finally:
        mesh.stop()
