"""The OCI archive writer (kube/oci.py): the same files give the same bytes whatever their order, and the
archive is a valid image layout by the spec's rules, checked with tarfile and hashlib (not the writer's code):
every blob is named by its sha256, the index points at the manifest, the manifest at the config and the layer,
the config's diff_id is the layer's sha256, and every entry has mtime 0 and owner 0:0."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

from tunnelbench.kube.oci import Entry, image_archive, layer_tar

FILES = [
    Entry("bin/busybox", 0o755, b"\x7fELF busybox"),
    Entry("bin/sh", target="busybox"),
    Entry("etc/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n"),
    Entry("usr/local/bin/iperf3", 0o755, b"\x7fELF iperf3"),
]


def members(archive: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            out[m.name] = (m, f.read() if f else None)
    return out


def test_same_files_in_another_order_give_the_same_bytes() -> None:
    a = image_archive("tunnelbench.local/tools:1", FILES)
    b = image_archive("tunnelbench.local/tools:1", list(reversed(FILES)))
    assert a.archive == b.archive
    assert a.manifest_digest == b.manifest_digest
    # one byte of one file changes every digest above it
    c = image_archive(
        "tunnelbench.local/tools:1", [*FILES[:3], Entry("usr/local/bin/iperf3", 0o755, b"\x7fELF iperf4")]
    )
    assert c.layer_digest != a.layer_digest and c.manifest_digest != a.manifest_digest


def test_layer_entries_are_sorted_with_parents_and_fixed_metadata() -> None:
    with tarfile.open(fileobj=io.BytesIO(layer_tar(reversed(FILES)))) as tar:
        ms = tar.getmembers()
    names = [m.name for m in ms]
    assert names == sorted(names)
    # parents no entry declared are there, as directories 0755
    assert {"bin", "etc", "usr", "usr/local", "usr/local/bin"} <= set(names)
    assert all(m.isdir() and m.mode == 0o755 for m in ms if m.name in ("usr", "usr/local"))
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in ms)
    sh = next(m for m in ms if m.name == "bin/sh")
    assert sh.issym() and sh.linkname == "busybox"
    assert next(m for m in ms if m.name == "etc/passwd").mode == 0o644


def test_the_archive_is_an_image_layout_whose_digests_check_out() -> None:
    img = image_archive("tunnelbench.local/tools:1", FILES)
    m = members(img.archive)
    assert json.loads(m["oci-layout"][1] or b"") == {"imageLayoutVersion": "1.0.0"}
    for name, (_info, data) in m.items():
        if name.startswith("blobs/sha256/") and data is not None:
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(m["index.json"][1] or b"")
    (desc,) = index["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == "tunnelbench.local/tools:1"
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest_b = m[f"blobs/sha256/{desc['digest'].split(':')[1]}"][1] or b""
    assert desc["size"] == len(manifest_b) and img.manifest_digest == desc["digest"]
    manifest = json.loads(manifest_b)
    config = json.loads(m[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"][1] or b"")
    layer = m[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"][1] or b""
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert "created" not in config  # no clock in the image
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        f = tar.extractfile("usr/local/bin/iperf3")
        assert f is not None and f.read() == b"\x7fELF iperf3"
