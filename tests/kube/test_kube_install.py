"""`tunnelbench install kubernetes`'s parts without a build: the committed wrapper module, the GoWrapper build's
command and environment (a stand-in `go` records what it was run with), the DebExtract unpacking (a real .deb
made here with dpkg-deb, fetched by a stand-in `apt-get`), the machine checks' parsers, and that the bundle is
opt-in (never in `install all`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import tb

from tunnelbench.kube import build, checks
from tunnelbench.vpns.install import DebExtract, GoWrapper, install_source

WRAPPER = build.WRAPPER


def test_the_wrapper_module_replaces_28_staging_modules_with_their_published_versions() -> None:
    text = (WRAPPER / "go.mod").read_text()
    assert re.search(r"^require k8s\.io/kubernetes v1\.34\.4( // indirect)?$", text, re.M)
    replaces = re.findall(r"^\s+(k8s\.io/[\w-]+) => (k8s\.io/[\w-]+) (v\S+)$", text, re.M)
    assert len(replaces) == 28
    # each staging module k8s.io/X is pointed at itself, published as v0.34.4 (kubernetes v1.34.4's own tag)
    assert all(a == b and v == "v0.34.4" for a, b, v in replaces)
    tools = re.search(r"^tool \((.*?)^\)", text, re.M | re.S)
    assert tools is not None
    assert sorted(tools.group(1).split()) == sorted(build.GO.packages)
    sums = (WRAPPER / "go.sum").read_text()
    assert "k8s.io/kubernetes v1.34.4 h1:" in sums and "k8s.io/api v0.34.4 h1:" in sums


def test_the_reported_version_is_the_pinned_one() -> None:
    flags = build.LDFLAGS.replace("{version}", "1.34.4")
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.4" in flags
    assert "-X k8s.io/component-base/version.gitMinor=34" in flags
    assert "buildDate=1970-01-01T00:00:00Z" in flags  # no clock in the binaries


def _fake(bin_dir: Path, name: str, script: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)


def test_go_wrapper_builds_at_idle_priority_in_a_copy_with_a_temporary_build_cache(
    tmp_path, monkeypatch
) -> None:
    fake_bin, record = tmp_path / "fakebin", tmp_path / "record.json"
    fake_bin.mkdir()
    # the stand-in go: records argv, cwd, env and scheduling, then "builds" each binary into -o
    _fake(
        fake_bin,
        "go",
        f"""exec python3 - "$@" <<'EOF'
import json, os, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
for b in ("kube-apiserver", "kube-controller-manager", "kubelet"):
    open(os.path.join(out, b), "w").write("bin")
json.dump({{"argv": args, "cwd": os.getcwd(), "gocache": os.environ["GOCACHE"], "goflags": os.environ["GOFLAGS"],
           "cgo": os.environ["CGO_ENABLED"], "toolchain": os.environ["GOTOOLCHAIN"], "nice": os.nice(0),
           "policy": os.sched_getscheduler(0), "files": sorted(os.listdir("."))}}, open({str(record)!r}, "w"))
EOF
""",
    )
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    src = GoWrapper("kubernetes", "k8s.io/kubernetes", "v1.34.4", WRAPPER, build.GO.packages, build.GO.binaries,
                    build.LDFLAGS, "go1.27.3")  # fmt: skip
    with open(tmp_path / "log", "w") as log:
        r = install_source(src, log)
    assert r.status == "installed", r
    got = json.loads(record.read_text())
    assert got["nice"] == 19 and got["policy"] == os.SCHED_IDLE
    assert got["argv"][:4] == ["build", "-p", "1", "-trimpath"]
    assert got["argv"][-3:] == list(build.GO.packages)
    assert got["goflags"] == "-mod=readonly" and got["cgo"] == "0" and got["toolchain"] == "go1.27.3"
    assert got["files"] == ["go.mod", "go.sum"] and got["cwd"] != str(WRAPPER)  # a copy of the wrapper
    assert not Path(got["gocache"]).exists()  # the build cache went with the build
    assert src.cached() and (tmp_path / "cache" / "kubernetes-1.34.4" / "bin" / "kubelet").is_file()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian)")
def test_deb_extract_unpacks_what_apt_get_download_fetched_and_links_the_binaries(
    tmp_path, monkeypatch
) -> None:
    # a real package, made here: usr/sbin/tb-daemon
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: tb-test\nVersion: 1.0-1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    )
    (pkg / "usr" / "sbin").mkdir(parents=True)
    (pkg / "usr" / "sbin" / "tb-daemon").write_text("#!/bin/sh\necho hi\n")
    (pkg / "usr" / "sbin" / "tb-daemon").chmod(0o755)
    deb = tmp_path / "tb-test_1.0-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(deb)], check=True, capture_output=True
    )
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    # the stand-in apt-get: `download tb-test=1.0-1` copies the package into the working folder
    _fake(fake_bin, "apt-get", f'echo "$@" > {tmp_path}/apt-args; cp {deb} .\n')
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("TUNNELBENCH_CACHE", str(tmp_path / "cache"))
    src = DebExtract("bundle", "v2.0.0", (("tb-test", "1.0-1"),), ("tb-daemon",))
    with open(tmp_path / "log", "w") as log:
        from tunnelbench.vpns.install import _install_debs

        got = _install_debs(src, log)
    assert (tmp_path / "apt-args").read_text().split()[-2:] == ["download", "tb-test=1.0-1"]
    assert got == {deb.name: hashlib.sha256(deb.read_bytes()).hexdigest()}
    link = tmp_path / "cache" / "bundle-2.0.0" / "bin" / "tb-daemon"
    assert (
        link.is_symlink()
        and link.resolve() == tmp_path / "cache" / "bundle-2.0.0" / "debian" / "usr" / "sbin" / "tb-daemon"
    )
    assert stat.S_IMODE(link.resolve().stat().st_mode) == 0o755
    assert src.cached()


def test_cgroup_mode_and_capabilities_from_what_the_kernel_prints() -> None:
    hybrid = (
        "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:6 - cgroup cgroup rw,cpu\n"
        "31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:7 - cgroup2 cgroup2 rw\n"
    )
    assert checks.cgroup_mode(hybrid) == "v1 (hybrid)"
    assert checks.cgroup_mode(hybrid.splitlines()[1]) == "v2"
    assert checks.cgroup_mode("") == "none"
    # this machine's bounding set (the note's finding): bit 24 (CAP_SYS_RESOURCE) clear
    assert not checks.has_cap("CapBnd:\t000001fffeffffff\n", 24)
    assert checks.has_cap("CapBnd:\t000001ffffffffff\n", 24)


def test_kubernetes_is_never_part_of_install_all_and_never_installed_over_ssh(tmp_path) -> None:
    from tunnelbench.catalog import DRIVERS

    assert "kubernetes" not in DRIVERS  # `install` / `install all` lists the drivers only
    inv = tmp_path / "inv.ini"
    inv.write_text("[hosts]\n")
    r = tb("install", "kubernetes", "--inventory", str(inv))
    assert r.returncode == 2 and "installs on this machine only" in r.stderr, r.stdout + r.stderr
