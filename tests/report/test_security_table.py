"""The report's Security table (report/security.py): hand-made cases and metrics give known cells, among them the
ACL and revocation columns with their "not supported" (from the driver class) and failed-case verdicts; the
terminal, HTML and Markdown renderers show them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from synthetic_runs import make_run

from tunnelbench.analysis.analyze import RunData
from tunnelbench.core.results import Outcome
from tunnelbench.report.full import render_markdown, render_report
from tunnelbench.report.reading import read
from tunnelbench.report.security import NOT_RUN, NOT_SUPPORTED, security_rows
from tunnelbench.report.terminal import print_security
from tunnelbench.store import DB_NAME, CaseRow, Store

STILL = "WorkloadError: still reachable 31.0 s after revocation (cap 30 s): last echo reply at +31.0 s"
# vpn -> (workload, status, error, metrics) per case, one repetition each unless retried
CASES: dict[str, list[tuple[str, str, str | None, dict[str, float]]]] = {
    "nebula": [
        ("acl", "ok", None, {"acl_enforced": 1, "acl_denied_blocked": 1, "acl_allowed_ok": 1}),
        ("revoke", "ok", None, {"revocation_s": 0.42}),
        ("leak", "ok", None, {"leak_pass": 0, "leak_plaintext_frames": 3}),
    ],  # a leak in the same row
    "tailscale": [
        ("acl", "ok", None, {"acl_enforced": 0, "acl_denied_blocked": 0.5, "acl_allowed_ok": 1}),
        ("revoke", "failed", STILL, {}),
    ],
    "wireguard-go": [
        ("acl", "failed", "WorkloadError: wireguard-go has no access control in this lab", {}),
        ("revoke", "failed", "WorkloadError: timed out", {}),  # a retry that passed supersedes it
        ("revoke", "ok", None, {"revocation_s": 1.25}),
    ],
    "tinc": [],  # neither ACLs nor revocation: its row says so because the run had both checks
}


def hand_made_run(tmp_path: Path, cases: dict = CASES) -> RunData:
    rows, metrics = [], []
    for vpn, cs in cases.items():
        for i, (wl, status, error, ms) in enumerate(cs):
            cid = len(rows) + 1
            adir = str(tmp_path / "cases" / vpn / "baseline" / wl / f"r1a{i}")
            rows.append(
                CaseRow(
                    cid, "r", vpn, "baseline", wl, wl, {}, 1, i, status, error, 0.0, 1.0, "h1", "h2", adir
                )
            )
            metrics += [
                {"case_id": cid, "name": k, "value": float(v), "unit": "", "host": None}
                for k, v in ms.items()
            ]
    vpns = [{"name": v, "version": "1.0"} for v in cases]
    return RunData(tmp_path, "r", {}, {}, vpns, rows, metrics, {}, None)  # type: ignore[arg-type]


def test_acl_and_revocation_cells(tmp_path):
    rows = {r["vpn"]: r for r in security_rows(hand_made_run(tmp_path))}
    assert list(rows) == ["nebula", "tailscale", "wireguard-go", "tinc"]
    neb, ts, wg, tinc = (rows[v]["cells"] for v in rows)
    assert neb["ACL"] == (
        "enforced (1/1)",
        "denied flows blocked 100%, allowed flows ok 100% (worst case); "
        "cases/nebula/baseline/acl/r1a0/acl.json",
    )
    assert neb["revocation"] == ("cut off in 0.4 s", "worst of 1 case(s); cases/nebula/baseline/revoke/r1a1")
    assert neb["plaintext leak"] == (
        "fail (1/1)",
        "3 plaintext frame(s) matched; cases/nebula/baseline/leak/r1a2/leak.json",
    )
    assert ts["ACL"][0] == "NOT enforced (1/1)" and "denied flows blocked 50%" in ts["ACL"][1]
    assert ts["revocation"] == ("still reachable (1/1)", STILL.removeprefix("WorkloadError: "))
    assert wg["ACL"] == NOT_SUPPORTED and wg["revocation"][0] == "cut off in 1.2 s"  # acl_support False
    assert tinc["ACL"] == tinc["revocation"] == NOT_SUPPORTED and tinc["key hygiene"] == NOT_RUN
    assert rows["nebula"]["tones"]["ACL"] == "ok" and rows["tailscale"]["tones"]["ACL"] == "bad"
    assert rows["tailscale"]["tones"]["revocation"] == "bad" and rows["tinc"]["tones"]["ACL"] == "muted"


def test_not_supported_comes_from_what_the_run_recorded_not_todays_driver(tmp_path):
    """The run recorded each VPN's capabilities with it (vpn settings "capabilities"): a wireguard-go recorded
    with ACLs and a tinc recorded with a revocation are judged by that record, though today's drivers have
    neither; a record without capabilities (a run from before) falls back to today's driver."""
    import dataclasses
    import json

    run = hand_made_run(tmp_path)
    recorded = {
        "wireguard-go": {"capabilities": {"acl": True, "revocation": "delete the peer"}},
        "tinc": {"capabilities": {"acl": False, "revocation": "remove the host file"}},
        "nebula": {"capabilities": {"acl": False, "revocation": None}},
    }
    vpns = [{**v, "settings": json.dumps(recorded.get(v["name"], {}))} for v in run.vpns]
    rows = {r["vpn"]: r["cells"] for r in security_rows(dataclasses.replace(run, vpns=vpns))}
    assert rows["wireguard-go"]["ACL"] == (
        "not run",
        "case failed: wireguard-go has no access control in this lab",
    )
    assert rows["tinc"]["ACL"] == NOT_SUPPORTED and rows["tinc"]["revocation"] == NOT_RUN
    assert rows["nebula"]["ACL"] == rows["nebula"]["revocation"] == NOT_SUPPORTED
    assert rows["tailscale"]["ACL"][0] == "NOT enforced (1/1)"  # no record: today's tailscale has ACLs


def test_not_supported_alone_makes_no_table(tmp_path):
    # a run without the acl and revoke checks: the drivers' "not supported" is no reason for a Security table
    run = hand_made_run(tmp_path, {"tinc": [("tcp", "ok", None, {"goodput_mbps": 900})]})
    assert security_rows(run) == []
    # an acl case that failed without a verdict is "not run", with the error as evidence
    run = hand_made_run(tmp_path, {"nebula": [("acl", "failed", "WorkloadError: policy not applied: x", {})]})
    assert security_rows(run)[0]["cells"]["ACL"] == ("not run", "case failed: policy not applied: x")


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_renderers_show_the_new_columns(tmp_path):
    run_dir = make_run(tmp_path, "20260101-000000-tbsec", {"nebula": (500, 15), "tinc": (400, 10)}, n=2)
    st = Store(run_dir / DB_NAME)
    for vpn, wl, ms in (("nebula", "acl", {"acl_enforced": 0, "acl_denied_blocked": 0.5, "acl_allowed_ok": 1}),
                        ("nebula", "revoke", {"revocation_s": 2.5})):  # fmt: skip
        cid = st.start_case(run_dir.name, vpn, "baseline", wl, wl, {}, 1, 0, "h1", "h2", run_dir / wl)
        out = Outcome()
        for k, v in ms.items():
            out.add(k, v)
        st.finish_case(cid, "ok", out)
    st.close()
    rd = read([(run_dir, None)])
    html = render_report(rd)
    assert '<th class="l">ACL</th><th class="l">revocation</th>' in html
    assert (
        '<span class="bad">NOT enforced (1/1)</span>' in html
        and '<span class="ok">cut off in 2.5 s</span>' in html
    )
    assert '<span class="muted">not supported</span>' in html  # tinc
    md = render_markdown(rd)
    assert "| ACL | revocation |" in md and "NOT enforced (1/1) (denied flows blocked 50%" in md
    buf = io.StringIO()
    st = Store(run_dir / DB_NAME)
    sec = rd.security[run_dir.name]
    print_security(sec.rows, sec.scan, Console(file=buf, width=400))
    rd.close()
    st.close()
    text = buf.getvalue()
    assert "NOT enforced (1/1)" in text and "cut off in 2.5 s" in text and "not supported" in text


def test_a_skipped_check_is_not_run_with_its_reason_not_an_error(tmp_path):
    run = hand_made_run(
        tmp_path, {"wireguard-go": [("revoke", "skipped", "this kernel has no WireGuard", {})]}
    )
    (row,) = security_rows(run)
    assert row["cells"]["revocation"] == ("not run", "skipped: this kernel has no WireGuard")
    assert row["tones"]["revocation"] == "muted"
    run = hand_made_run(
        tmp_path / "b", {"wireguard-go": [("revoke", "failed", "WorkloadError: timed out", {})]}
    )
    assert security_rows(run)[0]["cells"]["revocation"] == ("error", "timed out")


def test_offlab_evidence_names_the_destinations_most_packets_first(tmp_path):
    import dataclasses
    import json

    run = hand_made_run(tmp_path, {"nebula": [("leak", "ok", None, {"leak_pass": 1})]})
    dests = {f"198.51.100.{i}": i for i in range(1, 8)}
    run = dataclasses.replace(
        run, env={"offlab_drops.nebula": "28", "offlab_dests.nebula": json.dumps(dests)}
    )
    (row,) = security_rows(run)
    assert row["cells"]["off-lab drops"] == (
        "fail",
        "28 packet(s) dropped at the router, to 198.51.100.7 (7), "
        "198.51.100.6 (6), 198.51.100.5 (5), 198.51.100.4 (4), 198.51.100.3 (3) and 2 more address(es)",
    )


@pytest.mark.parametrize(
    "env",
    [
        {"keys.nebula": "not json"},
        {"keys.nebula": "null"},
        {"keys.nebula": '{"violations": ["x"], "files_checked": 2}'},
        {"keys.scan": "text"},
        {"keys.scan": '{"hits": "oops"}'},
        {"offlab_drops.nebula": "lots", "offlab_dests.nebula": "{bad"},
        {"offlab_drops.nebula": "3", "offlab_dests.nebula": '["1.2.3.4"]'},
    ],
)
def test_a_damaged_security_record_is_no_verdict_not_a_traceback(tmp_path, env):
    """Values a store may hold that the writers never wrote (text, another JSON type): the table is still
    drawn, without the damaged cell's verdict; the key scan says its record is unreadable."""
    import dataclasses

    from tunnelbench.report.security import key_scan

    run = hand_made_run(tmp_path, {"nebula": [("leak", "ok", None, {"leak_pass": 1})]})
    run = dataclasses.replace(run, env=env)
    (row,) = security_rows(run)
    assert row["cells"]["plaintext leak"][0].startswith("pass")
    if env.get("offlab_drops.nebula") == "3":
        assert row["cells"]["off-lab drops"] == ("fail", "3 packet(s) dropped at the router")
    if "keys.nebula" in env and "violations" in env["keys.nebula"]:
        assert row["cells"]["key hygiene"][0] == "pass"  # a violation that is not a record is not counted
    scan = key_scan(run)
    if "keys.scan" in env:
        assert scan is not None and scan[1] is False and "unreadable" in scan[0]
