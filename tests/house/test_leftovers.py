"""The session's leftover check (tests/leftovers.py) sees what a leaking test would leave."""

from __future__ import annotations

import subprocess

import pytest
from leftovers import lab_state, left_behind

from tunnelbench.lab.tags import new_tag


def test_left_behind_names_only_what_is_new():
    before = {"namespaces": {"tbaaaa-h1"}, "registrations": set()}
    after = {"namespaces": {"tbaaaa-h1", "tbbbbb-r"}, "registrations": {"20260101-000000-tbbbbb"}}
    assert left_behind(before, after) == {
        "namespaces": ["tbbbbb-r"],
        "registrations": ["20260101-000000-tbbbbb"],
    }
    assert left_behind(after, after) == {}


@pytest.mark.lab
def test_a_leaked_namespace_and_its_process_are_seen(lab_factory):
    lab_factory(2)  # the lab tools are here (skips with the reason otherwise)
    ns = f"{new_tag()}-leak"
    before = lab_state()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    p = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "30"])
    try:
        for _ in range(50):  # until ip has exec'd sleep inside the namespace
            left = left_behind(before, lab_state())
            if any("sleep 30" in x for x in left.get("processes in another network namespace", [])):
                break
            subprocess.run(["sleep", "0.05"])
        assert left["namespaces"] == [ns], left
        assert [x for x in left["processes in another network namespace"] if x.startswith(f"{p.pid}:")], left
    finally:
        p.kill()
        p.wait()
        subprocess.run(["ip", "netns", "del", ns], check=True)
    assert left_behind(before, lab_state()) == {}
