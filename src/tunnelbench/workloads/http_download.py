"""HTTP bulk download (the ten-VPN thesis's Nix binary-cache download): nginx on the server host serves a file set
shaped like a binary cache (many small files plus a few large ones), generated deterministically into the
server's work folder (over SSH: made here once per run and host, sent as one tar file); curl fetches all
of it over the tunnel with several parallel connections (`curl --parallel`). Total time and goodput;
per-file times of the small files show the per-request cost."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments.common import add_percentiles
from tunnelbench.instruments.nginx import start_nginx, stop_nginx
from tunnelbench.lab.host import Host
from tunnelbench.workloads.base import CaseContext, Params, Workload, WorkloadError

HTTP_PORT = 8080


class HttpDownloadParams(Params):
    small_files: int = Field(300, ge=0, le=100_000, description="number of small files (narinfo/small NARs)")
    small_kib: float = Field(24.0, gt=0, le=10_000, description="mean size of a small file (KiB, lognormal)")
    large_files: int = Field(3, ge=0, le=1000, description="number of large files")
    large_mib: float = Field(16.0, gt=0, le=4096, description="size of each large file (MiB)")
    connections: int = Field(8, ge=1, le=256, description="parallel connections (curl --parallel-max)")
    seed: int = Field(
        3,
        ge=0,
        le=2**32 - 1,
        description="file-set seed: same parameters + seed = same bytes (numpy's range)",
    )


def fileset_name(p: HttpDownloadParams) -> str:
    key = hashlib.sha256(
        json.dumps([p.small_files, p.small_kib, p.large_files, p.large_mib, p.seed]).encode()
    )
    return f"cache-{key.hexdigest()[:12]}"


def make_fileset(root: Path, p: HttpDownloadParams) -> tuple[Path, list[tuple[str, int]]]:
    """Write the file set once (cached by its parameters); returns its folder and (path, size) per file."""
    d = root / fileset_name(p)
    manifest = d / "manifest.json"
    if manifest.exists():
        return d, [(rel, size) for rel, size in json.loads(manifest.read_text())]
    rng = np.random.default_rng(p.seed)
    sizes = rng.lognormal(np.log(p.small_kib * 1024) - 0.5, 1.0, p.small_files).clip(200, None).astype(int)
    files = [(f"nar/s{i:05d}-{rng.bytes(8).hex()}.nar.xz", int(s)) for i, s in enumerate(sizes)]
    files += [
        (f"nar/l{i:03d}-{rng.bytes(8).hex()}.nar.xz", int(p.large_mib * 2**20)) for i in range(p.large_files)
    ]
    (d / "nar").mkdir(parents=True, exist_ok=True)
    for rel, size in files:
        (d / rel).write_bytes(rng.bytes(size))  # incompressible, like xz-compressed NARs
    manifest.write_text(json.dumps(files))
    return d, files


def q(path: Path) -> str:
    return shlex.quote(str(path))


def fileset_on(host: Host, p: HttpDownloadParams) -> tuple[Path, list[tuple[str, int]]]:
    """The file set in the host's work folder: written in place on this machine; on a remote host made here
    in a scratch folder and sent as one tar file, unpacked beside and moved into place whole (a set cut off
    midway is never taken for a cached one), then found there by the next case."""
    root = host.workdir / "filesets"
    if not host.remote:
        return make_fileset(root, p)
    d = root / fileset_name(p)
    if host.exists(d / "manifest.json"):
        return d, [(rel, size) for rel, size in json.loads(host.read_file(d / "manifest.json"))]
    with tempfile.TemporaryDirectory(prefix="tb-fileset-") as tmp:
        local, files = make_fileset(Path(tmp), p)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(local, arcname=d.name)
        part, tar_file = root / f".part-{d.name}", root / f".part-{d.name}.tar"
        host.write_file(tar_file, buf.getvalue(), 0o600)
        host.run(
            ["sh", "-c", f"rm -rf {q(part)} && mkdir -p {q(part)} && tar -x -C {q(part)} -f {q(tar_file)} "
                         f"&& mv {q(part / d.name)} {q(d)} && rmdir {q(part)} && rm -f {q(tar_file)}"],
            timeout=600,
        )  # fmt: skip
    return d, files


class HttpDownload(Workload):
    name = "http_download"
    summary = "curl --parallel fetches a binary-cache-like file set from nginx over the tunnel"
    tools = ("nginx", "curl")
    headline = ("download_s", "goodput_mbps")
    Params = HttpDownloadParams
    params: HttpDownloadParams
    metrics = (
        MetricSpec("download_s", "s", "lower", "time to fetch the whole file set"),
        MetricSpec("goodput_mbps", "Mbit/s", "higher", "file bytes / download time"),
        MetricSpec("files_per_s", "1/s", "higher", "files fetched per second"),
        MetricSpec("fileset_mb", "MB", "none", "size of the file set (10^6 bytes)"),
        MetricSpec("http_errors", "count", "lower", "transfers without status 200 or with a short body"),
        MetricSpec("small_file_p50_ms", "ms", "lower", "median fetch time of a small file"),
        MetricSpec("small_file_p99_ms", "ms", "lower", "99th percentile fetch time of a small file"),
    )

    def label(self) -> str:
        p = self.params
        return f"http-download-c{p.connections}"

    def expected_seconds(self) -> float:
        p = self.params
        mb = p.small_files * p.small_kib / 1024 + p.large_files * p.large_mib
        return 5 + mb * 8 / 50  # generous: 50 Mbit/s worst case

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        root, files = fileset_on(ctx.server, p)
        if not files:
            raise WorkloadError("empty file set: set small_files or large_files")
        ndir = ctx.folder_on(ctx.server, "nginx")
        nginx = start_nginx(ctx.server, ctx.server_ip, HTTP_PORT, ndir, root=root)
        try:
            cfg = ctx.folder_on(ctx.client, "curl") / "curl.cfg"
            ctx.client.write_file(
                cfg,
                "".join(
                    f'url = "http://{ctx.server_ip}:{HTTP_PORT}/{rel}"\noutput = "/dev/null"\n'
                    for rel, _ in files
                ),
            )
            argv = ["curl", "--parallel", "--parallel-max", str(p.connections), "--no-progress-meter",
                    "--max-time", f"{max(10.0, ctx.remaining() - 5):.0f}",
                    "--write-out", "%{http_code} %{size_download} %{time_total} %{url_effective}\\n", "-K", str(cfg)]  # fmt: skip
            t0 = time.monotonic()
            res = ctx.client.run(argv, timeout=ctx.remaining(), check=False)
            took = time.monotonic() - t0
        finally:
            stop_nginx(nginx, ndir)
        (ctx.artifact_dir / "curl.txt").write_text(res.stdout + res.stderr)
        sizes = {f"/{rel}": size for rel, size in files}
        errors, got, small_ms = 0, 0, []
        seen = set()
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue
            code, size, t, url = parts[0], int(parts[1]), float(parts[2]), parts[3]
            path = "/" + url.split("/", 3)[-1]
            seen.add(path)
            if code != "200" or size != sizes.get(path):
                errors += 1
                continue
            got += size
            if "/s" in path:
                small_ms.append(t * 1000)
        errors += len(sizes) - len(seen)
        if got == 0:
            raise WorkloadError(f"curl fetched nothing (exit {res.returncode}): {res.stderr[-300:]}")
        out = Outcome(measure_s=took)
        out.add("download_s", took)
        out.add("goodput_mbps", got * 8 / took / 1e6)
        out.add("files_per_s", (len(files) - errors) / took)
        out.add("fileset_mb", sum(sizes.values()) / 1e6)
        out.add("http_errors", errors)
        add_percentiles(out, "small_file", small_ms, "ms", (50, 99))
        return out


def curl_version() -> str:
    return subprocess.run(["curl", "--version"], capture_output=True, text=True).stdout.split()[1]
