"""scripts/kernel-lane keeps what it writes in a private folder of its own (mktemp -d, 0700), removed when it
exits, never under a fixed name in /tmp that someone else could plant first (issue 42, finding 13).

The script runs for real, both halves (on the host, where a stub `python -m tunnelbench.lab.kernel` reports every
feature; and `--inside`, as in the VM), in a mount namespace whose /tmp is an empty folder of this test, whose
/etc/shadow is a copy (the inside half edits it), with stubs for pytest and modprobe. Reference: what that /tmp
holds after the script, and the arguments the stub pytest was given with what it saw of their folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tree import ROOT

pytestmark = [pytest.mark.root]

PYTEST_STUB = """#!/bin/sh
# the lane's pytest: records its arguments and, for --basetemp, the folder's mode and owner; makes the basetemp
# as pytest does
for a in "$@"; do
  case "$a" in --basetemp=*) b=${a#--basetemp=}; d=$(dirname "$b"); mkdir -p "$b"
    echo "basetemp $b $(stat -c '%a %u' "$d")" >>stub.log ;; esac
done
echo "args $*" >>stub.log
"""


def _lane(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path, str]:
    """Run a copy of scripts/kernel-lane (args) with /tmp an empty folder; returns its result, that folder
    and what the stub pytest recorded."""
    tree, fake_tmp = tmp_path / "tree", tmp_path / "tmp"
    (tree / "scripts").mkdir(parents=True)
    fake_tmp.mkdir()
    fake_tmp.chmod(0o1777)
    shutil.copy(ROOT / "scripts" / "kernel-lane", tree / "scripts" / "kernel-lane")
    stubs = {
        ".venv/bin/python": "#!/bin/sh\necho 'netem: yes'\n",  # `-m tunnelbench.lab.kernel`: every feature
        ".venv/bin/pytest": PYTEST_STUB,
        "bin/modprobe": "#!/bin/sh\nexit 0\n",
    }
    for rel, text in stubs.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
        (tree / rel).chmod(0o755)
    (tree / "shadow").write_text("root:!:19000:0:99999:7:::\ntbtest-shadow-copy:*:19000::::::\n")
    # the bind mounts first (their sources are under the real /tmp), then into the tree by its open cwd; the
    # script must not run if /etc/shadow is not the copy
    inner = (
        'set -e; mount --bind "$TREE/shadow" /etc/shadow; grep -q tbtest-shadow-copy /etc/shadow; '
        'cd "$TREE"; mount --bind "$FAKE" /tmp; exec bash scripts/kernel-lane "$@"'
    )
    env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
    env |= {
        "TREE": str(tree),
        "FAKE": str(fake_tmp),
        "TB_SETUP_DONE": "1",
        "PATH": f"{tree}/bin:{env['PATH']}",
    }
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", inner, "lane", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    log = tree / "stub.log"
    return res, fake_tmp, log.read_text() if log.exists() else ""


def test_the_host_half_leaves_nothing_in_tmp(tmp_path):
    res, fake_tmp, _log = _lane(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "has every feature" in res.stdout
    assert sorted(p.name for p in fake_tmp.iterdir()) == [], "the lane left files in /tmp"


def test_the_vm_half_gives_pytest_a_private_basetemp_and_removes_it(tmp_path):
    res, fake_tmp, log = _lane(tmp_path, "--inside")
    assert res.returncode == 0, res.stdout + res.stderr
    (line,) = [x for x in log.splitlines() if x.startswith("basetemp ")]
    _, basetemp, mode, uid = line.split()
    folder = Path(basetemp).parent  # a fresh folder of the script's, not the fixed /tmp/tb-lane
    assert folder.parent == Path("/tmp") and folder.name.startswith("tb-kernel-lane."), line
    assert (int(mode, 8), int(uid)) == (0o700, os.geteuid()), line
    assert sorted(p.name for p in fake_tmp.iterdir()) == [], "the lane left its basetemp in /tmp"
    shadow = (tmp_path / "tree" / "shadow").read_text()
    assert shadow.startswith("root:*:"), shadow  # the inside half ran (on the copy)
