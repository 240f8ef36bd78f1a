"""The strict-skip guard (tests/skipguard.py): under TB_STRICT_SKIPS=1 a skip outside the allow-list fails the
run, an allowed one does not, and both are listed with their counts at the end."""

from __future__ import annotations

import pytest
from tree import TESTS as TESTS_DIR

pytest_plugins = ["pytester"]

TESTS = str(TESTS_DIR)


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, body: str, strict: bool):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    if strict:
        monkeypatch.setenv("TB_STRICT_SKIPS", "1")
    else:
        monkeypatch.delenv("TB_STRICT_SKIPS", raising=False)
    pytester.makepyfile(test_x=body)
    return pytester.runpytest_subprocess("-p", "skipguard", "-p", "no:cacheprovider")


MISSING_TOOL = "import pytest\ndef test_ok(): pass\ndef test_s(): pytest.skip('nebula: not installed')\n"
SKIP_GRE = "def test_s(): pytest.skip('no GRE (module ip_gre): Unknown device')\n"
KERNEL = "import pytest\ndef test_ok(): pass\n@pytest.mark.kernel\n" + SKIP_GRE
UNMARKED = "import pytest\ndef test_ok(): pass\n" + SKIP_GRE


def test_an_unexpected_skip_fails_the_strict_run(pytester, monkeypatch):
    r = _run(pytester, monkeypatch, MISSING_TOOL, strict=True)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*UNEXPECTED*test_s*nebula: not installed*", "*1 unexpected skip(s)*"])


def test_the_same_skip_passes_without_strict(pytester, monkeypatch):
    r = _run(pytester, monkeypatch, MISSING_TOOL, strict=False)
    assert r.ret == pytest.ExitCode.OK
    r.stdout.fnmatch_lines(["*UNEXPECTED*test_s*"])


def test_a_kernel_absence_is_allowed_and_counted(pytester, monkeypatch):
    r = _run(pytester, monkeypatch, KERNEL, strict=True)
    assert r.ret == pytest.ExitCode.OK
    r.stdout.fnmatch_lines(["*allowed*1*a kernel module this kernel lacks*"])
    assert "UNEXPECTED" not in r.stdout.str()


def test_a_kernel_absence_without_the_lane_marker_fails(pytester, monkeypatch):
    """The same skip on a test the kernel lane does not run (no `kernel`/`lane` marker): it would run nowhere."""
    r = _run(pytester, monkeypatch, UNMARKED, strict=True)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["*UNEXPECTED*test_s*module ip_gre*"])
