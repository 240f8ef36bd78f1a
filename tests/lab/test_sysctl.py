"""Host TCP stack knobs: [hosts] sysctl and named tunings in the scenario, lab/sysctl.py in the lab."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tunnelbench.lab import sysctl
from tunnelbench.scenario import ScenarioError, load_scenario, parse_scenario


def scenario(**kw):
    return parse_scenario({"workloads": [{"name": "tcp"}], **kw}, "t.toml")


# -- scenario ---------------------------------------------------------------------------------------
def test_non_network_sysctl_is_refused_at_load_with_the_key_named():
    with pytest.raises(ScenarioError) as e:
        scenario(hosts={"sysctl": {"net.ipv4.tcp_reordering": 10, "vm.swappiness": 10}})
    assert "hosts.sysctl: 'vm.swappiness': only network sysctls (net.*)" in str(e.value)
    assert "tcp_reordering" not in str(e.value)
    with pytest.raises(ScenarioError) as e:
        scenario(hosts={"tunings": {"fast": {"kernel.sched_autogroup_enabled": 0}}}, tunings=["fast"])
    assert "tuning 'fast': 'kernel.sched_autogroup_enabled': only network sysctls" in str(e.value)
    with pytest.raises(ScenarioError, match="not a sysctl name"):
        scenario(hosts={"sysctl": {"tcp_reordering": 10}})


def test_tunings_merge_on_top_of_hosts_sysctl():
    sc = scenario(
        hosts={
            "sysctl": {"net.ipv4.tcp_reordering": 10, "net.ipv4.tcp_sack": 1},
            "tunings": {
                "reorder-only": {"net.ipv4.tcp_reordering": 30, "net.ipv4.tcp_recovery": 0},
                "buffers": {
                    "net.ipv4.tcp_rmem": [4096, 131072, 8388608],
                    "net.ipv4.tcp_congestion_control": "cubic",
                },
            },
        },
        tunings=["default", "reorder-only", "buffers"],
    )
    assert sc.tunings == ["default", "reorder-only", "buffers"]
    assert sc.tuning("default") == {"net.ipv4.tcp_reordering": "10", "net.ipv4.tcp_sack": "1"}
    assert sc.tuning("reorder-only") == {
        "net.ipv4.tcp_reordering": "30",
        "net.ipv4.tcp_sack": "1",
        "net.ipv4.tcp_recovery": "0",
    }
    assert sc.tuning("buffers")["net.ipv4.tcp_rmem"] == "4096 131072 8388608"
    keys = sc.sysctl_keys()
    assert keys[: len(sysctl.RECORDED)] == list(sysctl.RECORDED)  # the fixed list first, then the rest
    assert set(keys) == set(sysctl.RECORDED)  # every key set here is already in the fixed list
    with pytest.raises(KeyError):
        sc.tuning("nope")


def test_default_tuning_and_unknown_tunings():
    sc = scenario()
    assert sc.tunings == ["default"] and sc.tuning("default") == {}
    with pytest.raises(ScenarioError, match="tunings: unknown tuning 'fast'; allowed: default"):
        scenario(tunings=["default", "fast"])
    with pytest.raises(ScenarioError, match='tuning "default" is built in'):
        scenario(hosts={"tunings": {"default": {"net.ipv4.tcp_sack": 0}}})
    with pytest.raises(ScenarioError, match="listed twice"):
        scenario(tunings=["default", "default"])


def test_builtin_seed003_scenario():
    sc, text = load_scenario("seed003-sysctl")
    assert sc.vpns == ["internal", "wireguard-go"]
    assert sc.profiles == ["medium", "high"]
    assert sc.tunings == ["default", "reorder-only", "tailscale-style"]
    assert sc.run.repetitions == 5
    assert [
        (w.name, (w.model_extra or {}).get("streams", 1), w.model_extra["duration_s"]) for w in sc.workloads
    ] == [
        ("tcp", 1, 10),
        ("tcp", 4, 10),
    ]
    assert sc.tuning("default") == {}
    assert set(sc.tuning("reorder-only")) == {
        "net.ipv4.tcp_reordering",
        "net.ipv4.tcp_recovery",
        "net.ipv4.tcp_early_retrans",
    }
    assert sc.tuning("tailscale-style")["net.ipv4.tcp_recovery"] == "0"
    assert "NOT from the seed" in text  # the scenario says which values the seed does not give


# -- lab (root) ---------------------------------------------------------------------------------------
def _root_ns(key: str) -> str:
    return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.lab
def test_apply_sets_each_namespace_and_leaves_the_machine_alone(lab_factory):
    lab = lab_factory(2)
    key = "net.ipv4.tcp_reordering"
    machine_before = _root_ns(key)
    previous = sysctl.snapshot(lab.hosts, [key])
    assert previous == {"h1": {key: "3"}, "h2": {key: "3"}}  # a fresh namespace starts at the kernel default
    effective = sysctl.apply(lab.hosts, {key: "10"})
    assert effective == {"h1": {key: "10"}, "h2": {key: "10"}}
    for h in lab.hosts:  # the independent reference: sysctl(8) inside each namespace
        assert h.run(["sysctl", "-n", key]).stdout.strip() == "10"
    assert _root_ns(key) == machine_before
    sysctl.restore(lab.hosts, previous)
    for h in lab.hosts:
        assert h.run(["sysctl", "-n", key]).stdout.strip() == "3"


@pytest.mark.lab
def test_multi_value_sysctls_and_the_recorded_list(lab_factory):
    lab = lab_factory(2)
    sysctl.apply(lab.hosts, {"net.ipv4.tcp_rmem": "4096 1048576 8388608", "net.ipv4.tcp_recovery": "0"})
    snap = sysctl.snapshot(lab.hosts, sysctl.RECORDED)
    for h in lab.hosts:
        assert h.run(["sysctl", "-n", "net.ipv4.tcp_rmem"]).stdout.split() == ["4096", "1048576", "8388608"]
        assert snap[h.name]["net.ipv4.tcp_rmem"] == "4096 1048576 8388608"
        assert snap[h.name]["net.ipv4.tcp_recovery"] == "0"
        assert sysctl.MISSING not in snap[h.name].values(), snap[h.name]


@pytest.mark.lab
def test_unknown_and_global_sysctls_are_refused_before_anything_is_set(lab_factory):
    lab = lab_factory(2)
    with pytest.raises(sysctl.SysctlError) as e:
        sysctl.apply(lab.hosts, {"net.ipv4.tcp_reordering": "20", "net.ipv4.tcp_no_such_knob": "1"})
    assert "net.ipv4.tcp_no_such_knob: no such sysctl" in str(e.value)
    # net.core.rmem_max is global: visible but read-only in a child namespace
    with pytest.raises(sysctl.SysctlError) as e:
        sysctl.check(lab.hosts, ["net.core.rmem_max"])
    assert "net.core.rmem_max: read-only in the host's network namespace" in str(e.value)
    for h in lab.hosts:  # nothing was set
        assert h.run(["sysctl", "-n", "net.ipv4.tcp_reordering"]).stdout.strip() == "3"


@pytest.mark.lab
def test_congestion_control_outside_the_allowed_list_is_refused_up_front(lab_factory):
    lab = lab_factory(2)
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    outside = [c for c in available if c not in allowed]
    sysctl.check_values(lab.hosts, {"ok": {sysctl.CC_KEY: allowed[0]}})  # an allowed one passes
    if not outside:
        pytest.skip("every available congestion control is allowed on this machine")
    with pytest.raises(
        sysctl.SysctlError, match=rf"tuning 'x': net.ipv4.tcp_congestion_control = '{outside[0]}'"
    ):
        sysctl.check_values(lab.hosts, {"x": {sysctl.CC_KEY: outside[0]}})
    # and the kernel agrees: writing it inside a namespace fails
    r = lab.hosts[0].run(
        ["sh", "-c", f"printf {outside[0]} > /proc/sys/net/ipv4/tcp_congestion_control"], check=False
    )
    assert r.returncode != 0
