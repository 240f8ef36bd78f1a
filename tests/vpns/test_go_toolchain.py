"""Every Go build runs with GOTOOLCHAIN=go1.27.3 (issue 27): declared as data on each GoModule, passed to
every go command of an install (download, build, the `go env` look-ups, the recorded `go version`), and
exported by the scripts that run go themselves and by the documented build commands (docs/vpns.md). No build runs: subprocess is recorded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from tree import ROOT

from tunnelbench.catalog import DRIVERS, resolve
from tunnelbench.vpns.install import GO_TOOLCHAIN, GoModule, install_source

ISSUE_TOOLCHAIN = "go1.27.3"  # the toolchain the issue names, served by the Go module proxy


def _go_modules() -> list[tuple[str, GoModule]]:
    out = []
    for name, cls in DRIVERS.items():
        variants = [cls]
        if any(isinstance(s, GoModule) for s in cls.installs):
            variants.append(resolve(f"{name}@1.0.0"))  # a pinned variant keeps the toolchain
        out += [(v.key, s) for v in variants for s in v.installs if isinstance(s, GoModule)]
    return out


def test_the_toolchain_constant_is_the_issues():
    assert GO_TOOLCHAIN == ISSUE_TOOLCHAIN


def test_every_go_module_declares_the_toolchain():
    mods = _go_modules()
    names = {s.name for _, s in mods}
    assert {"nebula", "tailscale", "headscale", "yggdrasil", "wireguard-go"} <= names
    for key, s in mods:
        assert s.toolchain == ISSUE_TOOLCHAIN, (key, s.name)
        assert s.go_env() == {"GOTOOLCHAIN": ISSUE_TOOLCHAIN}, (key, s.name)


class GoRecorder:
    """subprocess.run recorded: go commands 'succeed' (a build writes the source's binaries), nothing runs."""

    def __init__(self, source: GoModule, tmp_path: Path):
        self.source, self.tmp = source, tmp_path
        self.seen: list[tuple[list[str], dict[str, str]]] = []

    def run(self, argv, *a, env=None, cwd=None, **kw):
        argv = list(argv)
        if argv[0] == "go":
            self.seen.append((argv, dict(env or {})))
        out = ""
        if argv[:3] == ["go", "mod", "download"] and "-json" in argv:
            moddir = self.tmp / "moddir"
            moddir.mkdir(exist_ok=True)
            out = json.dumps({"Dir": str(moddir)})
        elif argv[:2] == ["go", "env"]:
            out = str(self.tmp / "gomodcache") if "GOMODCACHE" in argv else "https://proxy.golang.org,direct"
        elif argv[:2] == ["go", "version"]:
            out = f"go version {ISSUE_TOOLCHAIN} linux/amd64"
        elif argv[:2] in (["go", "install"], ["go", "build"]):
            bin_dir = (env or {}).get("GOBIN") or argv[argv.index("-o") + 1]
            for b in self.source.binaries + tuple(built for built, _ in self.source.renames):
                Path(bin_dir, b).write_text("#!/bin/sh\n")
        return SimpleNamespace(returncode=0, stdout=out, stderr="", args=argv)


@pytest.mark.parametrize(("key", "source"), _go_modules(), ids=lambda x: getattr(x, "name", x))
def test_every_go_command_of_an_install_exports_the_toolchain(key, source, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GOTOOLCHAIN", raising=False)
    rec = GoRecorder(source, tmp_path)
    monkeypatch.setattr(subprocess, "run", rec.run)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    log = (tmp_path / "log").open("w")
    r = install_source(source, log)
    assert r.status == "installed", (key, r)
    kinds = {tuple(argv[:2]) for argv, _ in rec.seen}
    assert ("go", "build") in kinds or ("go", "install") in kinds
    assert ("go", "version") in kinds  # the toolchain recorded in installed.json is the build's
    for argv, env in rec.seen:
        assert env.get("GOTOOLCHAIN") == ISSUE_TOOLCHAIN, (key, argv)
    record = json.loads((source.cache_dir() / "installed.json").read_text())
    assert record["toolchain"].startswith(f"go version {ISSUE_TOOLCHAIN} ")
    assert record["source"]["toolchain"] == ISSUE_TOOLCHAIN


@pytest.mark.parametrize(
    "path", ["scripts/setup.sh", "scripts/bench", "scripts/build-tools.sh", "docs/vpns.md"]
)
def test_scripts_and_readme_export_the_toolchain(path):
    assert f"GOTOOLCHAIN={ISSUE_TOOLCHAIN}" in (ROOT / path).read_text(), path
