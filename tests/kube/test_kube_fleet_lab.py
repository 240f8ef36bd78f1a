"""many_clients on a real Kubernetes cluster, reached only through a kubeconfig, as on a user's cluster:

- ten wireguard-go client pods over two workers of the lab's own cluster (`tunnelbench run`, backend
  "kubernetes"): every client its own peer on the server, the pods where the scenario put them;
- a cluster brought up here (the lab's recipe, kube/labcluster.py) and used by `tunnelbench run --kubeconfig`:
  a namespace whose Pod Security forbids privileged pods refuses the run in one line, exit 2, nothing left; a run
  killed with SIGKILL while its pods run, then `tunnelbench clean --kubeconfig`: no namespace, pod or secret of
  the run left, as the apiserver lists them.

Needs the opt-in build (`tunnelbench install kubernetes`); without it these are skipped with exactly NOT_CACHED.
References: the pods' own logs read back here (not the product's parse), the apiserver's listings through
lightkube, the scenario's own placement."""

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

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.usefixtures("cluster_parts")]


def scenario(vpn: str, clients: int, duration_s: int, lab_extra: str = "", spread: str = '"even"') -> str:
    return f"""
name = "k8s-fleet-test"
vpns = ["{vpn}"]
[run]
repetitions = 1
retries = 0
drift_check_s = 0
[interference]
mode = "off"
[lab]
backend = "kubernetes"
hosts = 5
client = "h1"
server = "h2"
topology = "star"
hosts_per_vpn = {{ "{vpn}" = 2 }}
{lab_extra}
[[workloads]]
name = "many_clients"
clients = {clients}
duration_s = {duration_s}
spread = {spread}
"""


def case_metrics(run_dir: Path) -> tuple[dict[str, float], dict[str, dict[str, float]], str]:
    db = sqlite3.connect(run_dir / "results.sqlite")
    rows = db.execute(
        'SELECT m.name, m.value, m.host, c.status, c.error FROM "case" c JOIN metric m ON m.case_id = c.id'
    ).fetchall()
    plain = {n: v for n, v, h, _, _ in rows if h is None}
    per_host: dict[str, dict[str, float]] = {}
    for n, v, h, _, _ in rows:
        if h is not None:
            per_host.setdefault(n, {})[h] = v
    status = db.execute('SELECT status, error FROM "case"').fetchall()
    return plain, per_host, repr(status)


def test_ten_wireguard_go_pods_each_its_own_peer_where_the_scenario_put_them(tmp_path) -> None:
    (tmp_path / "s.toml").write_text(scenario("wireguard-go", 10, 5, spread="{ h4 = 6, h5 = 4 }"))
    r = tb("run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "results"), "--no-html", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    m, per_host, status = case_metrics(run_dir)
    assert m.get("server_peers") == 10, (m, status)  # `wg show` on the server: ten keys with a handshake
    assert m["clients_connected"] == 10 and m["nodes_used"] == 2
    assert per_host["pods_on_node"] == {"h4": 6, "h5": 4}
    (kube_json,) = run_dir.glob("cases/**/kube.json")
    rec = json.loads(kube_json.read_text())
    placed = list(rec["placement"].values())  # spec.nodeName of each pod, as the apiserver listed them
    assert sorted(placed) == ["h4"] * 6 + ["h5"] * 4
    assert {n["name"] for n in rec["nodes"]} == {"h4", "h5"} and all(
        n["kubelet"] == "v1.34.4" for n in rec["nodes"]
    )
    # the pods' own lines, read here: every call of the window, and the failure rate the store has
    calls = ok = 0
    for log in kube_json.parent.glob("pods/*.log"):
        for line in log.read_text().splitlines():
            if line.startswith('{"s":'):
                calls += 1
                ok += json.loads(line)["st"] == 1
    assert len(list(kube_json.parent.glob("pods/*.log"))) == 10
    assert calls == m["calls"] and calls >= 10 * 5 / 0.25 * 0.9
    assert m["failure_rate_pct"] == pytest.approx(100 * (calls - ok) / calls)
    assert rec["namespace_deleted"] is True


@pytest.fixture
def cluster(lab_factory, tmp_path):
    """A cluster of the lab's recipe, brought up here; its kubeconfig is what the runs below are given."""
    from tunnelbench.kube.labcluster import LabCluster

    lab = lab_factory(3)
    lc = LabCluster(lab, lab.hosts[0], list(lab.hosts[1:]), lab.run_dir / "kube-ext")
    try:
        lc.up()
        yield lc
    finally:
        assert lc.stop() == []


def run_label_objects(kubeconfig: Path) -> list[str]:
    from lightkube import Client, KubeConfig
    from lightkube.resources.core_v1 import Namespace, Pod, Secret

    from tunnelbench.kube.fleet import RUN_LABEL

    c = Client(KubeConfig.from_file(str(kubeconfig)), trust_env=False)
    out = [f"namespace {n.metadata.name}" for n in c.list(Namespace, labels={RUN_LABEL: None})]
    for res in (Pod, Secret):
        out += [f"{res.__name__} {o.metadata.namespace}/{o.metadata.name}"
                for o in c.list(res, namespace="*", labels={RUN_LABEL: None})]  # fmt: skip
    return out


def test_policy_refusal_then_kill_9_and_clean_kubeconfig_leave_nothing(cluster, tmp_path) -> None:
    from lightkube import Client, KubeConfig
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace, Pod

    kc = cluster.kubeconfig
    client = Client(KubeConfig.from_file(str(kc)), trust_env=False)
    # a namespace made by the cluster's admin, Pod Security "baseline": no privileged pod
    client.create(
        Namespace(
            metadata=ObjectMeta(name="team-a", labels={"pod-security.kubernetes.io/enforce": "baseline"})
        )
    )
    image = f'kube_image = "{cluster.image}"'
    (tmp_path / "refused.toml").write_text(
        scenario("wireguard-go", 4, 5, f'{image}\nkube_namespace = "team-a"')
    )
    r = tb("run", str(tmp_path / "refused.toml"), "--kubeconfig", str(kc), "--results", str(tmp_path / "r1"),
           "--no-html", timeout=300)  # fmt: skip
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2, out
    assert len(out.splitlines()) == 1 and 'Pod Security "baseline:latest"' in out, out
    assert "Traceback" not in out and not (tmp_path / "r1").exists() or not any((tmp_path / "r1").iterdir())
    assert list(client.list(Pod, namespace="team-a")) == [] and run_label_objects(kc) == []

    # a run whose pods wait for a server they cannot reach (it is in the run's own lab): killed while they run
    (tmp_path / "killed.toml").write_text(scenario("wireguard-go", 4, 5, image))
    p = subprocess.Popen([sys.executable, "-m", "tunnelbench.cli", "run", str(tmp_path / "killed.toml"),
                          "--kubeconfig", str(kc), "--results", str(tmp_path / "r2"), "--no-html"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    try:
        end = time.monotonic() + 300
        while sum(o.startswith("Pod ") for o in run_label_objects(kc)) < 4:
            assert p.poll() is None and time.monotonic() < end, "the run ended or never made its pods"
            time.sleep(1)
        there = run_label_objects(kc)
        assert (
            sum(o.startswith("namespace ") for o in there) == 1
            and sum(o.startswith("Secret ") for o in there) == 4
        )
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    c = tb("clean", "--kubeconfig", str(kc), timeout=300)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "removed namespace tb-" in c.stdout, c.stdout
    assert run_label_objects(kc) == []
    client.delete(Namespace, "team-a")
