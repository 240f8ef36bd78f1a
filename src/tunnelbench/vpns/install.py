"""Pinned installs of VPN binaries: Debian packages, Go modules, Rust crates.

Every driver declares where its binaries come from as data (`installs = (Apt(...), GoModule(...), ...)`).
Registry builds (Go proxy, crates.io) go into a cache keyed by name and version:

    $TUNNELBENCH_CACHE (default /var/cache/tunnelbench)/<name>-<version>/bin/<binary>
    $TUNNELBENCH_CACHE/<name>-<version>/installed.json   what was built, how, and how long it took

so a second `tunnelbench install` (or CI with the cache restored) does not rebuild. Drivers find their
binaries through the host that runs them, `host.binary(name, installs)` (lab/host.py): a binary that a
registry source declares runs from that source's cache build only (never whatever else is on PATH: the
pinned version is the one that runs); a binary an `Apt` source declares runs from Debian's directories (and
the source's `libexec` folders) only; anything else from PATH. Debian packages are
installed with apt-get and their version is the package's.

Versions: `pinned(source, version)` is the same source at another version (`tunnelbench install
nebula@1.9.0`, catalog.resolve); `source_label(source)` says where a build comes from ("go proxy",
"crates.io", "debian 1.6.1+dfsg-3").

Go builds: the module proxy answers some modules' version lists with "403 Forbidden" (headscale), and the
Go toolchain here is newer than some releases support, so versions are pinned exactly. For a module whose
version list is refused, the module is fetched by exact version with `go mod download` first, and the
build then falls back to the local module cache (`GOPROXY='<proxy>|file://$GOMODCACHE/cache/download'`).
Some releases only build inside their own module (`build_in_module`): their go.sum holds checksums of
dependencies the checksum database does not answer for, which `go install m@v` would ask it about; the
module is then downloaded (`go mod download -json`, verified) and built in its directory with
`-mod=readonly`, so every dependency is checked against the release's own go.sum.

Go toolchain: every go command of a build runs with `GOTOOLCHAIN=<GoModule.toolchain>` (default
`GO_TOOLCHAIN`), which the go command fetches from the module proxy like a module (~10 s once) whatever the
local go is; the compiler is pinned like the source, and `installed.json` records its `go version`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, TextIO, TypeGuard

# versions a user may ask for (NAME@VERSION): semver-like, optional "v", Go pseudo-versions included
VERSION_RE = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+(?:[-+][0-9A-Za-z.+-]+)?")  # ASCII (`\d`: any script)

# the Go toolchain of every Go build (GOTOOLCHAIN): served by the module proxy; scripts/setup.sh and the README's
# hand-run `go install` commands export the same value
GO_TOOLCHAIN = "go1.27.3"


def cache_root() -> Path:
    return Path(os.environ.get("TUNNELBENCH_CACHE", "/var/cache/tunnelbench"))


class InstallError(RuntimeError):
    pass


@dataclass(frozen=True)
class Apt:
    """Debian packages (apt-get install)."""

    packages: tuple[str, ...]
    binaries: tuple[str, ...] = ()
    # folders off PATH where the packages keep a declared binary (strongSwan's charon: /usr/lib/ipsec)
    libexec: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return "apt " + " ".join(self.packages)

    @property
    def name(self) -> str:
        return self.packages[0]

    def cached(self) -> bool:
        return all(_dpkg_version(p) for p in self.packages)

    def bin_dir(self) -> Path | None:
        return None

    def possible(self) -> str | None:
        if shutil.which("apt-get") is None:
            return "apt-get not found (not a Debian system)"
        missing = [p for p in self.packages if not _apt_candidate(p)]
        return f"no Debian package {', '.join(missing)} in the configured sources" if missing else None


@dataclass(frozen=True)
class GoModule:
    """`go install <package>@<version>` for each package, GOBIN in the cache."""

    name: str  # cache key
    module: str
    version: str  # exact tag, e.g. v1.102.5
    packages: tuple[str, ...]  # import paths of the commands
    binaries: tuple[str, ...]
    download_first: bool = False  # the proxy refuses the module's version list: `go mod download` first
    # (built name, installed name): `go install` names a binary after its package's last path element
    # (golang.zx2c4.com/wireguard -> "wireguard"); the driver runs it as the installed name
    renames: tuple[tuple[str, str], ...] = ()
    build_in_module: bool = False  # `go build` inside the downloaded module, checked against its go.sum
    ldflags: str = ""  # passed to the build; "{version}" is replaced by the version without its "v"
    toolchain: str = GO_TOOLCHAIN  # GOTOOLCHAIN of every go command of the build

    def go_env(self) -> dict[str, str]:
        """The environment every go command of this build runs with (on top of the caller's)."""
        return {"GOTOOLCHAIN": self.toolchain}

    @property
    def label(self) -> str:
        return f"go {self.module}@{self.version}"

    def cache_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.version.removeprefix('v')}"

    def bin_dir(self) -> Path:
        return self.cache_dir() / "bin"

    libexec: ClassVar[tuple[str, ...]] = ()  # a cache build has every binary in bin_dir

    def cached(self) -> bool:
        return all((self.bin_dir() / b).is_file() for b in self.binaries)

    def possible(self) -> str | None:
        return None if shutil.which("go") else "the Go toolchain (go) is not installed"


@dataclass(frozen=True)
class Crate:
    """`cargo install --root <cache> --version <v> [--locked] <crate>`."""

    crate: str
    version: str
    binaries: tuple[str, ...]
    locked: bool = False
    apt_build_deps: tuple[str, ...] = ()
    cache_name: str = ""  # cache key; default the crate name

    @property
    def name(self) -> str:
        return self.cache_name or self.crate

    @property
    def label(self) -> str:
        return f"cargo {self.crate} {self.version}{' --locked' if self.locked else ''}"

    def cache_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    def bin_dir(self) -> Path:
        return self.cache_dir() / "bin"

    libexec: ClassVar[tuple[str, ...]] = ()  # a cache build has every binary in bin_dir

    def cached(self) -> bool:
        return all((self.bin_dir() / b).is_file() for b in self.binaries)

    def possible(self) -> str | None:
        return None if shutil.which("cargo") else "the Rust toolchain (cargo) is not installed"


@dataclass(frozen=True)
class GoWrapper:
    """`go build` of commands of a module that does not build as `go install m@v`: its go.mod replaces modules
    with local folders its module zip lacks (k8s.io/kubernetes replaces k8s.io/api and 27 other staging modules
    with ./staging/src/...). A wrapper module of ours, committed (`wrapper`: go.mod with the replaces pointed at
    the published versions, and go.sum), requires it and names the commands as `tool` lines; the build runs in a
    copy of that folder with -mod=readonly, so every dependency is checked against the committed go.sum.

    Built at the lowest priority (`nice -n 19 chrt --idle 0`, `go build -p 1`): others on the machine keep their
    CPU; the build cache is a temporary folder deleted afterwards (Kubernetes' is ~3 GB), the module cache the
    shared one. CGO off: static binaries."""

    name: str  # cache key (cache_dir: <name>-<version without v>)
    module: str
    version: str  # exact tag, e.g. v1.34.4
    wrapper: Path  # folder with the committed go.mod and go.sum
    packages: tuple[str, ...]  # import paths of the commands, each a `tool` line of the wrapper's go.mod
    binaries: tuple[str, ...]
    ldflags: str = ""  # "{version}" is replaced by the version without its "v"
    toolchain: str = GO_TOOLCHAIN

    libexec: ClassVar[tuple[str, ...]] = ()

    def go_env(self) -> dict[str, str]:
        return {"GOTOOLCHAIN": self.toolchain, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}

    @property
    def label(self) -> str:
        return f"go {self.module}@{self.version} (wrapper module)"

    def cache_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.version.removeprefix('v')}"

    def bin_dir(self) -> Path:
        return self.cache_dir() / "bin"

    def cached(self) -> bool:
        return all((self.bin_dir() / b).is_file() for b in self.binaries)

    def possible(self) -> str | None:
        if not shutil.which("go"):
            return "the Go toolchain (go) is not installed"
        if not (self.wrapper / "go.mod").is_file() or not (self.wrapper / "go.sum").is_file():
            return f"the wrapper module is not here ({self.wrapper}: go.mod and go.sum)"
        return None


@dataclass(frozen=True)
class DebExtract:
    """Debian packages at exact versions, fetched with `apt-get download` and unpacked with `dpkg -x` into the
    cache (`<cache_dir>/debian`), never installed: `apt install containerd` would register (and may start) a
    system service. Each declared binary is linked into `<cache_dir>/bin` from where the package put it."""

    name: str  # cache key, shared with the bundle it belongs to
    version: str  # the bundle's version (the cache folder's name)
    packages: tuple[tuple[str, str], ...]  # (package, exact Debian version)
    binaries: tuple[str, ...]
    # folders of the unpacked tree searched for the declared binaries, in order
    search: tuple[str, ...] = ("usr/bin", "usr/sbin", "bin", "sbin")

    libexec: ClassVar[tuple[str, ...]] = ()

    @property
    def label(self) -> str:
        return "debian " + " ".join(f"{p}={v}" for p, v in self.packages) + " (unpacked, not installed)"

    def cache_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.version.removeprefix('v')}"

    def root(self) -> Path:
        return self.cache_dir() / "debian"

    def bin_dir(self) -> Path:
        return self.cache_dir() / "bin"

    def cached(self) -> bool:
        return (
            all((self.bin_dir() / b).exists() for b in self.binaries)
            and (self.root() / "debs.json").is_file()
        )

    def possible(self) -> str | None:
        for tool in ("apt-get", "dpkg-deb"):
            if shutil.which(tool) is None:
                return f"{tool} not found (not a Debian system)"
        missing = [f"{p}={v}" for p, v in self.packages if not _apt_has_version(p, v)]
        if missing:
            return f"not in the configured Debian sources at the pinned version: {', '.join(missing)}"
        return None


Source = Apt | GoModule | Crate


def registry(source: Source) -> TypeGuard[GoModule | Crate]:
    """A source built into the install cache (Go module proxy, crates.io), as opposed to Debian's."""
    return not isinstance(source, Apt)


def pinned(source: GoModule | Crate, version: str) -> GoModule | Crate:
    """The same registry source at another exact version ("1.9.0" or "v1.9.0"; Go versions get their "v")."""
    v = version.removeprefix("v")
    return dataclasses.replace(source, version=f"v{v}" if isinstance(source, GoModule) else v)


def source_label(source: Source) -> str:
    """Where a build comes from, as shown with versions: "go proxy", "crates.io", "debian <package version>"."""
    if isinstance(source, GoModule):
        return "go proxy"
    if isinstance(source, Crate):
        return "crates.io"
    v = _dpkg_version(source.packages[0])
    return f"debian {v}" if v else "debian (not installed)"


# -- lookups -----------------------------------------------------------------------------------------
# dpkg's answers per process (functools.cache): `dpkg-query -S` reads every package's file list, and under the
# kernel lane's TCG one question took 1-2 s (16 drivers' versions: 38 s). Only an apt-get install here changes
# them: _apt_install clears both caches.
@functools.cache
def debian_package_of(path: str) -> str | None:
    """The Debian package that installed a file (also through the /bin -> /usr/bin merge), else None."""
    if shutil.which("dpkg-query") is None:
        return None
    real = os.path.realpath(path)
    merged = [real.removeprefix("/usr") if real.startswith("/usr/") else "/usr" + real]  # /bin <-> /usr/bin
    for p in dict.fromkeys([path, real, *merged]):
        out = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True)
        if out.returncode == 0 and ":" in out.stdout:
            return out.stdout.split(":", 1)[0].split(",")[0].strip()
    return None


def upstream_version(debian_version: str) -> str:
    """The upstream part of a Debian version: "1:1.6.1+dfsg-3+b4" -> "1.6.1" (epoch, revision, repack gone)."""
    v = debian_version.split(":", 1)[-1]
    v = v.rsplit("-", 1)[0] if "-" in v else v
    return re.split(r"[+~](?:dfsg|ds|repack)", v)[0]


@functools.cache
def _dpkg_version(pkg: str) -> str | None:
    if shutil.which("dpkg-query") is None:
        return None
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", pkg], capture_output=True, text=True)
    if p.returncode != 0 or "install ok installed" not in p.stdout:
        return None
    return p.stdout.split("\t", 1)[1].strip()


def _apt_candidate(pkg: str) -> bool:
    if _dpkg_version(pkg):
        return True
    if shutil.which("apt-cache") is None:
        return False
    p = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True)
    return "Candidate:" in p.stdout and "Candidate: (none)" not in p.stdout


def debian_version(pkg: str) -> str | None:
    return _dpkg_version(pkg)


# -- installing --------------------------------------------------------------------------------------
@dataclass
class InstallResult:
    source: str
    status: str  # "cached" | "installed" | "failed"
    seconds: float
    detail: str = ""


def _run(argv: list[str], env: dict[str, str] | None, log: TextIO) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    p = subprocess.run(argv, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise InstallError(f"`{' '.join(argv)}` exited {p.returncode}")


def _apt_install(packages: tuple[str, ...], log: TextIO) -> None:
    need = [p for p in packages if not _dpkg_version(p)]
    if not need:
        return
    try:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        # wait for another apt (set-up, unattended upgrades) instead of failing at once on its lock
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
        p = subprocess.run([*apt, "install", "-y", "-qq", "--no-install-recommends", *need],
                           env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        if p.returncode != 0:  # stale package lists on a fresh machine
            _run([*apt, "update", "-qq"], env, log)
            _run([*apt, "install", "-y", "-qq", "--no-install-recommends", *need], env, log)
    finally:
        # dpkg's answers are asked again after an install, whatever it did
        debian_package_of.cache_clear()
        _dpkg_version.cache_clear()


def _go_proxy(s: GoModule) -> str:
    out = subprocess.run(
        ["go", "env", "GOPROXY"], capture_output=True, text=True, env={**os.environ, **s.go_env()}
    ).stdout.strip()
    for part in out.replace("|", ",").split(","):
        if part and part not in ("direct", "off"):
            return part
    return "https://proxy.golang.org"


def _install_go(s: GoModule, log: TextIO) -> None:
    env = {**s.go_env(), "GOBIN": str(s.bin_dir()), "GOFLAGS": "-mod=mod"}
    flags = ["-ldflags", s.ldflags.replace("{version}", s.version.removeprefix("v"))] if s.ldflags else []
    if s.build_in_module:
        log.write(f"$ go mod download -json {s.module}@{s.version}\n")
        p = subprocess.run(
            ["go", "mod", "download", "-json", f"{s.module}@{s.version}"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        log.write(p.stdout + p.stderr)
        try:
            moddir = json.loads(p.stdout)["Dir"]
        except (json.JSONDecodeError, KeyError):
            raise InstallError(
                f"`go mod download {s.module}@{s.version}` failed (exit {p.returncode})"
            ) from None
        rel = ["./" + q.removeprefix(s.module).lstrip("/") for q in s.packages]
        argv = ["go", "build", "-trimpath", *flags, "-o", str(s.bin_dir()) + "/", *rel]
        log.write(f"$ (cd {moddir} && {' '.join(argv)})\n")
        log.flush()
        b = subprocess.run(
            argv,
            cwd=moddir,
            env={**os.environ, **s.go_env(), "GOFLAGS": "-mod=readonly"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if b.returncode != 0:
            raise InstallError(f"`go build` of {s.module}@{s.version} in its module exited {b.returncode}")
    else:
        if s.download_first:
            _run(["go", "mod", "download", f"{s.module}@{s.version}"], env, log)
            modcache = subprocess.run(
                ["go", "env", "GOMODCACHE"], capture_output=True, text=True, env={**os.environ, **env}
            ).stdout.strip()
            env["GOPROXY"] = f"{_go_proxy(s)}|file://{modcache}/cache/download"
        _run(["go", "install", *flags, *(f"{p}@{s.version}" for p in s.packages)], env, log)
    for built, wanted in s.renames:
        if (s.bin_dir() / built).is_file():
            (s.bin_dir() / built).replace(s.bin_dir() / wanted)


LOW_PRIORITY = ("nice", "-n", "19", "chrt", "--idle", "0")  # a long build takes only CPU nobody else wants


def _install_go_wrapper(s: GoWrapper, log: TextIO) -> None:
    flags = ["-ldflags", s.ldflags.replace("{version}", s.version.removeprefix("v"))] if s.ldflags else []
    s.bin_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tb-gowrap-") as tmp:
        work, gocache = Path(tmp) / "module", Path(tmp) / "gocache"
        work.mkdir()
        for f in ("go.mod", "go.sum"):
            shutil.copyfile(s.wrapper / f, work / f)
        env = {**s.go_env(), "GOCACHE": str(gocache)}
        argv = [*LOW_PRIORITY, "go", "build", "-p", "1", "-trimpath", *flags, "-o", str(s.bin_dir()) + "/"]
        log.write(f"$ (cd {work} && {' '.join([*argv, *s.packages])})\n")
        log.flush()
        p = subprocess.run(
            [*argv, *s.packages], cwd=work, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        if p.returncode != 0:
            raise InstallError(
                f"`go build` of {s.module}@{s.version} in its wrapper module exited {p.returncode}"
            )
        # the build cache goes with the temporary folder; Go marks nothing in it read-only


def _apt_has_version(pkg: str, version: str) -> bool:
    if shutil.which("apt-cache") is None:
        return False
    p = subprocess.run(["apt-cache", "show", f"{pkg}={version}"], capture_output=True, text=True)
    return p.returncode == 0 and "Package:" in p.stdout


def deb_find(root: Path, name: str, search: tuple[str, ...]) -> Path | None:
    """Where an unpacked tree keeps the binary `name`: the first of the `search` folders that has it."""
    for d in search:
        if (root / d / name).is_file():
            return root / d / name
    return None


def _install_debs(s: DebExtract, log: TextIO) -> dict[str, str]:
    """Download and unpack the packages; {package file: sha256} of what was unpacked."""
    root = s.root()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    got: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tb-debs-") as tmp:
        want = [f"{p}={v}" for p, v in s.packages]
        # root downloads into a private temporary folder: apt's _apt user could not write there
        download = ["apt-get", "-o", "APT::Sandbox::User=root", "download", *want]
        p = subprocess.run(download, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
        if p.returncode != 0:  # stale package lists on a fresh machine
            _run(["apt-get", "update", "-qq"], {"DEBIAN_FRONTEND": "noninteractive"}, log)
            p = subprocess.run(download, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                raise InstallError(f"`apt-get download {' '.join(want)}` exited {p.returncode}")
        for deb in sorted(Path(tmp).glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)], None, log)
            got[deb.name] = hashlib.sha256(deb.read_bytes()).hexdigest()
    s.bin_dir().mkdir(parents=True, exist_ok=True)
    for b in s.binaries:
        found = deb_find(root, b, s.search)
        if found is None:
            raise InstallError(f"{b}: in none of {', '.join(s.search)} of the unpacked packages")
        link = s.bin_dir() / b
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(found, s.bin_dir()))
    (root / "debs.json").write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    return got


def _install_crate(s: Crate, log: TextIO) -> None:
    _apt_install(s.apt_build_deps, log)
    argv = ["cargo", "install", "--root", str(s.cache_dir()), "--version", s.version]
    if s.locked:
        argv.append("--locked")
    _run([*argv, s.crate], None, log)


def install_source(s: Source | GoWrapper | DebExtract, log: TextIO, force: bool = False) -> InstallResult:
    """Install one source into its place (the cache, or Debian's for Apt). A GoModule or Crate build records
    itself in its folder's installed.json; a GoWrapper or DebExtract is part of a bundle that records itself
    (kube/build.py)."""
    if s.cached() and not force:
        return InstallResult(s.label, "cached", 0.0, str(s.bin_dir() or "debian"))
    why = s.possible()
    if why:
        return InstallResult(s.label, "failed", 0.0, why)
    t0 = time.monotonic()
    try:
        if isinstance(s, Apt):
            _apt_install(s.packages, log)
        elif isinstance(s, GoWrapper):
            _install_go_wrapper(s, log)
        elif isinstance(s, DebExtract):
            _install_debs(s, log)
        elif isinstance(s, GoModule):
            s.bin_dir().mkdir(parents=True, exist_ok=True)
            _install_go(s, log)
        else:
            s.cache_dir().mkdir(parents=True, exist_ok=True)
            _install_crate(s, log)
    except InstallError as e:
        return InstallResult(s.label, "failed", time.monotonic() - t0, str(e))
    seconds = time.monotonic() - t0
    if not s.cached():
        return InstallResult(s.label, "failed", seconds, f"built, but binaries missing: {s.binaries}")
    if isinstance(s, GoModule | Crate):
        record = {
            "source": {"kind": type(s).__name__, **asdict(s)},
            "seconds": round(seconds, 1),
            "installed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "toolchain": _toolchain(s),
        }
        (s.cache_dir() / "installed.json").write_text(json.dumps(record, indent=2) + "\n")
    return InstallResult(s.label, "installed", seconds, str(s.bin_dir() or "debian"))


def _toolchain(s: Source) -> str:
    argv = ["go", "version"] if isinstance(s, GoModule) else ["cargo", "--version"]
    env = {**os.environ, **s.go_env()} if isinstance(s, GoModule) else None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, env=env).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
