"""A deterministic OCI image archive writer: the same files give the same bytes, hence the same digests.

An image is one uncompressed layer (a tar of the root file system) plus its config, manifest and index, packed
as an OCI image layout (https://github.com/opencontainers/image-spec/blob/v1.1.0/image-layout.md) in a tar that
`ctr images import` reads. What makes it reproducible: entries sorted by path, mtime 0, owner 0:0 without
names, modes as given (not the umask's), the USTAR format (no PAX headers carrying atime or a PID), JSON with
sorted keys and no spaces, no "created" time. Layers stay uncompressed: gzip would add its own header time and
its output depends on the zlib build."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
# containerd names an imported image after this annotation (images/archive/importer.go, imageName)
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Entry:
    """One entry of the root file system: a file (data), a symlink (target) or a directory (neither)."""

    path: str  # relative, no leading "/": "bin/busybox"
    mode: int = 0o755
    data: bytes | None = None
    target: str | None = None

    @property
    def kind(self) -> str:
        return "symlink" if self.target is not None else "file" if self.data is not None else "dir"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _tar(members: Iterable[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(path: str, mode: int, kind: str, size: int = 0, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, 0, "", ""
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.size = size if kind == "file" else 0
    info.linkname = target
    return info


def with_parents(entries: Iterable[Entry]) -> list[Entry]:
    """The entries plus a directory entry (0755) for every parent folder none of them declares, sorted by path:
    a layer without its parent folders leaves their mode to the unpacker."""
    out = {e.path.strip("/"): e for e in entries}
    for p in list(out):
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.setdefault("/".join(parts[:i]), Entry("/".join(parts[:i])))
    return [out[k] for k in sorted(out)]


def layer_tar(entries: Iterable[Entry]) -> bytes:
    """The layer: every entry (parents added), sorted by path, with fixed metadata."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for e in with_parents(entries):
        if e.kind == "file":
            assert e.data is not None
            members.append((_info(e.path, e.mode, "file", len(e.data)), e.data))
        elif e.kind == "symlink":
            members.append((_info(e.path, 0o777, "symlink", target=e.target or ""), None))
        else:
            members.append((_info(e.path, e.mode, "dir"), None))
    return _tar(members)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Image:
    name: str  # the full reference containerd gives it: "tunnelbench.local/tools:1"
    archive: bytes  # the OCI layout tar
    manifest_digest: str  # what a pod may name as name@sha256:...
    layer_digest: str


def image_archive(
    name: str,
    entries: Iterable[Entry],
    env: tuple[str, ...] = ("PATH=/bin:/usr/bin:/usr/local/bin",),
    entrypoint: tuple[str, ...] = (),
    arch: str = "amd64",
) -> Image:
    """The OCI layout archive of a one-layer image named `name` (linux/`arch`)."""
    layer = layer_tar(entries)
    config: dict[str, Any] = {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": list(env), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
    }
    if entrypoint:
        config["config"]["Entrypoint"] = list(entrypoint)
    config_b = canonical_json(config)
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": digest(config_b), "size": len(config_b)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": digest(layer), "size": len(layer)}],
        }
    )
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [
                {
                    "mediaType": MANIFEST_TYPE,
                    "digest": digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {NAME_ANNOTATION: name, REF_ANNOTATION: tag},
                }
            ],
        }
    )
    blobs = {digest(b).split(":", 1)[1]: b for b in (layer, config_b, manifest)}
    files: list[tuple[str, bytes]] = [
        ("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"})),
        ("index.json", index),
        *((f"blobs/sha256/{h}", b) for h, b in blobs.items()),
    ]
    dirs = ["blobs", "blobs/sha256"]
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [(_info(d, 0o755, "dir"), None) for d in dirs]
    members += [(_info(p, 0o644, "file", len(b)), b) for p, b in sorted(files)]
    members.sort(key=lambda m: m[0].name)
    return Image(name, _tar(members), digest(manifest), digest(layer))


def tree_entries(files: dict[str, Path], links: dict[str, str] | None = None) -> list[Entry]:
    """Entries from files of this machine ({path in the image: source}, each with its mode's execute bits kept)
    and symlinks ({path in the image: target})."""
    out = []
    for dest, src in files.items():
        mode = 0o755 if src.stat().st_mode & 0o111 else 0o644
        out.append(Entry(dest.strip("/"), mode, src.read_bytes()))
    out += [Entry(p.strip("/"), 0o777, target=t) for p, t in (links or {}).items()]
    return out
