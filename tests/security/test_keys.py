"""Key hygiene (issue 14 item 5): a real driver's secret files are checked (mode, owner, place), removed at
teardown unless kept, and every value they held is searched for in the run's outputs."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest
from synthetic_runs import make_run

from tunnelbench.catalog import DRIVERS
from tunnelbench.report.full import write_report
from tunnelbench.report.reading import read
from tunnelbench.security import keys
from tunnelbench.store import DB_NAME, Store
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh

WG_KEY = base64.b64encode(bytes(range(32))).decode()


def test_secret_values_of_key_files_and_configs(tmp_path):
    # a bare WireGuard key: the value as printed and its hex form (UAPI prints hex)
    assert keys.secret_values(f"{WG_KEY}\n".encode()) >= {WG_KEY.encode(), bytes(range(32)).hex().encode()}
    # a config: the secret's value, not the path of a key file it references, nor its other settings
    conf = b'network_secret = "Zq3xV9kTp2LmN8wR4sY6"\nkey: /run/x/hosts/h1/nebula/host.key\nport = 11010\n'
    assert keys.secret_values(conf, Path("/run/x/hosts/h1")) == {b"Zq3xV9kTp2LmN8wR4sY6"}
    pem = (
        b"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIAbc0123456789abcdefXYZ\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY\n"
    )
    pem += b"-----END EC PRIVATE KEY-----\n"
    got = keys.secret_values(pem)
    assert b"MHcCAQEEIAbc0123456789abcdefXYZQUJDREVGR0hJSktMTU5PUFFSU1RVVldY" in got  # joined, as decoded
    assert b"QUJDREVGR0hJSktMTU5PUFFSU1RVVldY" in got  # one printed line


def test_a_database_is_not_read_for_tokens_its_pem_keys_and_secrets_are(tmp_path):
    """Headscale's SQLite database holds each client's logtail LogID (public: tailscaled prints it in its log
    on every start) among node and disco keys: read as tokens, it made every tailscale run report "KEY
    MATERIAL FOUND" in tailscaled.log. Its file and its WAL (SQLite's own bytes, made here by sqlite3) give
    no token, a PEM key or a `secret = value` inside it still counts, and the same bytes outside a database
    are read as before."""
    import sqlite3

    log_id = b"c619fcf007b2d1a6851c2c4f96d17258966e6291396916172a1d5033b4945368"
    db = tmp_path / "db.sqlite"
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=wal")
    con.execute("CREATE TABLE nodes (host_info TEXT)")
    con.execute("INSERT INTO nodes VALUES (?)", (f'{{"BackendLogID": "{log_id.decode()}"}}',))
    con.commit()
    wal = (tmp_path / "db.sqlite-wal").read_bytes()
    assert log_id in wal  # the row is in the log until a checkpoint
    assert keys.secret_values(wal) == set()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = db.read_bytes()
    assert log_id in data and keys.secret_values(data) == set()
    # a secret the database spells out, and a PEM key in it, are still its values
    assert keys.secret_values(data + b"\npassword = Zq3xV9kTp2LmN8wR4sY6\n") == {b"Zq3xV9kTp2LmN8wR4sY6"}
    # the same token in a state file (no database header) is a secret value
    assert log_id in keys.secret_values(b'{"blob": "' + log_id + b'"}')


def _report_run(root: Path) -> Path:
    """A stored run with its real report.html/report.md (synthetic samples: no VPN needed for the outputs)."""
    run_dir = make_run(root, "20260101-000000-tbkeys", {"internal": (1000, 30), "fastvpn": (500, 15)}, n=3)
    rd = read([(run_dir, None)])
    write_report(rd, run_dir / "report.html", run_dir / "report.md")
    rd.close()
    return run_dir


@pytest.mark.lab
def test_nebula_keys_checked_removed_kept_and_scanned(lab_factory, tmp_path):
    cls = DRIVERS["nebula"]
    avail = cls.availability()
    if not avail.ok:
        pytest.skip(f"nebula: {avail.reason}")
    lab = lab_factory(2)
    secrets = keys.Secrets()
    sessions = {}
    for session, keep in (("", False), ("s2", True)):  # a second session of the VPN keeps its keys
        driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, session=session))
        driver.configure()
        mesh = Mesh(driver)
        try:
            mesh.start()
            mesh.wait_ready(timeout=30)
            rec = keys.check(driver, lab.run_dir)
            names = sorted(Path(f).name for f in rec["files"])
            assert "host.key" in names and "ca.key" in names and rec["violations"] == [], rec
            files = [f for h in lab.hosts for f in driver.secret_files(h)]
            assert not any(f.name.endswith((".crt", ".pub")) for f in files)
            if not session:  # a key chmod'ed world-readable is a violation, named with its mode
                os.chmod(files[0], 0o644)
                bad = keys.check(driver, lab.run_dir)["violations"]
                assert [(v["path"], v["mode"]) for v in bad] == [
                    (str(files[0].resolve().relative_to(lab.run_dir.resolve())), "0644")
                ]
        finally:
            mesh.stop()
        removed = keys.collect_and_remove(driver, secrets, keep, lab.run_dir)
        sessions[session] = (files, removed)
    files, removed = sessions[""]
    assert len(removed) == len(files) and not any(f.exists() for f in files)
    files, removed = sessions["s2"]
    assert removed == [] and all(f.exists() for f in files)
    # the scan: every value the run generated, against real outputs
    values = secrets.all()
    host_key = (lab.hosts[0].workdir / "nebula-s2" / "host.key").read_bytes()
    assert keys.secret_values(host_key) <= values and len(values) >= 8
    run_dir = _report_run(tmp_path / "results")
    clean = keys.scan_outputs(run_dir, run_dir.name, values)
    assert clean["hits"] == [] and clean["secrets"] == len(values)
    assert {"report.html", "report.md", DB_NAME, "export.csv", "export.json"} <= set(clean["outputs"])
    # a planted key (the body of a private key as a PEM prints it) in a copy of the report is found
    body = b"".join(host_key.split(b"\n")[1:-2])
    copy = run_dir / "report-copy.html"
    html = (run_dir / "report.html").read_bytes()
    at = len(html) // 2
    copy.write_bytes(html[:at] + body + html[at:])
    found = keys.scan_outputs(run_dir, run_dir.name, values, extra=[copy])
    assert any(h["output"] == "report-copy.html" and h["offset"] == at for h in found["hits"]), found
    assert body.decode() not in repr(found)  # the result never holds the secret
    # ... and in the store
    st = Store(run_dir / DB_NAME)
    st.set_env(run_dir.name, {"note": "oops " + body.decode()})
    st.close()
    hits = keys.scan_outputs(run_dir, run_dir.name, values)["hits"]
    assert {h["output"] for h in hits} >= {DB_NAME, "export.json"}
    shutil.rmtree(run_dir)
