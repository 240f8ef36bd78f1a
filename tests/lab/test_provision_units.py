"""The install play's results as the table reads them, from events in ansible-runner's format written by hand
(the shapes Ansible's ok/failed/skipped/unreachable callbacks emit), no Ansible run: what was installed,
copied, replaced, already there, the host's own, missing, or never reached."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from tunnelbench.lab import provision
from tunnelbench.lab.provision import AptStep, CopyStep, KernelStep, _Item, _read_events, clock_row, plan_of

ARCH = "architecture and the builds already there"


def ev(kind: str, host: str, task: str, res: dict | None = None, duration: float | None = None) -> dict:
    data = {"host": host, "task": task, "res": res or {}}
    if duration is not None:
        data["duration"] = duration
    return {"event": kind, "event_data": data}


def test_plan_lists_each_package_once_and_each_build_with_its_checksum(tmp_path):
    (tmp_path / "nebula").write_bytes(b"nebula build")
    steps = [
        AptStep("tools", "apt iproute2 iperf3", ("iproute2", "iperf3")),
        AptStep("wireguard-go", "apt wireguard-tools iperf3", ("wireguard-tools", "iperf3")),
        CopyStep("nebula", "go nebula", ("nebula",), tmp_path),
        CopyStep("boringtun", "cargo boringtun", ("boringtun-cli",), None),
    ]
    host = type("H", (), {"vars": {"tunnelbench_bin_dir": "/opt/tb"}})()
    plan = plan_of(host, steps)
    assert plan["packages"] == ["iproute2", "iperf3", "wireguard-tools"]
    pinned = [AptStep("tools", "apt iperf3 nginx", ("iperf3", "nginx"), ("3.12-1+deb12u1", "")),
              AptStep("x", "apt iperf3", ("iperf3",), ("9.9-9",))]  # fmt: skip
    assert plan_of(host, pinned)["packages"] == ["iperf3=3.12-1+deb12u1", "nginx"]  # the first pin stands
    sha = "262f4950416616e3ada666be5291ac90a6a9cefce3e79e8648180691af8c5cce"  # printf "nebula build" | sha256sum
    assert plan["builds"] == [
        {"i": 2, "bin": "nebula", "bin_dir": "/opt/tb", "src": str(tmp_path / "nebula"), "dest": "/opt/tb/nebula",
         "sha256": sha}
    ]  # fmt: skip
    assert plan["own"] == [{"i": 3, "bin": "boringtun-cli", "bin_dir": "/opt/tb"}]


def test_events_become_one_row_per_step_and_host():
    local = Path("/cache/go")
    steps = [
        AptStep("tools", "apt iproute2 iperf3", ("iproute2", "iperf3")),
        CopyStep("nebula", "go nebula", ("nebula", "nebula-cert"), local),
        CopyStep("boringtun", "cargo boringtun", ("boringtun-cli",), None),
    ]
    items = {h: [_Item(h, s) for s in steps] for h in ("h1", "h2", "h3")}
    nebula = {"i": 1, "bin": "nebula", "dest": "/usr/local/bin/nebula"}
    cert = {"i": 1, "bin": "nebula-cert", "dest": "/usr/local/bin/nebula-cert"}
    events = [
        # h1: iperf3 installed, nebula replaced (a different file was there), nebula-cert equal (skipped)
        ev("runner_on_ok", "h1", ARCH, {"stdout": "x86_64\nabc  /usr/local/bin/nebula"}, 0.5),
        ev("runner_on_ok", "h1", "debian packages", {"changed": True, "stdout": "TB-INSTALLED iperf3"}, 2.0),
        ev("runner_item_on_ok", "h1", "registry builds", {"changed": True, "item": nebula}),
        ev("runner_item_on_skipped", "h1", "registry builds", {"item": cert}),
        ev("runner_on_ok", "h1", "registry builds", {"results": [{}, {}]}, 1.5),
        ev(
            "runner_on_ok",
            "h1",
            "the host's own builds",
            {"stdout": "TB 2 boringtun-cli /usr/bin/boringtun-cli"},
            0.3,
        ),  # fmt: skip
        # h2: apt fails, the copy fails, boringtun is nowhere
        ev("runner_on_ok", "h2", ARCH, {"stdout": "x86_64"}),
        ev("runner_on_failed", "h2", "debian packages", {"stderr": "E: Unable to locate package iperf3\n"}),
        ev(
            "runner_item_on_failed",
            "h2",
            "registry builds",
            {"item": nebula, "msg": "Destination not writable"},
        ),
        ev("runner_item_on_ok", "h2", "registry builds", {"changed": False, "item": cert}),
        ev("runner_on_ok", "h2", "the host's own builds", {"stdout": "TB 2 boringtun-cli -"}),
        # h3: its python is broken: the first task fails and nothing else runs there
        ev("runner_on_failed", "h3", ARCH, {"module_stdout": "pyenv: python3.13: command not found\r\n"}),
    ]
    unreachable: dict[str, str] = {}
    seconds = dict.fromkeys(items, 0.0)
    host_error: dict[str, str] = {}
    _read_events(events, items, unreachable, seconds, host_error)
    rows = {
        (h, it.step.what): it.result("/usr/local/bin", host_error.get(h)) for h in items for it in items[h]
    }
    assert (rows["h1", "tools"].status, rows["h1", "tools"].detail) == ("installed", "apt iperf3")
    assert rows["h1", "nebula"].status == "copied"
    assert rows["h1", "nebula"].detail == "nebula -> /usr/local/bin (replaced a different build: nebula)"
    assert (rows["h1", "boringtun"].status, rows["h1", "boringtun"].detail) == (
        "present", "/usr/bin/boringtun-cli (the host's own: not compared)")  # fmt: skip
    assert seconds["h1"] == pytest.approx(
        4.3
    )  # the tasks' durations on h1 (a loop's items counted in its summary)
    assert (rows["h2", "tools"].status, rows["h2", "tools"].detail) == (
        "failed", "E: Unable to locate package iperf3")  # fmt: skip
    assert rows["h2", "nebula"].detail == "nebula: Destination not writable"
    assert (
        rows["h2", "boringtun"].status == "failed"
        and "not in the local cache" in rows["h2", "boringtun"].detail
    )
    assert {r.status for (h, _), r in rows.items() if h == "h3"} == {"failed"}
    assert rows["h3", "tools"].detail == f"{ARCH}: pyenv: python3.13: command not found"


def test_an_unreachable_host_is_named_with_ansibles_reason():
    items = {"h1": [_Item("h1", AptStep("tools", "apt iproute2", ("iproute2",)))]}
    unreachable: dict[str, str] = {}
    _read_events(
        [ev("runner_on_unreachable", "h1", ARCH, {"msg": "Failed to connect to the host via ssh: refused"})],
        items, unreachable, {"h1": 0.0}, {},
    )  # fmt: skip
    assert unreachable == {"h1": "Failed to connect to the host via ssh: refused"}
    assert items["h1"][0].result("/usr/local/bin", None).status == "failed"  # never reported: not "present"


def test_kernel_features_and_the_clock():
    """The probe's own line format (lab/kernel.py: feature TAB ok, or the kernel's error), written by hand."""
    wg = KernelStep("wireguard", "kernel wireguard", ("wireguard",))
    gen = KernelStep("geneve", "kernel geneve", ("geneve",))
    items = {
        "h1": [_Item("h1", wg), _Item("h1", gen)],
        "h2": [_Item("h2", KernelStep("nebula", "kernel tun", ("tun",)))],
    }
    clocks: dict[str, list[str]] = {}
    probe_h1 = "TB-LOADED wireguard\ntun\tok\nwireguard\tok\ngeneve\tError: Unknown device type.\n"
    events = [
        ev("runner_on_ok", "h1", "kernel features", {"changed": True, "stdout": probe_h1}),
        ev("runner_on_ok", "h1", "clock", {"stdout": "no"}),
        ev("runner_on_ok", "h2", "kernel features", {"changed": False, "stdout": "tun\tok\n"}),
        ev("runner_on_ok", "h2", "clock", {"stdout": "chrony Normal"}),
    ]  # fmt: skip
    _read_events(events, items, {}, {"h1": 0.0, "h2": 0.0}, {}, clocks)
    got = [it.result("/usr/local/bin", None) for it in items["h1"]]
    assert (got[0].status, got[0].detail) == ("loaded", "wireguard work (loaded wireguard)")
    assert (got[1].status, got[1].detail) == ("failed", "GENEVE (module geneve): Error: Unknown device type.")
    h2 = items["h2"][0].result("/usr/local/bin", None)
    assert (h2.status, h2.detail) == (
        "present",
        "tun work",
    )  # built in here: no module loaded, the feature works
    assert clocks == {"h1": ["no"], "h2": ["chrony Normal"]}
    assert clock_row("h1", "no").status == "unsynced" and clock_row("h2", "chrony Normal").status == "present"
    assert clock_row("h3", "unknown").status == "present"  # nothing to say it is off: not a warning


def test_every_task_name_the_results_are_read_by_is_a_task_of_the_play():
    """provision.py reads results by task name: a task renamed in install.yml alone would be read as never run."""
    play = yaml.safe_load(provision.PLAYBOOK.read_text())
    names = {t["name"] for t in play[0]["tasks"]}
    read = {v for k, v in vars(provision).items() if k.startswith("T_")}
    assert len(read) == 6 and read <= names, read - names


def test_debian_packages_are_pinned_to_this_machines_versions_and_a_different_one_is_said():
    steps = [
        AptStep("tools", "apt iperf3 nginx fping", ("iperf3", "nginx", "fping"), ("3.12-1", "1.22-1", ""))
    ]
    items = {h: [_Item(h, s) for s in steps] for h in ("h1", "h2", "h3")}
    events = [
        # h1: iperf3 installed at the pin, nginx there at another version, fping (no pin) present
        ev("runner_on_ok", "h1", "debian packages", {"changed": True, "stdout":
           "TB-INSTALLED iperf3\nTB-PKG iperf3 3.12-1 3.12-1\nTB-PKG nginx 1.26-3 1.22-1\nTB-PKG fping 5.1-1 -"}),
        # h2: everything there at this machine's versions
        ev("runner_on_ok", "h2", "debian packages", {"stdout":
           "TB-PKG iperf3 3.12-1 3.12-1\nTB-PKG nginx 1.22-1 1.22-1\nTB-PKG fping 5.1-1 -"}),
        # h3: its release has no 1.22-1: installed at its candidate
        ev("runner_on_ok", "h3", "debian packages", {"changed": True, "stdout":
           "TB-INSTALLED nginx\nTB-PKG iperf3 3.12-1 3.12-1\nTB-PKG nginx 1.26-3 1.22-1\nTB-PKG fping 5.1-1 -"}),
    ]  # fmt: skip
    _read_events(events, items, {}, dict.fromkeys(items, 0.0), {})
    r = {h: items[h][0].result("/usr/local/bin", None) for h in items}
    assert (r["h1"].status, r["h1"].detail) == (
        "installed", "apt iperf3=3.12-1 (not this machine's version: nginx 1.26-3 here, 1.22-1 on this machine)")  # fmt: skip
    assert (r["h2"].status, r["h2"].detail) == ("present", "debian")  # fping has no pin here
    assert r["h3"].status == "installed" and r["h3"].detail.startswith("apt nginx=1.26-3 (not this machine's")
    one = {"h4": [_Item("h4", AptStep("tools", "apt nginx", ("nginx",), ("1.22-1",)))]}
    _read_events([ev("runner_on_ok", "h4", "debian packages", {"stdout": "TB-PKG nginx 1.26-3 1.22-1"})],
                 one, {}, {"h4": 0.0}, {})  # fmt: skip
    got = one["h4"][0].result("/usr/local/bin", None)
    assert got.status == "differs" and got.detail.startswith(
        "nginx 1.26-3 here, 1.22-1 on this machine: left"
    )


STUBS = {  # dpkg-query, apt-cache and apt-get over a folder of "installed" packages (name -> version files)
    "dpkg-query": """#!/bin/sh
eval p=\\${$#}; f="$TB_DEBS/$p"
[ -f "$f" ] || exit 1
case "$*" in *Status*) echo "install ok installed";; *) cat "$f";; esac
""",
    "apt-cache": """#!/bin/sh
[ "$1" = madison ] || exit 1
grep -h "^$2 " "$TB_REPO" | while read -r n v; do echo " $n | $v | http://deb.example bookworm/main amd64 Packages"; done
""",
    "apt-get": """#!/bin/sh
echo "apt-get $*" >> "$TB_APTLOG"
for a; do case "$a" in -*|install) ;; *=*) echo "${a#*=}" > "$TB_DEBS/${a%%=*}";;
  *) grep -h "^$a " "$TB_REPO" | tail -1 | cut -d' ' -f2 > "$TB_DEBS/$a";; esac; done
""",
}


def test_the_packages_task_installs_the_pin_when_the_sources_have_it(tmp_path):
    """The play's own shell, rendered as Ansible renders it, over stub dpkg-query/apt-cache/apt-get with
    known state: a missing package whose pin the sources list gets NAME=VERSION, one whose pin they lack the
    candidate, one already there is left alone; the version lines say what the host has after."""
    task = next(
        t for t in yaml.safe_load(provision.PLAYBOOK.read_text())[0]["tasks"] if t["name"] == provision.T_APT
    )
    env = jinja2.Environment()
    env.filters["quote"] = shlex.quote
    plan = {"packages": ["iperf3=3.12-1", "nginx=1.22-1", "fping=5.1-1", "tcpdump"]}
    script = env.from_string(task["ansible.builtin.shell"]).render(plan=plan)
    bins, debs = tmp_path / "bin", tmp_path / "debs"
    bins.mkdir(), debs.mkdir()
    for name, text in STUBS.items():
        (bins / name).write_text(text)
        (bins / name).chmod(0o755)
    (debs / "fping").write_text("5.0-9\n")  # there already, at another version
    (tmp_path / "repo").write_text("iperf3 3.11-2\niperf3 3.12-1\nnginx 1.26-3\ntcpdump 4.99-1\n")
    envv = {**os.environ, "PATH": f"{bins}:/usr/bin:/bin", "TB_DEBS": str(debs), "TB_REPO": str(tmp_path / "repo"),
            "TB_APTLOG": str(tmp_path / "apt.log")}  # fmt: skip
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=envv, timeout=30)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "apt.log").read_text().split("--no-install-recommends")[1].split() == [
        "iperf3=3.12-1", "nginx", "tcpdump"]  # fmt: skip
    assert out.stdout.splitlines() == [
        "TB-INSTALLED iperf3 nginx tcpdump",
        "TB-PKG iperf3 3.12-1 3.12-1",
        "TB-PKG nginx 1.26-3 1.22-1",
        "TB-PKG fping 5.0-9 5.1-1",
        "TB-PKG tcpdump 4.99-1 -",
    ]
    again = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=envv, timeout=30)
    assert "TB-INSTALLED" not in again.stdout and (tmp_path / "apt.log").read_text().count("apt-get") == 1
