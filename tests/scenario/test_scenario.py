from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tb

from tunnelbench.scenario import ScenarioError, load_scenario, parse_scenario

MIN = {"workloads": [{"name": "ping"}]}


def err_of(data: dict) -> str:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data)
    return str(e.value)


def test_default_scenario_is_valid_and_complete():
    sc, text = load_scenario()
    assert sc.vpns == ["internal", "wireguard-go", "nebula", "tinc", "openvpn"]
    # 5 VPNs = 10 pairs per metric: Holm needs a best p under 0.005, which 5 vs 5 (0.0079) cannot give
    assert sc.run.repetitions >= 6 and sc.run.order == "interleaved"
    labels = [w.build().label() for w in sc.workloads]
    assert labels == ["tcp", "udp-ceiling", "ping", "connect"]
    assert "[[workloads]]" in text


def test_unknown_vpn_lists_allowed_values():
    msg = err_of({**MIN, "vpns": ["internal", "wiregurd"]})
    assert "vpns" in msg and "'wiregurd'" in msg and "wireguard-go" in msg and "allowed" in msg


def test_negative_duration_names_the_field():
    msg = err_of({"workloads": [{"name": "ping"}, {"name": "tcp", "duration_s": -5}]})
    assert "workloads[1].duration_s" in msg and "greater than or equal to 1" in msg and "-5" in msg


def test_typo_in_key_suggests_the_right_one():
    msg = err_of({**MIN, "run": {"repetitons": 3}})
    assert "run.repetitons" in msg and "did you mean 'repetitions'" in msg


def test_typo_in_workload_parameter():
    msg = err_of({"workloads": [{"name": "tcp", "duraton_s": 5}]})
    assert "workloads[0].duraton_s" in msg and "'duration_s'" in msg


def test_unknown_workload_and_profile():
    assert "unknown workload 'tpc'" in err_of({"workloads": [{"name": "tpc"}]})
    assert "unknown profile 'lossy'" in err_of({**MIN, "profiles": ["lossy"]})


def test_placement_must_name_existing_distinct_hosts():
    assert "server must be one of h1, h2" in err_of({**MIN, "lab": {"hosts": 2, "server": "h3"}})
    assert "different hosts" in err_of({**MIN, "lab": {"client": "h2", "server": "h2"}})


def test_hosts_per_vpn_keeps_client_and_server_and_names_the_vpn():
    sc = parse_scenario(
        {
            **MIN,
            "vpns": ["wireguard-go", "nebula@1.9.0"],
            "lab": {"hosts": 5, "hosts_per_vpn": {"wireguard-go": 3, "nebula": 4}},
        }
    )
    assert (sc.mesh_hosts("wireguard-go"), sc.mesh_hosts("nebula@1.9.0"), sc.mesh_hosts("internal")) == (
        3,
        4,
        5,
    )
    msg = err_of({**MIN, "lab": {"hosts": 4, "server": "h3", "hosts_per_vpn": {"nebula": 2}}})
    assert "hosts_per_vpn.nebula: 2 is not between 3" in msg and "server h3" in msg
    assert "and lab.hosts = 4" in err_of({**MIN, "lab": {"hosts": 4, "hosts_per_vpn": {"nebula": 5}}})
    assert "lab.hosts_per_vpn: unknown VPN 'nebulla'" in err_of(
        {**MIN, "lab": {"hosts": 4, "hosts_per_vpn": {"nebulla": 3}}}
    )
    assert 'only used with path = "direct"' in err_of(
        {**MIN, "lab": {"hosts": 4, "path": "relay", "hosts_per_vpn": {"nebula": 3}}}
    )


def test_profile_scoped_to_a_host_the_lab_does_not_have():
    edge = {"delay_ms": 10, "hosts": ["h4"]}
    msg = err_of({**MIN, "profiles": ["edge"], "lab": {"hosts": 3}, "impair": {"profiles": {"edge": edge}}})
    assert "impair.profiles.edge" in msg and "'h4'" in msg and "h1, h2, h3" in msg
    ok = parse_scenario(
        {**MIN, "profiles": ["edge"], "lab": {"hosts": 4}, "impair": {"profiles": {"edge": edge}}}
    )
    assert ok.profile("edge").hosts == ["h4"]


def test_bad_udp_bitrate_and_zero_repetitions():
    assert "workloads[0].bitrate" in err_of({"workloads": [{"name": "udp", "bitrate": "fast"}]})
    assert "run.repetitions" in err_of({**MIN, "run": {"repetitions": 0}})


def test_all_expands_to_every_driver():
    from tunnelbench.catalog import DRIVERS

    assert parse_scenario({**MIN, "vpns": ["all"]}).vpns == list(DRIVERS)


def test_bad_toml_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("vpns = [internal")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(p)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")


def test_builtin_scenarios_load_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here: the name is a built-in
    sc, _ = load_scenario("seeds")
    assert sc.name == "seeds" and sc.lab.hosts == 5
    sc, _ = load_scenario("many-clients")
    assert sc.lab.topology == "star"
    with pytest.raises(ScenarioError) as e:
        load_scenario("seedz")
    assert "seeds" in str(e.value) and "many-clients" in str(e.value)  # the error lists the built-ins
    (tmp_path / "seeds").write_text('name = "mine"\n[[workloads]]\nname = "ping"\n')
    assert load_scenario("seeds")[0].name == "mine"  # a file of that name wins


def test_every_builtin_scenario_loads_and_names_itself(tmp_path, monkeypatch):
    """Each scenario file shipped in the package parses, validates and carries its own name (a suite is
    checked by its parts); quic-rr carries the seeds' quic and rr parameters."""
    from importlib import resources

    from tunnelbench.scenario import builtin_scenarios

    monkeypatch.chdir(tmp_path)
    folder = resources.files("tunnelbench").joinpath("scenarios")
    shipped = sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))
    assert sorted(builtin_scenarios()) == shipped and "quic-rr" in shipped
    for name in shipped:
        if name == "security":  # a suite
            continue
        assert load_scenario(name)[0].name == name

    def built(name: str) -> list[str]:
        wls = [w.build() for w in load_scenario(name)[0].workloads if w.name in ("quic", "rr")]
        return sorted(w.label() + repr(w.params) for w in wls)

    assert built("quic-rr") == built("seeds") and len(built("quic-rr")) == 5


def test_fractional_iperf3_seconds_are_refused():
    """iperf3 -t and -O take whole seconds: 0.5 became 0, which iperf3 reads as "run forever"."""
    from tunnelbench.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.duration_s"):
        parse_scenario({"workloads": [{"name": "tcp", "duration_s": 0.5}]})
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.omit_s"):
        parse_scenario({"workloads": [{"name": "tcp", "omit_s": 1.5}]})
    assert (
        parse_scenario({"workloads": [{"name": "udp", "duration_s": 3}]})
        .build_workloads()[0]
        .params.duration_s
        == 3
    )


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
def test_cli_prints_bracketed_text_verbatim(tmp_path):
    """Rich markup must not eat user-facing text: the unknown-profile hint names [impair.profiles.NAME]."""

    f = tmp_path / "s.toml"
    f.write_text('vpns = ["internal"]\nprofiles = ["nosuch[x]"]\n[[workloads]]\nname = "ping"\n')
    r = tb("run", str(f), timeout=60)
    assert r.returncode != 0
    out = " ".join((r.stdout + r.stderr).split())  # the console wraps long lines
    assert "[impair.profiles.NAME]" in out and "'nosuch[x]'" in out, out


def test_command_line_overrides_apply_to_the_scenario_and_are_named_in_its_text(tmp_path):
    """`run`'s overrides (kept in run.overrides for a resume): each one lands in its field, and the scenario
    text as run starts with a line naming them in a fixed order."""
    from tunnelbench.scenario import override_note, with_overrides

    text = 'name = "o"\nvpns = ["internal"]\n[run]\nrepetitions = 2\n[[workloads]]\nname = "ping"\n'
    plain = with_overrides(text, {}, "t")
    assert (plain.vpns, plain.run.repetitions, plain.run.flamegraph, plain.lab.backend) == (
        ["internal"],
        2,
        False,
        "netns",
    )
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    peers:\n      hosts:\n        a:\n        b:\n")
    sc = with_overrides(
        text,
        {"vpns": ["internal", "wireguard-go"], "repetitions": 5, "profiles": ["low"], "flamegraph": True,
         "capture": "always", "inventory": str(inv), "insecure": True},
        "t",
    )  # fmt: skip
    assert sc.vpns == ["internal", "wireguard-go"] and sc.run.repetitions == 5 and sc.profiles == ["low"]
    assert sc.run.flamegraph is True and sc.run.capture == "always"
    assert (sc.lab.backend, str(sc.lab.inventory), sc.lab.insecure_no_host_key_check) == (
        "ssh",
        str(inv),
        True,
    )
    assert override_note(text, (), None, ()) == "# command-line overrides:\n" + text
    assert override_note(text, ("a", "b"), 4, ("low", "high"), flamegraph=True, capture="all") == (
        "# command-line overrides: --flamegraph --capture all --vpn a,b --profile low,high --repetitions 4\n"
        + text
    )


def test_an_unknown_key_is_named_with_its_path_the_closest_key_and_the_allowed_ones():
    from tunnelbench.scenario import RunCfg, ScenarioError, parse_scenario

    with pytest.raises(ScenarioError) as e:
        parse_scenario(
            {"vpns": ["internal"], "run": {"repetitons": 3}, "workloads": [{"name": "ping"}]}, "s.toml"
        )
    allowed = ", ".join(RunCfg.model_fields)
    assert str(e.value) == (
        f"s.toml: invalid scenario: run.repetitons: unknown key (did you mean 'repetitions'?); allowed keys here: "
        f"{allowed}"
    )
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"vpns": ["internal"], "run": {"zzzz": 3}}, "s.toml")
    assert f"run.zzzz: unknown key; allowed keys here: {allowed}" in str(e.value)  # nothing close: no guess


def test_reading_a_scenario_names_what_is_wrong_with_the_file(tmp_path):
    from importlib import resources

    from tunnelbench.scenario import ScenarioError, builtin_scenarios, load_scenario

    sc, text = load_scenario(None)
    assert text == resources.files("tunnelbench").joinpath("scenarios/default.toml").read_text()
    seeds, text = load_scenario(Path("seeds"))  # a bare built-in name, as `tunnelbench list` prints it
    assert text == resources.files("tunnelbench").joinpath("scenarios/seeds.toml").read_text()
    with pytest.raises(ScenarioError) as e:
        load_scenario(tmp_path / "nope.toml")
    assert str(e.value) == (
        f"cannot read scenario {tmp_path / 'nope.toml'}: No such file or directory (built-in scenarios: "
        f"{', '.join(builtin_scenarios())})"
    )
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario(latin)
    assert str(e.value) == f"{latin}: not UTF-8 text (byte 11 is 0xe9); save the scenario as UTF-8 text"
    suite = tmp_path / "suite.toml"
    suite.write_text('suite = ["a.toml", "b.toml"]\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario(suite)
    assert str(e.value) == (
        f"{suite} is a suite of 2 scenarios (a.toml, b.toml): `tunnelbench run` and `tunnelbench plan` take it; "
        "give one of its parts here"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text('vpns = ["internal"]\n[run]\nrepetitions = 0\n')
    with pytest.raises(ScenarioError, match=rf"^{bad}: invalid scenario\n  run.repetitions"):
        load_scenario(bad)


def test_overrides_on_a_scenario_without_run_or_lab_tables():
    from tunnelbench.scenario import with_overrides

    text = 'vpns = ["internal"]\n[[workloads]]\nname = "ping"\n'
    sc = with_overrides(text, {"repetitions": 4, "insecure": True, "flamegraph": True}, "t")
    assert (sc.run.repetitions, sc.lab.insecure_no_host_key_check, sc.run.flamegraph) == (4, True, True)
    assert with_overrides(text, {"capture": "always"}, "t").run.capture == "always"
