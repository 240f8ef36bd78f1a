"""many_clients on Kubernetes without a cluster: the manifests, where pods go, the pods' logs back into metrics,
a policy refusal as one line, the kubeconfig the lab writes, the scenario fields. References are written by
hand here (a pod log with known latencies and percentiles computed by hand; an apiserver's refusal text as
Kubernetes v1.34 words it) or come from lightkube itself (it reads the kubeconfig back)."""

from __future__ import annotations

import base64
import json

import httpx2
import pytest
from lightkube import ApiError, KubeConfig

from tunnelbench.kube import fleet
from tunnelbench.kube.access import kubeconfig, write_kubeconfig
from tunnelbench.kube.fleet import RUN_LABEL, FleetError
from tunnelbench.kube.remote import Remote
from tunnelbench.vpns.podclients import pod_addresses
from tunnelbench.workloads.many_clients import outcome_from_rows


def test_the_namespace_and_every_object_carry_the_runs_label() -> None:
    ns = fleet.namespace_name("TB_a1b2")
    assert ns == "tb-tb-a1b2"
    m = fleet.namespace_manifest(ns, "TB_a1b2")
    assert m["metadata"]["labels"] == {RUN_LABEL: "tb-a1b2", "app.kubernetes.io/managed-by": "tunnelbench",
                                       "pod-security.kubernetes.io/enforce": "privileged"}  # fmt: skip
    s = fleet.secret_manifest(
        ns, "c0-id", "TB_a1b2", {"wg.conf": b"[Interface]\n", "address": b"10.77.0.3/24"}
    )
    assert s["metadata"]["labels"][RUN_LABEL] == "tb-a1b2"
    assert base64.b64decode(s["data"]["wg.conf"]) == b"[Interface]\n"
    assert base64.b64decode(s["data"]["address"]) == b"10.77.0.3/24"


def test_a_client_pod_is_privileged_pinned_never_restarted_and_mounts_its_own_identity() -> None:
    p = fleet.pod_manifest(
        "tb-x", "tb1c4", "x", "h4", "img@sha256:ab", "echo hi", "tb1c4-id", pull="IfNotPresent"
    )
    spec = p["spec"]
    c = spec["containers"][0]
    assert spec["nodeName"] == "h4" and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert c["securityContext"] == {"privileged": True}
    assert c["command"] == ["sh", "-c", "echo hi"] and c["image"] == "img@sha256:ab"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["volumeMounts"] == [{"name": "identity", "mountPath": "/etc/tb", "readOnly": True}]
    assert spec["volumes"][0]["secret"]["secretName"] == "tb1c4-id"
    assert p["metadata"]["labels"][RUN_LABEL] == "x"
    # no identity (no VPN): no volume at all
    bare = fleet.pod_manifest("tb-x", "tb1c4", "x", "h4", "img", "true", None)
    assert bare["spec"]["volumes"] == [] and bare["spec"]["containers"][0]["volumeMounts"] == []


def test_the_pod_script_brings_the_vpn_up_then_runs_the_loop_with_its_number() -> None:
    loop = fleet.CallLoop("10.77.0.2", 8082, 50, 0.25, 15.0, 10.0)
    argv = loop.argv(7)
    assert argv[:5] == ["tbcall", "-server=10.77.0.2", "-port=8082", "-id=7", "-n=50"]
    assert "-interval=0.25" in argv and "-duration=15.0" in argv and "-timeout=10.0" in argv
    script = fleet.pod_script("nebula -config /etc/tb/config.yml &", argv)
    assert script.startswith("set -e\nnebula -config /etc/tb/config.yml &\nset +e\n")
    assert "tbcall -server=10.77.0.2 -port=8082 -id=7" in script
    assert not fleet.pod_script("", argv).startswith("set -e")


def test_even_spread_is_round_robin_over_sorted_nodes() -> None:
    where = fleet.place(5, ["h5", "h4"], "even")
    assert where == ["h4", "h5", "h4", "h5", "h4"]
    assert {n: where.count(n) for n in set(where)} == {"h4": 3, "h5": 2}


def test_per_node_counts_are_kept_and_interleaved() -> None:
    assert fleet.place(5, ["a", "b", "c"], {"a": 2, "b": 3}) == ["a", "b", "a", "b", "b"]


@pytest.mark.parametrize(
    ("spread", "nodes", "words"),
    [
        ({"a": 2, "b": 2}, ["a", "b"], ["add up to 4", "clients = 5"]),
        ({"a": 3, "zz": 2}, ["a", "b"], ["'zz'", "a, b"]),
        ("even", [], ["no schedulable Ready node"]),
    ],
)
def test_a_placement_that_cannot_be_kept_is_refused_naming_the_field(spread, nodes, words) -> None:
    with pytest.raises(FleetError) as e:
        fleet.place(5, nodes, spread)
    for w in words:
        assert w in str(e.value)


def _node(name: str, ready: bool = True, taints: list | None = None, cordoned: bool = False) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": taints or [], "unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "nodeInfo": {"kubeletVersion": "v1.34.4", "containerRuntimeVersion": "containerd://1.6.20"},
                       "addresses": [{"type": "InternalIP", "address": "10.100.0.4"}], "allocatable": {"pods": "110"}}}  # fmt: skip


def test_only_ready_untainted_uncordoned_nodes_take_pods() -> None:
    nodes = [_node("w1"), _node("w2", ready=False), _node("cp", taints=[{"key": "k", "effect": "NoSchedule"}]),
             _node("w3", cordoned=True), _node("w4", taints=[{"key": "k", "effect": "PreferNoSchedule"}])]  # fmt: skip
    assert fleet.schedulable(nodes) == ["w1", "w4"]
    rec = fleet.node_record(nodes[0])
    assert (
        rec["kubelet"] == "v1.34.4"
        and rec["addresses"] == {"InternalIP": "10.100.0.4"}
        and rec["max_pods"] == "110"
    )


# a pod's log as tbcall writes it, with a VPN daemon's line mixed in (kube/tbcall/main.go)
POD_A = """\
{"ev":"connected","ms":412.5}
{"ev":"go","t0":1764370000.000000}
{"s":0.0000,"lag":0.120,"ms":10.000,"st":1}
{"s":0.2500,"lag":0.080,"ms":20.000,"st":1}
{"s":0.5000,"lag":0.300,"ms":10000.400,"st":-1}
{"ev":"end","calls":3}
"""
POD_B = """\
time="2026-11-29T00:00:00Z" level=info msg="Handshake message sent"
{"ev":"connected","ms":1012.0}
{"ev":"go","t0":1764370000.000000}
{"s":0.1250,"lag":0.100,"ms":30.000,"st":1}
{"s":0.3750,"lag":2.500,"ms":40.000,"st":1}
{"s":0.6250,"lag":0.100,"ms":3.000,"st":0}
{"ev":"end","calls":3}
"""


def test_pod_logs_give_the_known_percentiles_failure_rate_and_connect_times() -> None:
    a, b = fleet.parse_pod_log(POD_A), fleet.parse_pod_log(POD_B)
    assert a.connect_ms == 412.5 and b.connect_ms == 1012.0 and a.t0 == 1764370000.0
    assert a.ended and b.ended and len(a.calls) == 3 and len(b.calls) == 3
    assert b.other == ['time="2026-11-29T00:00:00Z" level=info msg="Handshake message sent"']
    rows = fleet.call_rows([a, b], 0.25, 0.75, 10.0)
    assert rows.shape == (6, 5) and list(rows[:, 0]) == [0, 0, 0, 1, 1, 1]
    out = outcome_from_rows(rows, 15.0)
    got = {s.name: s.value for s in out.samples}
    # by hand: 4 successful calls of 10, 20, 30, 40 ms; one timeout and one error out of 6
    assert got["calls"] == 6 and got["timeouts"] == 1
    assert got["failure_rate_pct"] == pytest.approx(100 * 2 / 6)
    assert got["response_p50_ms"] == pytest.approx(25.0)  # midway between 20 and 30
    assert got["response_p25_ms"] == pytest.approx(17.5)  # (4 - 1) * 0.25 = 0.75 of the way from 10 to 20
    assert got["response_p75_ms"] == pytest.approx(32.5)
    assert got["response_max_ms"] == 40.0 and got["response_mean_ms"] == 25.0
    assert got["clients_calling"] == 2 and got["calls_per_s"] == pytest.approx(4 / 15)


def test_a_client_without_a_call_in_the_window_fails_each_call_it_would_have_made() -> None:
    # by hand: 4 clients, a call every 0.25 s for 1 s, staggered 0.25 * i / 4: client 3 at 0.1875, 0.4375, ...
    assert fleet.slots(0, 4, 0.25, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert fleet.slots(3, 4, 0.25, 1.0) == [0.1875, 0.4375, 0.6875, 0.9375]
    # the seed's loop: 15 s, 250 ms, 10-s timeout; a call that times out at 0 s ends at 10 s, the next slot
    # after it is 10.25 s, which ends past the window: two calls (tbcall's schedule, kube/tbcall/main.go)
    assert fleet.slots(0, 50, 0.25, 15.0, 10.0) == [0.0, 10.25]
    assert fleet.slots(49, 50, 0.25, 15.0, 10.0) == pytest.approx([0.245, 10.495])
    assert len(fleet.slots(0, 1, 0.25, 30.0, 10.0)) == 3  # 0, 10.25, 20.5
    a = fleet.parse_pod_log(POD_A)  # 3 calls made: 2 ok, 1 timeout
    never = fleet.parse_pod_log('{"ev":"connected","ms":5000.0}\n')  # asked once, then lost the tunnel
    late = fleet.parse_pod_log(
        '{"ev":"go","t0":1764370000.0}\n{"ev":"end","calls":0}\n'
    )  # start after the window
    rows = fleet.call_rows([a, never, late, never], 0.25, 1.0, 0.6)
    # each call of the three without calls takes 0.6 s: at its first slot, then the first slot after it ends
    assert rows.shape == (3 + 3 * 2, 5)
    lost = rows[rows[:, 0] == 3]
    assert list(lost[:, 1]) == [0.1875, 0.9375] and set(lost[:, 4]) == {fleet.NO_TUNNEL}
    assert list(rows[rows[:, 0] == 2][:, 1]) == [0.125, 0.875]
    got = {s.name: s.value for s in outcome_from_rows(rows, 1.0).samples}
    assert got["calls"] == 9 and got["failure_rate_pct"] == pytest.approx(100 * 7 / 9)
    assert got["timeouts"] == 1 and got["clients_calling"] == 1
    # NaN lags left out: POD_A's 0.08, 0.12, 0.3 ms, p99 = 0.12 + 0.98 * 0.18 (linear, as numpy's default)
    assert got["schedule_lag_p99_ms"] == pytest.approx(0.2964)
    assert got["response_p50_ms"] == pytest.approx(15.0)  # its two answers, 10 and 20 ms


def test_a_log_without_calls_parses_to_nothing_measured() -> None:
    lg = fleet.parse_pod_log("wireguard-go's UAPI socket did not appear\n{broken json\n")
    assert lg.calls == [] and lg.connect_ms is None and not lg.ended and len(lg.other) == 2


def test_the_barrier_counts_each_client_once() -> None:
    assert fleet.barrier_ids("0\n1\n1\n7\n-\n\n3\n") == {0, 1, 3, 7}


PSA = ('pods "tb-preflight" is forbidden: violates PodSecurity "baseline:latest": privileged (container "client" '
       'must not set securityContext.privileged=true)')  # fmt: skip


def test_a_pod_security_refusal_is_one_line_naming_the_policy_and_the_fix() -> None:
    msg = fleet.refusal_message(403, PSA, "team-a")
    assert "\n" not in msg
    assert 'Pod Security "baseline:latest" of namespace team-a' in msg
    assert "pod-security.kubernetes.io/enforce=privileged" in msg and "nothing was created" in msg


def test_a_webhook_refusal_names_the_webhook() -> None:
    msg = fleet.refusal_message(400, 'admission webhook "validate.kyverno.svc-fail" denied the request: '
                                     "policy disallow-privileged\n  rule: privileged forbidden", "ns")  # fmt: skip
    assert 'admission webhook "validate.kyverno.svc-fail"' in msg and "\n" not in msg


class _Refusing:
    """A lightkube client whose create() gets the apiserver's 403 answer (a Status as v1.34 sends it)."""

    def create(self, obj, dry_run=False):
        assert dry_run  # the check must never store anything
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": PSA, "reason": "Forbidden",
                  "code": 403}  # fmt: skip
        req = httpx2.Request("POST", "https://127.0.0.1:6443/api/v1/namespaces/team-a/pods?dryRun=All")
        raise ApiError(request=req, response=httpx2.Response(403, json=status, request=req))


def test_the_dry_run_turns_the_apiservers_refusal_into_one_line() -> None:
    r = Remote.__new__(Remote)
    r.client = _Refusing()  # type: ignore[assignment]
    pod = fleet.pod_manifest("team-a", "tb-preflight", "x", "n", "img", "true", None)
    with pytest.raises(FleetError) as e:
        r.dry_run_pod(pod)
    assert str(e.value).startswith('the cluster refused the client pod: Pod Security "baseline:latest"')
    assert "\n" not in str(e.value)


def test_the_labs_kubeconfig_is_one_lightkube_reads(tmp_path) -> None:
    data = kubeconfig("https://127.0.0.1:40123", b"CA PEM", b"CERT PEM", b"KEY PEM")
    path = write_kubeconfig(tmp_path / "k" / "kubeconfig.yaml", data)
    assert path.stat().st_mode & 0o777 == 0o600
    cfg = KubeConfig.from_file(str(path)).get()
    assert cfg.cluster.server == "https://127.0.0.1:40123"
    assert (
        json.loads(path.read_text())["users"][0]["user"]["client-key-data"]
        == base64.b64encode(b"KEY PEM").decode()
    )


def test_pods_take_the_mesh_networks_addresses_after_its_hosts() -> None:
    assert pod_addresses("10.77.0", 2, 3) == ["10.77.0.3", "10.77.0.4", "10.77.0.5"]
    with pytest.raises(ValueError, match="lower clients to 252"):
        pod_addresses("10.77.0", 2, 253)


def test_backend_kubernetes_puts_many_clients_on_pods_and_kube_fields_need_it() -> None:
    from tunnelbench.scenario import ScenarioError, parse_scenario

    base = {"name": "t", "vpns": ["internal"], "lab": {"backend": "kubernetes", "hosts": 5, "topology": "star",
            "hosts_per_vpn": {"internal": 2}}, "workloads": [{"name": "many_clients", "clients": 4}]}  # fmt: skip
    sc = parse_scenario(json.loads(json.dumps(base)))
    assert sc.lab.backend == "netns" and sc.lab.clients_on == "kubernetes"
    assert sc.workloads[0].on == "kubernetes"  # type: ignore[attr-defined]
    assert sc.lab.kube_options() == {"kubeconfig": None, "namespace": None, "image": None}
    bad = json.loads(json.dumps(base))
    bad["lab"] = {"backend": "netns", "kube_image": "r/x@sha256:00"}
    with pytest.raises(ScenarioError, match="kube_image is only used with backend"):
        parse_scenario(bad)
    spread = json.loads(json.dumps(base))
    spread["workloads"][0]["spread"] = "random"
    with pytest.raises(ScenarioError, match="even"):
        parse_scenario(spread)


def test_a_kubeconfig_that_cannot_be_used_is_one_error_naming_it_and_the_fix(tmp_path) -> None:
    bad = tmp_path / "kc.yaml"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(FleetError) as e:
        Remote(bad).nodes()
    assert str(bad) in str(e.value) and "--kubeconfig PATH or lab.kubeconfig" in str(e.value)


class _Cluster:
    """A cluster's labelled objects, as the API lists them; what clean deletes."""

    def __init__(self) -> None:
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace, Pod, Secret

        def meta(name: str, run: str, ns: str | None = None) -> ObjectMeta:
            return ObjectMeta(name=name, namespace=ns, labels={fleet.RUN_LABEL: run})

        self.objects = {
            Namespace: [Namespace(metadata=meta("tb-tbdead", "tbdead")), Namespace(metadata=meta("tb-tblive", "tblive"))],
            Pod: [Pod(metadata=meta("c0", "tbdead", "tb-tbdead")), Pod(metadata=meta("c0", "tblive", "tb-tblive")),
                  Pod(metadata=meta("c1", "tbold", "team-a"))],
            Secret: [Secret(metadata=meta("c1", "tbold", "team-a")), Secret(metadata=meta("c0", "tblive", "tb-tblive"))],
        }  # fmt: skip
        self.deleted: list[str] = []

    def list(self, res, namespace=None, labels=None):  # type: ignore[no-untyped-def]
        assert labels == {fleet.RUN_LABEL: None}  # only what carries the run label is ever listed
        return list(self.objects[res])

    def delete(self, res, name, namespace=None):  # type: ignore[no-untyped-def]
        self.deleted.append(f"{res.__name__} {namespace + '/' if namespace else ''}{name}")

    def get(self, res, name):  # type: ignore[no-untyped-def]
        from lightkube import ApiError

        req = httpx2.Request("GET", "https://127.0.0.1:6443/api/v1/namespaces/" + name)
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "NotFound",
            "code": 404,
        }
        raise ApiError(request=req, response=httpx2.Response(404, json=status, request=req))


def test_clean_kubeconfig_removes_dead_runs_objects_and_leaves_a_live_runs_alone(tmp_path) -> None:
    from tunnelbench.kube.remote import clean

    def run(**kw):  # type: ignore[no-untyped-def]
        c = _Cluster()
        r = Remote.__new__(Remote)
        r.client = c  # type: ignore[assignment]
        done, kept = clean(tmp_path / "kc", wait_s=1, remote=r, **kw)
        return c.deleted, done, kept

    deleted, done, kept = run(live={"tblive"})
    # the dead run's namespace (its pod goes with it) and a pre-made namespace's labelled pod and secret
    assert deleted == ["Namespace tb-tbdead", "Pod team-a/c1", "Secret team-a/c1"]
    assert done == ["namespace tb-tbdead", "pod team-a/c1", "secret team-a/c1"]
    assert kept == ["run label tblive: the run is still running on this machine; left alone"]
    deleted, _, kept = run(only={"tbold"})  # clean RUN_ID: that run's objects only
    assert deleted == ["Pod team-a/c1", "Secret team-a/c1"] and kept == []
    deleted, _, _ = run()  # --force, or no live run here: every run's
    assert deleted[:2] == ["Namespace tb-tbdead", "Namespace tb-tblive"] and len(deleted) == 4


def test_a_kept_client_image_made_from_other_inputs_is_made_again(tmp_path, monkeypatch) -> None:
    from tunnelbench.kube import fleetimage

    monkeypatch.setattr(fleetimage.build, "images_dir", lambda: tmp_path)
    monkeypatch.setattr(fleetimage, "inputs_key", lambda: "sha256:now")
    (tmp_path / "fleet.tar").write_bytes(b"an archive")
    built: list[str] = []

    def build_tbcall(out):  # type: ignore[no-untyped-def]
        built.append(str(out))
        raise fleetimage.InstallError("built again")

    monkeypatch.setattr(fleetimage, "build_tbcall", build_tbcall)
    (tmp_path / "fleet.json").write_text(json.dumps({"manifest": "sha256:kept", "inputs": "sha256:now"}))
    assert fleetimage.ensure_image() == (tmp_path / "fleet.tar", "sha256:kept") and built == []
    for kept in ({"manifest": "sha256:kept", "inputs": "sha256:before"}, {"manifest": "sha256:kept"}):
        (tmp_path / "fleet.json").write_text(
            json.dumps(kept)
        )  # an edited tbcall, or a record from before keys
        with pytest.raises(fleetimage.InstallError, match="built again"):
            fleetimage.ensure_image()
    assert len(built) == 2


def test_the_image_key_follows_the_request_loops_source(tmp_path, monkeypatch) -> None:
    from tunnelbench.kube import fleetimage

    src = tmp_path / "main.go"
    src.write_text("package main\n")
    monkeypatch.setattr(fleetimage, "TBCALL_SRC", src)
    monkeypatch.setattr(fleetimage, "find_binary", lambda name, installs: None)
    one = fleetimage.inputs_key()
    src.write_text("package main // edited\n")
    assert fleetimage.inputs_key() != one


class _Pods:
    """The API's view of a fleet after its window: pod phases and logs."""

    def __init__(self, phases: dict[str, str], logs: dict[str, str]) -> None:
        self.phases, self.logs, self.log_reads = phases, logs, 0

    def pods(self, namespace, tag_label):  # type: ignore[no-untyped-def]
        return [{"metadata": {"name": k}, "status": {"phase": v}} for k, v in self.phases.items()]

    def log(self, namespace, name):  # type: ignore[no-untyped-def]
        self.log_reads += 1
        return self.logs[name]


def test_after_the_window_pods_still_at_the_barrier_are_not_waited_for(monkeypatch) -> None:
    from tunnelbench.kube import fleetrun

    monkeypatch.setattr(fleetrun, "SETTLE_S", 0.0)
    monkeypatch.setattr(fleetrun.time, "sleep", lambda s: None)
    loop = fleet.CallLoop("10.1.0.2", 8082, 3, 0.25, 1.0, 0.0)
    started = '{"ev":"go","t0":1.0}\n'
    api = _Pods({"c0": "Succeeded", "c1": "Running", "c2": "Running"}, {"c1": "", "c2": ""})
    w = fleetrun.Where(api, "tbtest", "img")  # type: ignore[arg-type]
    assert len(fleetrun._wait_finished(w, "ns", 3, loop)) == 3  # c1, c2 never started: not waited for
    # a pod that started its window and still calls is waited for, up to the limit, then named
    api = _Pods({"c0": "Succeeded", "c1": "Running", "c2": "Running"}, {"c1": started, "c2": ""})
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(fleetrun.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(FleetError, match=r"still running .* \['c1', 'c2'\]"):
        fleetrun._wait_finished(fleetrun.Where(api, "tbtest", "img"), "ns", 3, loop)  # type: ignore[arg-type]
