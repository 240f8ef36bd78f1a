"""The pod workloads' kubelet-free parts: the pods' output framing (run for real by sh, as a pod runs it), hey's
per-request CSV with response times worked out by hand, the cluster's CPU share over a case, and the manifests
(pinned by nodeName, never pulled, a service account only for the API test)."""

from __future__ import annotations

import subprocess

import pytest

from tunnelbench.core.results import Outcome
from tunnelbench.kube import config
from tunnelbench.kube.cluster import Usage
from tunnelbench.workloads.pods import add_usage, hey_outcome, split_log, wrapped


def _metrics(out: Outcome) -> dict[str, float]:
    return {s.name: s.value for s in out.samples}


def test_a_pods_stdout_comes_back_whole_and_apart_from_its_stderr(tmp_path) -> None:
    argv = wrapped("echo '{\"end\": 1}'; echo 'warning: slow' >&2; exit 3", str(tmp_path))
    # a pod's log is its stdout and stderr in one stream: sh's merged output is the same
    r = subprocess.run(
        argv, capture_output=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert r.returncode == 3
    out, err = split_log(r.stdout)
    assert out == '{"end": 1}\n' and err == "warning: slow\n"


HEY_CSV = """response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset
0.0100,0.0050,0.0000,0.0000,0.0040,0.0001,200,0.0010
0.0200,0.0000,0.0000,0.0000,0.0190,0.0001,200,0.1010
0.0300,0.0000,0.0000,0.0000,0.0290,0.0001,200,0.2010
0.0400,0.0000,0.0000,0.0000,0.0390,0.0001,403,0.3010
"""


def test_hey_csv_by_hand() -> None:
    # 5 requests asked, 4 rows (one transport error has none), 3 with 200: 10, 20, 30 ms
    out = hey_outcome(HEY_CSV, count=5, took=0.5)
    assert out is not None
    m = _metrics(out)
    assert m["error_rate_pct"] == pytest.approx(40.0)  # 2 of 5: the 403 and the missing row
    assert m["request_mean_ms"] == pytest.approx(20.0)
    assert m["request_p50_ms"] == pytest.approx(20.0)
    assert m["request_max_ms"] == pytest.approx(30.0)
    assert m["achieved_rate_per_s"] == pytest.approx(8.0)  # 4 completed in 0.5 s
    assert hey_outcome(HEY_CSV.splitlines()[0] + "\n", 5, 1.0) is None


def test_the_clusters_cpu_share_over_a_case_by_hand() -> None:
    u0 = Usage({"control-plane": 10.0, "h2": 4.0, "h3": 3.0}, {})
    u1 = Usage(
        {"control-plane": 11.0, "h2": 4.5, "h3": 3.5},
        {"control-plane": 300 * 2**20, "h2": 2**20, "h3": 2**20},
    )
    out = Outcome()
    add_usage(out, u0, u1, seconds=10.0)
    m = _metrics(out)
    assert m["k8s_control_plane_cpu_pct"] == pytest.approx(10.0)  # 1 CPU-s in 10 s
    assert m["k8s_nodes_cpu_pct"] == pytest.approx(10.0)
    assert m["k8s_cpu_pct"] == pytest.approx(20.0)
    assert m["k8s_rss_mib"] == pytest.approx(302.0)


def test_pods_are_pinned_never_pulled_and_only_the_api_pod_has_a_token() -> None:
    p = config.pod("c1", "h2", "tunnelbench.local/tools:1.34.4", ["iperf3", "-s"])
    spec = p["spec"]
    assert spec["nodeName"] == "h2" and spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["imagePullPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    api = config.pod("a1", "h2", "x", ["hey"], service_account=config.API_SA)["spec"]
    assert api["automountServiceAccountToken"] is True and api["serviceAccountName"] == "tb-api"
    (_sa, role, binding) = (o for _, o in config.api_access())
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tb-api", "namespace": "tb"}]
