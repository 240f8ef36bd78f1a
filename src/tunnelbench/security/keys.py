"""Key hygiene (a security conformance check): every file a driver declares secret (`VpnDriver.secret_files`) is
mode 0600 or stricter, owned by root and inside the run folder while the mesh is up; it is removed when the
mesh session stops (unless `[run] keep_keys`), and the values it held are redacted from the session's logs (a
daemon may log its config: EasyTier its network secret); and no secret value appears in the run's outputs
(report.html, report.md, the SQLite store, the CSV/JSON exports, the logs kept in the run folder).

A run killed before its sessions ended leaves its secret files: `tunnelbench clean` and `run --resume` sweep
them from its folder (`sweep_run`, registered with the lab's clean: lab/journal.py `register_sweep`).

Secret values live only in memory (a `Secrets` set) between a session's teardown and the scan at the end of the
run: nothing here ever writes one, and a scan result names the output and offset of a hit, never the value."""

from __future__ import annotations

import base64
import binascii
import contextlib
import fnmatch
import os
import re
import sqlite3
import stat
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.host import Host
from tunnelbench.lab.journal import register_sweep
from tunnelbench.vpns.base import VpnDriver, secret_name

MIN_SECRET = 12  # shorter values (ports, "true", key ids) would match by chance
PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----(.*?)-----END \1-----", re.S)
# key = value / key: "value" / key value / /PASSWORD:value, for names that say "secret"
KV = re.compile(
    rb"(?i)(?:secret|password|passwd|psk|private[-_ ]?key|privatekey)[\"']?\s*(?:[:=]\s*|\s+)[\"']?"
    rb"(?:0x)?([A-Za-z0-9+/=_.~-]{%d,})" % MIN_SECRET
)
TOKEN = re.compile(rb"[A-Za-z0-9+/=_-]{32,}")  # long random-looking runs: state files, key batches
# SQLite's file header and its write-ahead log's magic numbers (sqlite.org/fileformat2.html)
DATABASE_MAGIC = (b"SQLite format 3\0", b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")


@dataclass
class Secrets:
    """The secret values of a run, per VPN (in memory only)."""

    values: dict[str, set[bytes]] = field(default_factory=dict)

    def add(self, vpn: str, found: set[bytes]) -> None:
        self.values.setdefault(vpn, set()).update(found)

    def all(self) -> set[bytes]:
        return {v for vs in self.values.values() for v in vs}


def secret_values(data: bytes, workdir: Path | None = None) -> set[bytes]:
    """The secret values in one secret file: PEM private key bodies (as printed, joined, and each line),
    key = value secrets, the whole content of a one-token file, else long random-looking tokens; each
    base64 32/64-byte key also as hex and each such hex key also as base64 (tools print either).

    A database (SQLite, or its write-ahead log) is secret as a file (mode, removal, sweep) but not read for
    long tokens: most of Headscale's are public (node and disco keys, each client's logtail LogID, which
    tailscaled prints in its log on every start), and the secret it holds, the pre-auth key, is the
    driver's `authkey` file too. Its PEM keys and `key = value` secrets are still read."""
    out: set[bytes] = set()
    database = data.startswith(DATABASE_MAGIC)
    for m in PEM.finditer(data):
        body = m.group(2).strip()
        out.add(m.group(0))
        out.add(b"".join(body.split()))
        out.update(line for line in body.split() if len(line) >= MIN_SECRET)
    text = PEM.sub(b"", data)
    # a value that is a path into the host's folder is a reference to a key file, not a key
    here = str(workdir).encode() if workdir else b"\0"
    out.update(v for v in KV.findall(text) if not v.startswith((b"/", here)))
    stripped = text.strip()
    if not database and stripped and len(stripped.split()) == 1 and len(stripped) >= MIN_SECRET:
        out.add(stripped)
    if not out and not database:
        # a path is a run of word characters and slashes too: base64 without + or = that holds a / is one
        out.update(t for t in TOKEN.findall(text) if b"/" not in t or b"+" in t or b"=" in t)
    for v in list(out):
        out.update(_other_forms(v))
    return {v for v in out if len(v) >= MIN_SECRET}


def _other_forms(v: bytes) -> set[bytes]:
    if re.fullmatch(rb"[0-9a-fA-F]{64}|[0-9a-fA-F]{128}", v):
        return {base64.b64encode(bytes.fromhex(v.decode()))}
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        return set()
    return {raw.hex().encode()} if len(raw) in (32, 64) else set()


def _stat(host: Host, files: list[Path]) -> list[tuple[Path, int, int, str]]:
    """(path, mode, uid, resolved path) of each file, in one or two commands per host."""
    st = host.run(["stat", "-L", "-c", "%a\t%u\t%n", *map(str, files)], check=False).stdout.splitlines()
    real = host.run(["readlink", "-f", *map(str, files)], check=False).stdout.splitlines()
    out = []
    for line, r in zip(st, real, strict=False):
        mode, uid, name = line.split("\t", 2)
        out.append((Path(name), int(mode, 8), int(uid), r))
    return out


def check(driver: VpnDriver, run_dir: Path) -> dict[str, Any]:
    """The key-hygiene record of a mesh that is up: every secret file's mode (no group/other bits), owner
    (uid 0) and place (inside the run folder: the host's own folder for an SSH host)."""
    files: list[str] = []
    violations: list[dict[str, Any]] = []
    for host, _d in driver.host_dirs():
        paths = driver.secret_files(host)
        if not paths:
            continue
        root = str(host.workdir if host.remote else run_dir.resolve())
        for path, mode, uid, real in _stat(host, paths):
            shown = _shown(host, path, run_dir)
            files.append(shown)
            why = []
            if mode & 0o077:
                why.append(f"mode {mode:04o} (group/other bits)")
            if uid != 0:
                why.append(f"owner uid {uid}, not root")
            if not (real + "/").startswith(root.rstrip("/") + "/"):
                why.append(f"outside the run folder ({real})")
            if why:
                violations.append({"path": shown, "mode": f"{mode:04o}", "uid": uid, "why": "; ".join(why)})
    return {"files_checked": len(files), "files": files, "violations": violations}


def collect_and_remove(driver: VpnDriver, secrets: Secrets, keep: bool, run_dir: Path) -> list[str]:
    """After a mesh session's stop: read every secret value into `secrets` (memory only), remove the secret
    files unless `keep`, and redact the values from the session's logs (kept or not: a log is an output).
    Only this session's folders are touched: a later session of the same VPN gets fresh ones
    (MeshSpec.session). Returns the removed files."""
    removed: list[str] = []
    for host, d in driver.host_dirs():
        values: set[bytes] = set()
        for path in driver.secret_files(host):
            try:
                values |= secret_values(host.read_file(path), d)
            except OSError:
                continue
            if not keep:
                host.remove(path)
                removed.append(_shown(host, path, run_dir))
        secrets.add(driver.key, values)
        if values:
            logs = host.run(["find", str(d), "-type", "f", "-name", "*.log"], check=False).stdout.splitlines()
            for log in logs:
                redact_on(host, Path(log), values)
    return removed


def session_secrets(driver: VpnDriver) -> set[bytes]:
    """The secret values of a mesh session's files, read without removing them."""
    out: set[bytes] = set()
    for host, d in driver.host_dirs():
        for path in driver.secret_files(host):
            try:
                out |= secret_values(host.read_file(path), d)
            except OSError:
                continue
    return out


REDACTED = b"[secret redacted by tunnelbench]"


def _redacted(data: bytes, secrets: set[bytes]) -> tuple[bytes, int]:
    """`data` with every secret value replaced, longest first (a value inside a longer one goes with it)."""
    n = 0
    for v in sorted(secrets, key=len, reverse=True):
        if v and v in data:
            n += data.count(v)
            data = data.replace(v, REDACTED)
    return data, n


def redact(path: Path, secrets: set[bytes]) -> int:
    """Replace every secret value in a local file kept for the report (a daemon log: EasyTier logs its config
    with network_secret). The file is replaced (a new 0600 file renamed over it), never written through: a
    symlink or a hard link to another file is left as it is. Returns the count."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return 0
        data, n = _redacted(path.read_bytes(), secrets)
    except OSError:
        return 0
    if n:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)
            raise
    return n


def redact_on(host: Host, path: Path, secrets: set[bytes]) -> int:
    """`redact` on a host: a local path here; on an SSH host, read, redacted and written back there (0600)."""
    if not host.remote:
        return redact(path, secrets)
    try:
        data, n = _redacted(host.read_file(path), secrets)
        if n:
            host.write_file(path, data, 0o600)
    except OSError:
        return 0
    return n


# -- a killed run's secret files (`clean`, `run --resume`) -------------------------------------------------
def _driver_patterns(folder: str) -> tuple[str, ...]:
    """The secret patterns of the driver whose session folder this is (`VpnDriver.host_dir`: its dirname,
    a version after "@" as "-", a session after "-"); none for a folder of no known driver."""
    best: tuple[int, tuple[str, ...]] = (0, ())
    for cls in DRIVERS.values():
        d = cls.dirname()
        if (folder == d or folder.startswith(d + "-")) and len(d) > best[0]:
            best = (len(d), cls.secret_patterns)
    return best[1]


def _keeps_keys(run_dir: Path) -> bool:
    """The run's `[run] keep_keys`, from the scenario it ran (its folder's scenario.toml)."""
    try:
        run = tomllib.loads((run_dir / "scenario.toml").read_text()).get("run", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(run, dict) and run.get("keep_keys") is True


def _files(folder: Path) -> list[Path]:
    """The regular files under a folder, symlinks (to files or folders) not followed."""
    out = []
    for dirpath, _dirs, names in os.walk(folder):  # os.walk never descends into a symlinked folder
        for n in names:
            p = Path(dirpath) / n
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(p).st_mode):
                    out.append(p)
    return sorted(out)


def sweep_run(run_dir: Path) -> list[str]:
    """What a killed run's sessions never removed, from its folder on this machine: in every host's session
    folder (hosts/<host>/<driver dirname>[-<session>]/), the files the key scan calls secret (SECRET_PATTERNS
    and the driver's own) are removed (unless the run's scenario kept its keys) and the values they held
    redacted from the folder's logs. Nothing outside the run folder is touched: symlinks are not followed.
    Returns what was done."""
    root = run_dir.resolve()
    hosts = root / "hosts"
    if not hosts.is_dir() or hosts.is_symlink():
        return []
    keep = _keeps_keys(root)
    done: list[str] = []
    for host_dir in sorted(hosts.iterdir()):
        if host_dir.is_symlink() or not host_dir.is_dir():
            continue
        for session in sorted(host_dir.iterdir()):
            if session.is_symlink() or not session.is_dir():
                continue
            pats = _driver_patterns(session.name)
            files = _files(session)
            values: set[bytes] = set()
            for f in files:
                if not secret_name(f.name, pats):
                    continue
                with contextlib.suppress(OSError):
                    values |= secret_values(f.read_bytes(), session)
                if not keep:
                    f.unlink(missing_ok=True)
                    done.append(f"secret file {f.relative_to(root)}")
            for f in files:
                if fnmatch.fnmatch(f.name.lower(), "*.log") and (n := redact(f, values)):
                    done.append(f"{n} secret value(s) redacted from {f.relative_to(root)}")
    return done


register_sweep(sweep_run)


def _shown(host: Host, path: Path, run_dir: Path) -> str:
    if host.remote:
        return f"{host.name}:{path}"
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)


def _find_all(name: str, data: bytes, secrets: set[bytes], hits: list[dict[str, Any]]) -> None:
    for s in secrets:
        at = data.find(s)
        if at >= 0:
            hits.append({"output": name, "offset": at, "length": len(s)})


def sqlite_bytes(db: Path) -> tuple[bytes, bytes]:
    """The store's raw file after a WAL checkpoint (the WAL too, if any is left), and a logical dump: a value
    longer than a page is split over overflow pages in the file, whole in the dump."""
    con = sqlite3.connect(db, timeout=30)
    try:
        # a checkpoint that cannot be written (a full disk) leaves the WAL, which is read below with the file
        with contextlib.suppress(sqlite3.OperationalError):
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        dump = "\n".join(con.iterdump()).encode()
    finally:
        con.close()
    raw = db.read_bytes()
    wal = db.with_name(db.name + "-wal")
    if wal.exists():
        raw += wal.read_bytes()
    return raw, dump


def scan_outputs(
    run_dir: Path, run_id: str, secrets: set[bytes], extra: list[Path] | None = None
) -> dict[str, Any]:
    """Search report.html, report.md, the logs kept in the run folder, the SQLite store and the run's CSV and
    JSON exports (rendered here as `tunnelbench export` would) for every secret value. The result names outputs
    and offsets, never values."""
    from tunnelbench.analysis.analyze import load_run
    from tunnelbench.report.export import metric_rows, to_csv, to_json
    from tunnelbench.store import DB_NAME

    hits: list[dict[str, Any]] = []
    scanned: list[str] = []
    for p in [run_dir / "report.html", run_dir / "report.md", *(extra or [])]:
        if p.exists():
            scanned.append(p.name)
            _find_all(p.name, p.read_bytes(), secrets, hits)
    for p in sorted(
        run_dir.rglob("*.log")
    ):  # daemon logs kept in the run folder (a daemon may log its secret)
        if p.is_file() and not p.is_symlink():
            name = str(p.relative_to(run_dir))
            scanned.append(name)
            _find_all(name, p.read_bytes(), secrets, hits)
    raw, dump = sqlite_bytes(run_dir / DB_NAME)
    _find_all(DB_NAME, raw, secrets, hits)
    _find_all(f"{DB_NAME} (dump)", dump, secrets, hits)
    run = load_run(run_dir, run_id)
    try:
        _find_all("export.csv", to_csv(metric_rows(run)).encode(), secrets, hits)
        _find_all("export.json", to_json(run, series=True).encode(), secrets, hits)
    finally:
        run.store.close()
    scanned += [DB_NAME, "export.csv", "export.json"]
    return {"outputs": scanned, "secrets": len(secrets), "hits": hits}


def scan_line(result: dict[str, Any]) -> tuple[str, str]:
    """The terminal line of a scan result and its style."""
    if not result.get("secrets"):
        return (
            "key scan: no key material was collected (no secret files, or keys kept off the scan)",
            "yellow",
        )
    n, outs = result["secrets"], len(result["outputs"])
    if not result["hits"]:
        return f"key scan: no key material in the outputs ({n} secret values, {outs} outputs)", "green"
    where = ", ".join(f"{h['output']} @{h['offset']}" for h in result["hits"][:8])
    return f"key scan: KEY MATERIAL FOUND in the outputs: {where}", "bold red"
