"""Bad input gets one clear error, never a traceback (issue 31). Hypothesis generates malformed scenario and
inventory data and raw file bytes; the invariant is that the parser either accepts the input or raises its
own error type (ScenarioError, InventoryError: the CLI turns those into exit 2 with the message), and that
any name it accepts for something that becomes a folder is a plain name. The inputs that gave tracebacks on
2026-11-26 are replayed through the CLI: exit 2, the field or file named, no traceback."""

from __future__ import annotations

import contextlib
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
from conftest import tb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunnelbench.lab import inventory as inv_mod
from tunnelbench.lab.inventory import InventoryError, parse_inventory
from tunnelbench.scenario import PLAIN_NAME, ScenarioError, load_scenario, parse_scenario

# values a user could type into TOML or YAML: the wrong type, out of range, odd strings, nesting
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["../x", "0-", "a/b", "", " ", "internal", "baseline", "tcp", "ping", "1e9", "-1", "h1"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

SCENARIO_KEYS = ["name", "vpns", "profiles", "run", "lab", "fairness", "impair", "cpu", "workloads", "hosts"]
RUN_KEYS = ["repetitions", "retries", "order", "seed", "case_timeout_s", "capture", "flamegraph"]
LAB_KEYS = ["hosts", "path", "topology", "client", "server", "backend", "hosts_per_vpn"]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid skeletons with one or more fields replaced by anything: the parser must reach deep."""
    data: dict[str, Any] = {
        "name": "fuzz",
        "vpns": ["internal"],
        "workloads": [
            {"name": draw(st.sampled_from(["tcp", "ping", "udp_ceiling", "connect", "quic", "nope"]))}
        ],
    }
    if draw(st.booleans()):
        data["workloads"][0].update(
            draw(
                st.dictionaries(
                    st.sampled_from(["duration_s", "streams", "count", "bitrate", "label"]),
                    values,
                    max_size=2,
                )
            )
        )
    for key in draw(st.lists(st.sampled_from(SCENARIO_KEYS), max_size=3)):
        data[key] = draw(values)
    if draw(st.booleans()):
        data["run"] = {k: draw(values) for k in draw(st.lists(st.sampled_from(RUN_KEYS), max_size=3))}
    if draw(st.booleans()):
        data["lab"] = {k: draw(values) for k in draw(st.lists(st.sampled_from(LAB_KEYS), max_size=3))}
    if draw(st.booleans()):
        name = draw(
            st.sampled_from(["../../tmp/x", "a/b", "ok-name", "..", "x" * 80, "é"]) | st.text(max_size=10)
        )
        data["impair"] = {"profiles": {name: {"delay_ms": draw(values)}}}
        data["profiles"] = [name]
    return data


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_malformed_scenario_is_a_scenario_error_and_accepted_names_are_plain(data):
    try:
        sc = parse_scenario(data, "fuzz.toml")
    except ScenarioError as e:
        assert str(e).startswith("fuzz.toml"), e  # names the file, then the field
        return
    for name in sc.impair.profiles:
        assert PLAIN_NAME.fullmatch(name) and ".." not in name, name


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_as_a_scenario_file_are_a_scenario_error(tmp_path_factory, raw):
    f = tmp_path_factory.mktemp("s") / "s.toml"
    f.write_bytes(raw)
    with contextlib.suppress(ScenarioError):
        load_scenario(f)


hostvars = st.dictionaries(
    st.sampled_from(["ansible_host", "ansible_port", "tunnelbench_underlay_ip", "tunnelbench_connect_timeout_s",
                     "tunnelbench_role", "tunnelbench_impair", "ansible_user"]),
    values,
    max_size=3,
)  # fmt: skip
groups = st.recursive(
    st.fixed_dictionaries({}, optional={"hosts": st.dictionaries(st.text(max_size=4), hostvars | st.none(), max_size=3) | values, "vars": hostvars | values}),
    lambda inner: st.fixed_dictionaries({}, optional={"children": st.dictionaries(st.sampled_from(["peers", "router", "x"]), inner, max_size=2) | values}),
    max_leaves=6,
)  # fmt: skip


@pytest.mark.slow  # 2-4 s (a CLI or report in a subprocess, or a timed wait): the lab lane runs it
@settings(max_examples=400, deadline=None)
@given(st.one_of(groups.map(lambda g: {"all": g}), values))
def test_a_malformed_inventory_is_an_inventory_error(monkeypatch_module, data):
    try:
        parse_inventory(data, "fuzz.yml")
    except InventoryError as e:
        assert str(e).startswith(("fuzz.yml", "cannot resolve")), e


@pytest.fixture(scope="module")
def monkeypatch_module():
    """No name lookups: a generated ansible_host must not reach a resolver (the lab's traffic rule)."""
    mp = pytest.MonkeyPatch()

    def no_dns(address: str, at: str) -> str:
        raise InventoryError(f"cannot resolve {address!r} ({at}): no lookups in this test")

    mp.setattr(inv_mod, "_resolve", no_dns)
    yield mp
    mp.undo()


# the inputs that gave a traceback on 2026-11-26, through the CLI as a user types them
INVENTORY_HOSTS_LIST = "all:\n  hosts:\n    - a\n    - b\n"
INVENTORY_TIMEOUT = (
    "all:\n  children:\n    peers:\n      hosts:\n"
    "        a: {tunnelbench_underlay_ip: 192.0.2.1, tunnelbench_connect_timeout_s: soon}\n"
    "        b: {tunnelbench_underlay_ip: 192.0.2.2}\n"
)
TRAVERSAL = (
    'name = "t"\nvpns = ["internal"]\nprofiles = ["../../../tmp/x"]\n'
    '[impair.profiles."../../../tmp/x"]\ndelay_ms = 1\n[[workloads]]\nname = "ping"\n'
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, argv, said",
    [
        ("not-utf8", ["plan", "{f}"], "not UTF-8 text (byte 0 is 0xff)"),
        ("not-utf8", ["run", "{f}"], "not UTF-8 text (byte 0 is 0xff)"),
        ("results-root", ["report", "{d}"], "is a results folder, not a run"),
        ("hosts-list", ["doctor", "--inventory", "{f}"], 'Invalid "hosts" entry for "all" group, requires a dictionary, found a list'),
        ("timeout", ["doctor", "--inventory", "{f}"], "tunnelbench_connect_timeout_s must be a number of seconds"),
        ("traversal", ["plan", "{f}"], "profile name '../../../tmp/x': use a plain name"),
    ],
)  # fmt: skip
def test_the_inputs_that_gave_tracebacks_are_one_line_errors(tmp_path, case, argv, said):
    f = tmp_path / "input"
    d = tmp_path / "results"
    (d / "20260101-000000-tbaaaaaa").mkdir(parents=True)
    (d / "20260101-000000-tbaaaaaa" / "results.sqlite").write_bytes(b"")
    f.write_bytes(
        {
            "not-utf8": b"\xff\xfe",
            "hosts-list": INVENTORY_HOSTS_LIST.encode(),
            "timeout": INVENTORY_TIMEOUT.encode(),
            "traversal": TRAVERSAL.encode(),
            "results-root": b"",
        }[case]
    )
    res = tb(*[a.format(f=f, d=d) for a in argv], env={"TUNNELBENCH_RESULTS": str(tmp_path / "r")})
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert said in out and "Traceback" not in out, out
    assert not (tmp_path / "r").exists() and not Path("/tmp/x").exists()  # nothing written


def test_a_plain_name_is_accepted_and_used():
    sc = parse_scenario(tomllib.loads(TRAVERSAL.replace("../../../tmp/x", "edge-1.5")))
    assert list(sc.impair.profiles) == ["edge-1.5"]


# options that took a value the command could not use, found only after the work (2026-11-26): each is now
# refused before the command does anything; `hold_lab` (the first thing a lab command does after its own
# checks) must not be reached
@pytest.mark.parametrize(
    "argv, said",
    [
        (["run", "-n", "0"], "Invalid value for '--repetitions' / '-n': 0 is not in the range 1<=x<=10000"),
        (["plan", "-n", "0"], "Invalid value for '--repetitions' / '-n': 0 is not in the range 1<=x<=10000"),
        (["calibrate", "--probes", "0"], "Invalid value for '--probes': 0 is not in the range 100<=x<=1000000"),
        (["bench-engine", "--rounds", "0"], "Invalid value for '--rounds': 0 is not in the range 1<=x<=100"),
        (["bench-engine", "--seconds", "0"], "Invalid value for '--seconds': 0.0 is not in the range 1<=x<=600"),
        # NaN passed every range (each comparison with it is false), the infinities an open one (2026-11-28)
        (["compare", "a", "b", "--threshold", "nan"], "Invalid value for '--threshold': 'nan' is not a finite number in the range 0<=x<=1000"),
        (["compare", "a", "b", "--threshold", "-5"], "Invalid value for '--threshold': -5.0 is not in the range 0<=x<=1000"),
        (["history", "--threshold", "inf"], "Invalid value for '--threshold': 'inf' is not a finite number in the range 0<=x<=1000"),
        (["bench-engine", "--seconds", "nan"], "Invalid value for '--seconds': 'nan' is not a finite number in the range 1<=x<=600"),
        (["bench-engine", "--seconds", "1e999"], "Invalid value for '--seconds': 1e999 is not a finite number in the range 1<=x<=600"),
        (["mesh-scale", "--vpn", "nebula", "--idle-s", "nan"], "Invalid value for '--idle-s': 'nan' is not a finite number in the range 1<=x<=600"),
        (["mesh-scale", "--vpn", "nebula", "--sizes", "١٠,٢٠"], "--sizes: comma-separated host counts"),
        (["run", "-n", "١٠"], "Invalid value for '--repetitions' / '-n': '١٠' is not an integer in the range 1<=x<=10000"),
        (["up", "--hosts", "100000"], "Invalid value for '--hosts': 100000 is not in the range 2<=x<=1023"),
        (["calibrate", "--json", "{gone}/c.json"], "Invalid value for '--json': the folder '{gone}' does not exist"),
        (["compare", "a", "b", "--json", "{gone}/c.json"], "Invalid value for '--json': the folder '{gone}' does not exist"),
        (["export", "--out", "{gone}/m.csv"], "Invalid value for '--out': the folder '{gone}' does not exist"),
    ],
)  # fmt: skip
def test_an_option_value_the_command_cannot_use_is_refused_before_any_work(tmp_path, monkeypatch, argv, said):
    from click.testing import CliRunner

    from tunnelbench.cli import app

    def no_lab(what: str) -> None:
        raise AssertionError(f"{what} reached the lab")

    for verbs in (app.run, app.lab):  # the verb modules that build labs
        monkeypatch.setattr(verbs, "hold_lab", no_lab)
    monkeypatch.setattr(app.lab, "need_root", lambda: None)  # the checks come first for any user
    gone = tmp_path / "missing"
    res = CliRunner().invoke(app.main, [a.format(gone=gone) for a in argv])
    assert res.exit_code == 2, res.output
    assert said.format(gone=gone) in " ".join(res.output.split()), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert not gone.exists()


@pytest.mark.parametrize(
    "cpu, said",
    [
        ('engine_cpus = "0-"', "cpu.engine_cpus: '0-' is not a CPU list"),
        ('sut_cpus = "1,,2"', "cpu.sut_cpus: '1,,2' is not a CPU list"),
        ('sut_cpus = "3-1"', "cpu.sut_cpus: '3-1': the range 3-1 runs backwards; write 1-3"),
    ],
)
def test_a_cpu_list_that_taskset_cannot_read_names_the_field(cpu, said):
    text = f'vpns = ["internal"]\n[cpu]\n{cpu}\n[[workloads]]\nname = "ping"\n'
    with pytest.raises(ScenarioError) as e:
        parse_scenario(tomllib.loads(text))
    assert said in str(e.value)
    assert parse_scenario(
        tomllib.loads(text.replace(cpu, 'engine_cpus = "1"\nsut_cpus = "0,2-3"'))
    ).cpu.sut_cpus


def test_path_nat_refuses_more_hosts_than_its_lan_addresses_hold():
    text = 'vpns = ["internal"]\n[lab]\nhosts = {n}\npath = "nat"\n[[workloads]]\nname = "ping"\n'
    with pytest.raises(ScenarioError) as e:
        parse_scenario(tomllib.loads(text.format(n=257)))
    assert 'lab: hosts: 257 with path = "nat"' in str(e.value) and "hosts <= 256" in str(e.value)
    assert parse_scenario(tomllib.loads(text.format(n=256))).lab.hosts == 256


def test_every_numeric_option_of_every_verb_is_a_finite_ranged_number():
    """One type for them all (cli/common.py Number): a plain int or float, or click's ranges (which NaN
    passes), on any verb's option is named here."""
    from tunnelbench.cli import app
    from tunnelbench.cli.common import Number

    numeric = [
        f"{name} {p.opts[0]}"
        for name, cmd in app.main.commands.items()
        for p in cmd.params
        if isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)
    ]
    loose = [
        f"{name} {p.opts[0]}"
        for name, cmd in app.main.commands.items()
        for p in cmd.params
        if isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)
        and not isinstance(p.type, Number)
    ]
    assert len(numeric) >= 9 and loose == [], loose
