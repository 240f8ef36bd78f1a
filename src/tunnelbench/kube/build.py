"""`tunnelbench install kubernetes`: the pinned Kubernetes the lab runs, built and kept in the cache.

    $TUNNELBENCH_CACHE/kubernetes-1.34.4/
      bin/              kube-apiserver, kube-controller-manager, kubelet (Go module proxy, wrapper module);
                        containerd, containerd-shim-runc-v2, ctr, runc, etcd, busybox (links into debian/)
      debian/           Debian's containerd, runc, containernetworking-plugins, etcd-server, busybox-static,
                        unpacked (`dpkg -x`), never installed: no system service is registered or started
      images/           pause.tar, tools.tar: OCI archives made here (kube/oci.py), imported per node
      installed.json    what was built from what, each part's seconds, the size kept

Why 1.34.4: the newest 1.34 the module proxy serves; 1.35 and later refuse cgroup v1 by default
(`failCgroupV1`), and this kind of machine is cgroup v1 (hybrid). Debian's containerd 1.6.20 is below 1.34's
recommended floor (1.6.39) but runs it (the note's one-node run). No kube-scheduler (pods are placed by
nodeName, as seed 000 pinned its iperf3 pods to the two workers), no kube-proxy (pods reach each other and the
apiserver by address), no kubectl (the lab talks HTTPS to the apiserver, kube/api.py).

Opt-in: not in `install all`, the default scenario or scripts/setup.sh (~15 CPU-min and ~3 GB of transient
build cache). The images' inputs (busybox from the unpacked package; iperf3, hey and their libraries from
this machine) are recorded with their sha256 and package in installed.json: the same inputs give the same
image digests."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tunnelbench.kube import oci
from tunnelbench.vpns.install import (
    GO_TOOLCHAIN,
    DebExtract,
    GoWrapper,
    InstallError,
    InstallResult,
    debian_package_of,
    debian_version,
    install_source,
)

VERSION = "v1.34.4"
WRAPPER = Path(__file__).resolve().parent / "gowrapper"
_MAJOR, _MINOR = VERSION.removeprefix("v").split(".")[:2]
# the version the binaries report (the kubelet registers its node with it); buildDate fixed: reproducible
_VERSION_PKGS = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
LDFLAGS = " ".join(
    ["-s", "-w"]
    + [
        f"-X {pkg}.{k}={v}"
        for pkg in _VERSION_PKGS
        for k, v in (
            ("gitVersion", "v{version}"),
            ("gitMajor", _MAJOR),
            ("gitMinor", _MINOR),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        )
    ]
)

GO = GoWrapper(
    name="kubernetes",
    module="k8s.io/kubernetes",
    version=VERSION,
    wrapper=WRAPPER,
    packages=tuple(
        f"k8s.io/kubernetes/cmd/{c}" for c in ("kube-apiserver", "kube-controller-manager", "kubelet")
    ),
    binaries=("kube-apiserver", "kube-controller-manager", "kubelet"),
    ldflags=LDFLAGS,
    toolchain=GO_TOOLCHAIN,
)
DEBS = DebExtract(
    name="kubernetes",
    version=VERSION,
    packages=(
        ("containerd", "1.6.20~ds1-1+deb12u3"),
        ("runc", "1.1.5+ds1-1+deb12u1"),
        ("containernetworking-plugins", "1.1.1+ds1-3+b5"),
        ("etcd-server", "3.4.23-4+b4"),
        ("busybox-static", "1:1.35.0-4+deb12u1+b1"),
    ),
    binaries=("containerd", "containerd-shim-runc-v2", "ctr", "runc", "etcd", "busybox"),
)
SOURCES = (GO, DEBS)
CNI_PLUGINS = ("ptp", "host-local", "loopback")  # what the lab's CNI config chains (kube/config.py)
PAUSE_TAG = "3.10.1"  # kubernetes v1.34.4 build/pause/Makefile's TAG
PAUSE_IMAGE = f"tunnelbench.local/pause:{PAUSE_TAG}"
TOOLS_IMAGE = f"tunnelbench.local/tools:{VERSION.removeprefix('v')}"
# the tools a pod runs (the tools image): busybox's applets, and these from this machine with their libraries
TOOL_BINARIES = ("iperf3", "hey")


def cache_dir() -> Path:
    return GO.cache_dir()


def bin_path(name: str) -> Path:
    return cache_dir() / "bin" / name


def cni_dir() -> Path:
    return DEBS.root() / "usr" / "lib" / "cni"


def images_dir() -> Path:
    return cache_dir() / "images"


def record_path() -> Path:
    return cache_dir() / "installed.json"


def record() -> dict[str, object] | None:
    try:
        data = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def missing() -> list[str]:
    """What of the bundle is not in the cache ([]: installed)."""
    out = [s.label for s in SOURCES if not s.cached()]
    out += [f"CNI plugin {p}" for p in CNI_PLUGINS if not (cni_dir() / p).is_file()]
    out += [f"image {n}" for n in ("pause.tar", "tools.tar") if not (images_dir() / n).is_file()]
    if not out and record() is None:
        out.append("installed.json")
    return out


def installed() -> bool:
    return not missing()


NOT_CACHED = "kubernetes build not cached (tunnelbench install kubernetes)"


# -- images ------------------------------------------------------------------------------------------
def libraries(binary: Path) -> list[Path]:
    """The shared libraries `binary` loads (ldd), the dynamic loader included; [] for a static binary."""
    p = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    out = []
    for line in p.stdout.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            out.append(Path(m.group(1)))
    return out


def pause_source(log: TextIO) -> Path:
    """kubernetes' own pause.c, from the module the wrapper pins (`go mod download -json`)."""
    p = subprocess.run(
        ["go", "mod", "download", "-json", f"{GO.module}@{GO.version}"],
        capture_output=True,
        text=True,
        env={**os.environ, "GOTOOLCHAIN": GO.toolchain, "GOFLAGS": "-mod=mod"},
    )
    log.write(p.stderr)
    try:
        src = Path(json.loads(p.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    except (ValueError, KeyError):
        raise InstallError(
            f"`go mod download {GO.module}@{GO.version}` failed (exit {p.returncode})"
        ) from None
    if not src.is_file():
        raise InstallError(f"{src} is not in the module")
    return src


def build_pause(log: TextIO, out: Path) -> Path:
    src = pause_source(log)
    argv = ["gcc", "-Os", "-static", "-Wall", "-Werror", f"-DVERSION={PAUSE_TAG}",
            "-o", str(out), str(src)]  # fmt: skip
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    p = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise InstallError(f"gcc of pause.c exited {p.returncode} (gcc and libc6-dev are needed)")
    subprocess.run(["strip", str(out)], stdout=log, stderr=subprocess.STDOUT)
    return out


def busybox_applets(busybox: Path) -> list[str]:
    p = subprocess.run([str(busybox), "--list"], capture_output=True, text=True)
    if p.returncode != 0:
        raise InstallError(f"{busybox} --list exited {p.returncode}")
    return sorted(a for a in p.stdout.split() if a and a != "busybox")


@dataclass
class ImageInputs:
    files: dict[str, Path] = field(default_factory=dict)  # path in the image -> source on this machine
    links: dict[str, str] = field(default_factory=dict)  # path in the image -> symlink target
    written: dict[str, bytes] = field(default_factory=dict)  # path in the image -> its bytes


def tools_inputs() -> ImageInputs:
    """The tools image: busybox-static and its applets in /bin, iperf3 and hey with their libraries."""
    busybox = bin_path("busybox").resolve()
    inp = ImageInputs({"bin/busybox": busybox})
    for a in busybox_applets(busybox):
        inp.links.setdefault(f"bin/{a}", "busybox")
    for name in TOOL_BINARIES:
        found = shutil.which(name)
        if found is None:
            raise InstallError(f"{name} is not on this machine (the tools image carries it)")
        real = Path(found).resolve()
        inp.files[f"usr/local/bin/{name}"] = real
        for lib in libraries(real):
            inp.files[str(lib).lstrip("/")] = lib.resolve()
    inp.written["etc/passwd"] = b"root:x:0:0:root:/:/bin/sh\n"
    inp.written["tmp/.keep"] = b""
    return inp


def make_images(log: TextIO) -> dict[str, object]:
    """pause.tar and tools.tar into images/; what each was made of."""
    images_dir().mkdir(parents=True, exist_ok=True)
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tb-pause-") as tmp:
        pause = build_pause(log, Path(tmp) / "pause")
        img = oci.image_archive(
            PAUSE_IMAGE, oci.tree_entries({"pause": pause}), env=(), entrypoint=("/pause",)
        )
        (images_dir() / "pause.tar").write_bytes(img.archive)
        out["pause"] = {
            "name": img.name,
            "manifest": img.manifest_digest,
            "source": "kubernetes build/pause/linux/pause.c, gcc -static",
        }
    inp = tools_inputs()
    entries = oci.tree_entries(inp.files, inp.links) + [
        oci.Entry(p, 0o644, b) for p, b in inp.written.items()
    ]
    img = oci.image_archive(TOOLS_IMAGE, entries)
    (images_dir() / "tools.tar").write_bytes(img.archive)
    out["tools"] = {
        "name": img.name,
        "manifest": img.manifest_digest,
        "files": {
            dest: {
                "source": str(src),
                "sha256": oci.digest(src.read_bytes()),
                "package": _package_version(src),
            }
            for dest, src in sorted(inp.files.items())
        },
    }
    return out


def _package_version(path: Path) -> str:
    if path.is_relative_to(DEBS.root()):
        return "unpacked: " + ", ".join(f"{p} {v}" for p, v in DEBS.packages if p.startswith("busybox"))
    pkg = debian_package_of(str(path))
    if pkg is None:
        return "not from a Debian package"
    return f"{pkg} {debian_version(pkg.split(':')[0]) or ''}".strip()


# -- the install -------------------------------------------------------------------------------------
def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def install(log: TextIO, force: bool = False) -> list[InstallResult]:
    """Build what the cache lacks (everything with `force`), then record the bundle in installed.json."""
    if installed() and not force:
        return [InstallResult(f"kubernetes {VERSION}", "cached", 0.0, str(cache_dir()))]
    t0 = time.monotonic()
    results: list[InstallResult] = []
    parts: dict[str, float] = {}
    for s in SOURCES:
        r = install_source(s, log, force)
        results.append(r)
        parts[s.label] = round(r.seconds, 1)
        if r.status == "failed":
            return results
    t1 = time.monotonic()
    try:
        images = make_images(log)
    except (InstallError, OSError) as e:
        results.append(InstallResult("images (pause, tools)", "failed", time.monotonic() - t1, str(e)))
        return results
    parts["images"] = round(time.monotonic() - t1, 1)
    results.append(
        InstallResult("images (pause, tools)", "installed", time.monotonic() - t1, str(images_dir()))
    )
    debs = json.loads((DEBS.root() / "debs.json").read_text())
    rec = {
        "kubernetes": VERSION,
        "sources": [s.label for s in SOURCES],
        "parts_seconds": parts,
        "seconds": round(time.monotonic() - t0, 1),
        "installed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "toolchain": _go_version(),
        "machine": platform.machine(),
        "debs_sha256": debs,
        "images": images,
        "size_bytes": tree_bytes(cache_dir()),
    }
    record_path().write_text(json.dumps(rec, indent=2) + "\n")
    return results


def _go_version() -> str:
    try:
        return subprocess.run(
            ["go", "version"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "GOTOOLCHAIN": GO.toolchain},
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
