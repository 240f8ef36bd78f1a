"""The client pod's image for many_clients on Kubernetes, made here, reproducibly (kube/oci.py): busybox-static and
its applets (sh, ip, usleep), `tbcall` (the request loop, kube/tbcall/main.go, a static Go binary built with the
project's Go toolchain), and the VPN clients from the install cache (wireguard-go, wg, nebula) with the shared
libraries they load. Every input is recorded with its sha256 beside the archive (fleet.json): the same inputs
give the same image digest, so the lab (imported into each node with ctr) and a user's registry (`skopeo copy
oci-archive:fleet.tar docker://REGISTRY/tunnelbench-fleet:TAG`, docs/real-hosts.md) run the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from tunnelbench.kube import build, oci
from tunnelbench.lab.host import find_binary
from tunnelbench.vpns.install import GO_TOOLCHAIN, InstallError
from tunnelbench.vpns.nebula import Nebula
from tunnelbench.vpns.wireguard_go import WireguardGo

FLEET_IMAGE = "tunnelbench.local/fleet:1"
TBCALL_SRC = Path(__file__).resolve().parent / "tbcall" / "main.go"
# the VPN client binaries the image carries, each from its driver's install sources
VPN_BINARIES = {"wireguard-go": WireguardGo.installs, "wg": WireguardGo.installs, "nebula": Nebula.installs}


def archive_path() -> Path:
    return build.images_dir() / "fleet.tar"


def record_path() -> Path:
    return build.images_dir() / "fleet.json"


def build_tbcall(out: Path) -> None:
    """`go build` of the request loop: static (CGO_ENABLED=0), no build paths or IDs in it."""
    with tempfile.TemporaryDirectory(prefix="tb-tbcall-") as tmp:
        env = {**os.environ, "GOTOOLCHAIN": GO_TOOLCHAIN, "CGO_ENABLED": "0"}
        src = Path(tmp) / "main.go"
        src.write_bytes(TBCALL_SRC.read_bytes())
        p = subprocess.run(["go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o",
                            str(out), str(src)], capture_output=True, text=True, env=env, cwd=tmp)  # fmt: skip
        if p.returncode != 0:
            raise InstallError(f"go build of tbcall failed (exit {p.returncode}): {p.stderr[-600:]}")


def inputs(tbcall: Path) -> build.ImageInputs:
    busybox = build.bin_path("busybox").resolve()
    inp = build.ImageInputs({"bin/busybox": busybox, "usr/local/bin/tbcall": tbcall})
    for a in build.busybox_applets(busybox):
        inp.links.setdefault(f"bin/{a}", "busybox")
    for name, installs in VPN_BINARIES.items():
        found = find_binary(name, installs)
        if found is None:
            raise InstallError(
                f"{name} is not installed (tunnelbench install {'nebula' if name == 'nebula' else 'wireguard-go'})"
            )
        real = Path(found).resolve()
        inp.files[f"usr/local/bin/{name}"] = real
        for lib in build.libraries(real):
            inp.files[str(lib).lstrip("/")] = lib.resolve()
    inp.written["etc/passwd"] = b"root:x:0:0:root:/:/bin/sh\n"
    inp.written["tmp/.keep"] = b""
    inp.written["var/run/.keep"] = b""
    return inp


def inputs_key() -> str:
    """What the image is made from: the request loop's source, the Go toolchain, each VPN binary. A kept image
    made from other inputs (an edited tbcall, an upgraded wireguard-go) is made again."""
    parts = [oci.digest(TBCALL_SRC.read_bytes()), GO_TOOLCHAIN]
    for name, installs in sorted(VPN_BINARIES.items()):
        found = find_binary(name, installs)
        parts.append(f"{name}={oci.digest(Path(found).resolve().read_bytes()) if found else 'missing'}")
    return oci.digest(" ".join(parts).encode())


def ensure_image() -> tuple[Path, str]:
    """(archive, its manifest digest): made once, kept in the Kubernetes build's images folder. A lab node
    imports the archive (containerd names it FLEET_IMAGE); a user's registry copy is named by the digest."""
    rec = record_path()
    key = inputs_key()
    if archive_path().is_file() and rec.is_file():
        kept = json.loads(rec.read_text())
        if kept.get("inputs") == key:  # the same request loop source, toolchain and VPN binaries
            return archive_path(), str(kept["manifest"])
    build.images_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tb-fleet-") as tmp:
        tbcall = Path(tmp) / "tbcall"
        build_tbcall(tbcall)
        inp = inputs(tbcall)
        entries = oci.tree_entries(inp.files, inp.links) + [
            oci.Entry(p, 0o644, b) for p, b in inp.written.items()
        ]
        img = oci.image_archive(FLEET_IMAGE, entries)
        archive_path().write_bytes(img.archive)
        files = {dest: {"source": str(src) if dest != "usr/local/bin/tbcall" else "kube/tbcall/main.go",
                        "sha256": oci.digest(src.read_bytes())} for dest, src in sorted(inp.files.items())}  # fmt: skip
    rec.write_text(json.dumps({"name": img.name, "manifest": img.manifest_digest, "go": GO_TOOLCHAIN,
                               "inputs": key, "files": files}, indent=1) + "\n")  # fmt: skip
    return archive_path(), img.manifest_digest
