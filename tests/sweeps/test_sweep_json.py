"""The sweeps' JSON artifacts (meshscale.py's mesh-scale.json, natmatrix.py's nat-matrix.json) are rewritten
after every point or cell so that an interrupted sweep keeps what it measured: a kill in the middle of a
rewrite must leave the earlier points whole. The kernel does the kill (RLIMIT_FSIZE: SIGXFSZ at the byte
limit) during the second rewrite; the lab is faked (drivers, cells and points made by hand), the JSON is real."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

SWEEP = """
import resource, signal, sys
from pathlib import Path
from types import SimpleNamespace
from tunnelbench.sweeps import meshscale as ms, natmatrix as nm

which, out = sys.argv[1], Path(sys.argv[2])


class FakeVpn:
    @classmethod
    def availability(cls):
        return SimpleNamespace(ok=True, version="1.0", reason="")


done = []


def measured(what):
    '''The first result fits; while the second is rewritten the kernel kills this process at the size of the
    first file plus 100 bytes (its padding makes the second file far longer).'''
    done.append(what)
    if len(done) == 2:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the kernel's default is to kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (out.stat().st_size + 100, resource.RLIM_INFINITY))
    return {**what, "seconds": 1, "why": "" if len(done) == 1 else "x" * 20_000}


if which == "nat-matrix":
    nm.DRIVERS = {"fakevpn": FakeVpn}
    nm.cell = lambda vpn, t1, t2, workdir: measured({"pair": f"{t1} x {t2}", "result": "direct", "direct_pct": 99.0})
    nm.run_matrix(["fakevpn"], [("full-cone", "full-cone"), ("symmetric", "symmetric")], Path("."), out,
                  record=False, progress=lambda s: None)
else:
    ms.DRIVERS = {"fakevpn": FakeVpn}
    ms.memory_bound = lambda last, n: None
    ms.per_node_mb = lambda p: 1.0
    ms.point = lambda vpn, n, workdir, idle_s: measured({"n": n, "result": "ok", "pairs": n * (n - 1), "ready_s": 1.0})
    ms.run_sweep(["fakevpn"], [3, 6], Path("."), out, idle_s=1.0, progress=lambda s: None)
"""


@pytest.mark.parametrize(
    "which, first",
    [
        ("nat-matrix", lambda doc: list(doc["vpns"]["fakevpn"]["cells"]) == ["full-cone x full-cone"]),
        ("mesh-scale", lambda doc: [p["n"] for p in doc["vpns"]["fakevpn"]["points"]] == [3]),
    ],
)
def test_a_kill_while_the_json_is_rewritten_keeps_the_earlier_results_whole(tmp_path, which, first):
    out = tmp_path / f"{which}.json"
    res = subprocess.run(
        [sys.executable, "-c", SWEEP, which, str(out)], capture_output=True, text=True, cwd=tmp_path
    )
    assert res.returncode == -signal.SIGXFSZ, res.stderr  # killed by the kernel, mid-write
    doc = json.loads(out.read_text())  # whole: the first result, as written before the kill
    assert first(doc), doc


@pytest.mark.parametrize("which", ["nat-matrix", "mesh-scale"])
def test_a_link_where_the_json_goes_is_refused_before_the_first_cell(tmp_path, which):
    from tunnelbench.core.files import FileRefused
    from tunnelbench.sweeps import meshscale as ms
    from tunnelbench.sweeps import natmatrix as nm

    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    out = tmp_path / f"{which}.json"
    out.symlink_to(outside)
    with pytest.raises(FileRefused, match="is a symbolic link"):
        if which == "nat-matrix":
            nm.run_matrix(["no-such-vpn"], [], tmp_path, out, record=False)  # a cell would raise KeyError
        else:
            ms.run_sweep(["no-such-vpn"], [3], tmp_path, out)
    assert outside.read_text() == "{}"
