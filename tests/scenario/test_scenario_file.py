"""A scenario path can name anything: only a regular file is read, at most 1 MiB of it (core/userfile.py),
and the error says what the path is instead. The FIFO test would hang before (an open waits for a writer),
/dev/zero ran to a MemoryError after 1.7 GB."""

from __future__ import annotations

import os

import pytest

from tunnelbench.scenario import ScenarioError, load_scenario

VALID = 'vpns = ["internal"]\n[[workloads]]\nname = "ping"\n'


def test_a_scenario_of_exactly_1_mib_is_read_and_one_byte_more_is_refused(tmp_path):
    f = tmp_path / "s.toml"
    pad = (1 << 20) - len(VALID)
    f.write_text(VALID + "#" * (pad - 1) + "\n")
    assert f.stat().st_size == 1 << 20 and load_scenario(f)[0].vpns == ["internal"]
    f.write_text(VALID + "#" * pad + "\n")
    with pytest.raises(ScenarioError, match=r"scenario .*s\.toml is larger than 1 MiB"):
        load_scenario(f)


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: os.mkfifo(p), "is a named pipe (FIFO), not a regular file"),
        (lambda p: os.symlink("/dev/zero", p), "is a device, not a regular file"),
        (lambda p: p.mkdir(), "is a folder, not a regular file"),
    ],
    ids=["fifo", "dev-zero", "folder"],
)
def test_a_path_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path, make, said):
    f = tmp_path / "s.toml"
    make(f)
    with pytest.raises(ScenarioError) as e:
        load_scenario(f)
    assert str(e.value) == f"scenario {f} {said}: name the file itself"


def test_toml_nested_deeper_than_python_follows_is_named(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ScenarioError, match=r"s\.toml: nested too deeply"):
        load_scenario(f)
