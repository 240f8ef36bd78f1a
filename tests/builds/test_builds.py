"""The built tools on first use (builds.py): which a scenario needs, and the build path's bookkeeping, with a
hand-made build script standing in for scripts/build-tools.sh (the real one takes minutes); `plan` names
what a scenario will build. References: the scenarios' own workload lists, files the stand-in script wrote,
its exit status."""

from __future__ import annotations

import json
import os
import tomllib

import pytest
from conftest import ping_scenario, tb

from tunnelbench import builds
from tunnelbench.scenario import load_scenario, parse_scenario

SCEN = """
name = "b"
vpns = ["internal"]
[run]
flamegraph = {fg}
[[workloads]]
name = "{wl}"
"""


def sc(wl: str, fg: bool = False):
    return parse_scenario(tomllib.loads(SCEN.format(wl=wl, fg=str(fg).lower())))


def test_the_scenarios_needs():
    assert [b.name for b in builds.needed(sc("quic"))] == ["quicperf"]
    assert [b.name for b in builds.needed(sc("http_api"))] == ["hey"]
    assert [b.name for b in builds.needed(sc("tcp", fg=True))] == ["inferno"]
    assert builds.needed(sc("tcp")) == []
    default, _ = load_scenario(None)
    assert builds.needed(default) == []  # a bare scripts/bench builds none of them


IMPAIRED = """
name = "e"
vpns = ["internal"]
profiles = [{profiles}]
[impair]
backend = "{backend}"
[[workloads]]
name = "ping"
"""


@pytest.mark.parametrize(
    ("profile", "backend", "netem", "engine"),
    [
        ("loss-1", "auto", False, True),  # delay + loss on a kernel without netem: the engine
        ("loss-1", "auto", True, False),  # ... with netem: no engine
        ("loss-1", "native", True, True),  # asked for
        ("loss-1", "netem", False, False),  # netem asked for: the run says the kernel lacks it, no build
        ("baseline", "native", False, False),  # nothing impaired: never started
    ],
)
def test_the_engine_is_built_only_for_a_scenario_that_impairs_without_netem(
    profile, backend, netem, engine, monkeypatch
):
    monkeypatch.setattr(
        builds.kernel, "missing", lambda f: None if netem else "netem (module sch_netem): absent"
    )
    profiles = ", ".join(f'"{p}"' for p in dict.fromkeys(["baseline", profile]))
    s = parse_scenario(tomllib.loads(IMPAIRED.format(profiles=profiles, backend=backend)))
    assert builds.needs_engine(s) is engine
    assert ("impaird" in [b.name for b in builds.needed(s)]) is engine


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in build script that puts `quicperf` on a PATH folder of the test's own, or fails on demand."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = tmp_path / "build-tools.sh"
    script.write_text(
        f"""#!/bin/sh
[ -n "$FAIL" ] && {{ echo "cargo: no network" >&2; exit 101; }}
printf '#!/bin/sh\\necho quicperf 1\\n' > {bindir}/$1 && chmod +x {bindir}/$1
echo "built $1 1.0"
"""
    )
    monkeypatch.setattr(builds, "SCRIPT", script)
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return bindir


def test_a_build_puts_the_tool_in_place_and_records_its_time(fake, tmp_path, monkeypatch):
    qp = builds.BUILDS["quicperf"]
    monkeypatch.setenv("PATH", "/nonexistent")  # no quicperf anywhere yet
    assert builds.missing(sc("quic")) == [qp]
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    ok, seconds, detail = builds.build(qp, tmp_path / "logs" / "q.log")
    assert ok and detail == "built quicperf 1.0", detail
    assert (fake / "quicperf").is_file() and builds.missing(sc("quic")) == []
    rec = json.loads((tmp_path / "cache" / "builds.json").read_text())
    assert rec["quicperf"]["seconds"] == round(seconds, 1)
    assert builds.past_seconds() == {"quicperf": round(seconds, 1)}


def test_a_failed_build_says_why_and_records_nothing(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL", "1")
    ok, _, detail = builds.build(builds.BUILDS["hey"], tmp_path / "logs" / "h.log")
    assert not ok
    assert detail.startswith("exit 101: cargo: no network") and str(tmp_path / "logs" / "h.log") in detail
    assert not (tmp_path / "cache" / "builds.json").exists()


@pytest.mark.slow
def test_plan_names_what_it_will_build(tmp_path):
    (tmp_path / "s.toml").write_text(SCEN.format(wl="ping", fg="true"))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "builds.json").write_text(json.dumps({"inferno": {"seconds": 248.0}}))
    env = {"TUNNELBENCH_CACHE": str(cache), "PATH": os.environ["PATH"]}
    res = tb("plan", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), env=env)
    assert res.returncode == 0, res.stderr
    assert (
        "will build inferno first, for run.flamegraph (took 248 s here before; not in the total)"
        in res.stdout
    )


SCEN_VPN = ping_scenario("first-use", ["nebula@1.10.3"])


@pytest.mark.lab
@pytest.mark.long
def test_run_installs_a_vpn_build_on_first_use_and_not_again(tmp_path):
    """An empty install cache: the run installs nebula 1.10.3 from the Go module proxy (the one line of
    progress), measures it, exits 0; the second run finds it cached and says nothing of installing."""
    from conftest import lab_missing

    if lab_missing():
        pytest.skip(lab_missing())
    cache = tmp_path / "cache"
    (tmp_path / "s.toml").write_text(SCEN_VPN)
    env = {"TUNNELBENCH_CACHE": str(cache), "GOTOOLCHAIN": "go1.27.3"}
    plan = tb("plan", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), env=env)
    assert (
        "will install nebula@1.10.3 first: go github.com/slackhq/nebula@v1.10.3 (not built here yet"
        in plan.stdout
    )
    first = tb(
        "run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", env=env, timeout=900
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert (
        "installing nebula@1.10.3: go github.com/slackhq/nebula@v1.10.3 (first use on this machine)"
        in first.stderr
    )
    assert (cache / "nebula-1.10.3" / "bin" / "nebula").is_file()
    assert (
        json.loads((cache / "builds.json").read_text())["go github.com/slackhq/nebula@v1.10.3"]["seconds"] > 0
    )
    again = tb(
        "run", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), "--no-html", env=env, timeout=300
    )
    assert again.returncode == 0 and "installing" not in again.stderr, again.stderr[-2000:]
    plan = tb("plan", str(tmp_path / "s.toml"), "--results", str(tmp_path / "r"), env=env)
    assert "will install" not in plan.stdout


def test_first_use_installs_the_vpn_builds_side_by_side(tmp_path, monkeypatch):
    """The default's two Go builds run at once: each stand-in install waits at a two-party barrier, which only
    opens when both are running (one after the other, the first would time out there). Both times recorded
    in builds.json (one file, written from two threads), one line each, and the side-by-side total."""
    import io
    import threading

    from rich.console import Console

    from tunnelbench.vpns.install import GoModule, InstallResult

    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    srcs = [GoModule("x", "github.com/a/x", "v1.0.0", ("github.com/a/x",), ("x",)),
            GoModule("y", "github.com/b/y", "v2.0.0", ("github.com/b/y",), ("y",))]  # fmt: skip
    monkeypatch.setattr(builds, "vpn_installs", lambda _sc: [("x", srcs[0]), ("y", srcs[1])])
    monkeypatch.setattr(builds, "missing", lambda _sc: [])
    both = threading.Barrier(2, timeout=10)
    seen: list[str] = []

    def install_source(src, _log, force=False):
        both.wait()  # BrokenBarrierError when the other install is not running alongside
        seen.append(src.name)
        return InstallResult(src.label, "installed", 7.5 if src.name == "x" else 12.25, "bin")

    monkeypatch.setattr(builds, "install_source", install_source)
    buf = io.StringIO()
    builds.first_use(sc("ping"), Console(file=buf, width=300))
    out = buf.getvalue()
    assert sorted(seen) == ["x", "y"]
    assert "installed x (8 s): bin" in out and "installed y (12 s): bin" in out
    assert "2 VPN builds side by side:" in out
    rec = json.loads((tmp_path / "cache" / "builds.json").read_text())
    assert {k: v["seconds"] for k, v in rec.items()} == {
        "go github.com/a/x@v1.0.0": 7.5,
        "go github.com/b/y@v2.0.0": 12.2,
    }
