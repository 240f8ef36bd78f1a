"""The Security section of the summary and the report: one row per VPN (and version), one column per check, each "pass",
"fail" or "not run" with its evidence. Read from what the run stored: the `leak` workload's metrics
(leak_pass at the router, relay_verdict at the relay), the router's off-lab drops while the VPN's mesh was up
(`offlab_drops.<vpn>`), the key-hygiene record (`keys.<vpn>`), the output key scan (`keys.scan`), the `acl`
workload's acl_enforced and the `revoke` workload's revocation_s (or its failed cases' "still reachable").
"not supported" comes from the driver's capabilities as the run recorded them with the VPN (`acl`, `revocation`;
today's driver for a run from before), so it holds even where no case ran."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tunnelbench.analysis.analyze import RunData
from tunnelbench.analysis.records import json_value

NOT_RUN = ("not run", "")
SKIPPED = "skipped: "  # a skipped case's reason, as evidence of a "not run" cell
VERDICTS = {0: "fail: plaintext at the relay", 1: "pass: metadata only", 2: "not supported: nothing crossed"}
COLUMNS = ("plaintext leak", "relay", "off-lab drops", "key hygiene", "ACL", "revocation")
NOT_SUPPORTED = ("not supported", "")
# the columns whose "not supported" counts as a result only when the run had the check's workload: otherwise
# every run would get a Security table full of not-supported cells
CHECK_WORKLOAD = {"ACL": "acl", "revocation": "revoke"}
GOOD = ("pass", "enforced", "cut off")
BAD = ("fail", "NOT enforced", "still reachable", "error")


def tone(verdict: str) -> str:
    """ok / bad / muted: how a renderer colours a verdict (the ACL and revocation ones are not pass/fail)."""
    return "bad" if verdict.startswith(BAD) else "ok" if verdict.startswith(GOOD) else "muted"


def security_rows(run: RunData) -> list[dict[str, Any]]:
    """Per VPN: {"vpn", "version", "cells": {column: (verdict, evidence)}}; empty when no check ran."""
    ok = {c.id: c for c in run.cases if c.status == "ok"}
    per: dict[str, dict[str, list[tuple[float, str]]]] = defaultdict(lambda: defaultdict(list))
    for m in run.metrics:
        c = ok.get(m["case_id"])
        if c is not None and c.workload in ("leak", "acl", "revoke") and m["host"] is None:
            per[c.vpn][m["name"]].append((m["value"], c.artifact_dir))
    ran = {c.workload for c in run.cases}
    done = {(c.vpn, c.profile, c.label, c.repetition) for c in ok.values()}
    # vpn -> workload -> errors of failed attempts whose repetition never succeeded (a passing retry
    # supersedes them)
    errors: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for c in run.cases:
        if c.status != "ok" and c.error and (c.vpn, c.profile, c.label, c.repetition) not in done:
            first = c.error.strip().splitlines()[0].removeprefix("WorkloadError: ")
            errors[c.vpn][c.workload].append(f"{SKIPPED}{first}" if c.status in ("skipped", "n/a") else first)
    rows = []
    for v in run.vpns:
        vpn = v["name"]
        cells = {col: NOT_RUN for col in COLUMNS}
        got = per.get(vpn, {})
        if got.get("leak_pass"):
            frames = sum(x for x, _ in got.get("leak_plaintext_frames", []))
            failed = [d for x, d in got["leak_pass"] if x != 1]
            where = _rel(run, (failed or [d for _, d in got["leak_pass"]])[0]) + "/leak.json"
            n = len(got["leak_pass"])
            cells["plaintext leak"] = (
                f"fail ({len(failed)}/{n})" if failed else f"pass ({n}/{n})",
                f"{frames:.0f} plaintext frame(s) matched; {where}",
            )
        if got.get("relay_verdict"):
            worst = min(int(x) for x, _ in got["relay_verdict"])
            d = next(d for x, d in got["relay_verdict"] if int(x) == worst)
            frames = sum(x for x, _ in got.get("relay_plaintext_frames", []))
            cells["relay"] = (
                VERDICTS.get(worst, str(worst)),
                f"{frames:.0f} plaintext frame(s); {_rel(run, d)}/leak.json",
            )
        drops = json_value(run.env.get(f"offlab_drops.{vpn}"), keep_text=False)
        if isinstance(drops, int | float) and not isinstance(drops, bool):
            ev = f"{drops:.0f} packet(s) dropped at the router"
            raw = json_value(run.env.get(f"offlab_dests.{vpn}"), keep_text=False)
            dests = (
                {str(a): n for a, n in raw.items() if isinstance(n, int | float)}
                if isinstance(raw, dict)
                else {}
            )
            if dests:  # where the VPN tried to go, most packets first
                top = sorted(dests.items(), key=lambda kv: -kv[1])
                ev += (
                    ", to "
                    + ", ".join(f"{a} ({n})" for a, n in top[:5])
                    + (f" and {len(top) - 5} more address(es)" if len(top) > 5 else "")
                )
            cells["off-lab drops"] = ("pass" if int(drops) == 0 else "fail", ev)
        k = run.records.keys.get(vpn)
        if isinstance(k, dict):  # a record that is not one (damaged, text) is no verdict either way
            bad = [b for b in k.get("violations", []) if isinstance(b, dict)]
            ev = f"{k.get('files_checked', 0)} file(s) checked, {len(bad)} violation(s)"
            ev += "".join(f"; {b.get('path')} {b.get('mode')}: {b.get('why')}" for b in bad[:3])
            ev += "; kept" if k.get("kept") else f"; {len(k.get('removed', []))} removed at teardown"
            if k.get("error"):
                ev = f"check failed: {k['error']}"
            verdict = (
                "fail" if bad or k.get("error") else "pass" if k.get("files_checked") else "no key files"
            )
            cells["key hygiene"] = (verdict, ev)
        caps = run.capabilities(vpn)
        cells["ACL"] = _acl(run, got, errors[vpn]["acl"], caps is not None and not caps.get("acl"))
        cells["revocation"] = _revocation(
            run, got, errors[vpn]["revoke"], caps is not None and caps.get("revocation") is None
        )
        shown = [
            c
            for col, c in cells.items()
            if c != NOT_RUN and (c != NOT_SUPPORTED or CHECK_WORKLOAD.get(col, "") in ran)
        ]
        if shown:
            tones = {col: tone(verdict) for col, (verdict, _) in cells.items()}
            rows.append({"vpn": vpn, "version": v["version"] or "", "cells": cells, "tones": tones})
    return rows


def _acl(run: RunData, got: dict[str, Any], errors: list[str], unsupported: bool) -> tuple[str, str]:
    if unsupported:
        return NOT_SUPPORTED
    if got.get("acl_enforced"):
        vals = got["acl_enforced"]
        bad = [d for x, d in vals if x != 1]
        blocked, allowed = (
            min((x for x, _ in got.get(k, [])), default=float("nan"))
            for k in ("acl_denied_blocked", "acl_allowed_ok")
        )
        ev = f"denied flows blocked {blocked:.0%}, allowed flows ok {allowed:.0%} (worst case)"
        ev += f"; {_rel(run, (bad or [d for _, d in vals])[0])}/acl.json"
        n = len(vals)
        return (f"NOT enforced ({len(bad)}/{n})" if bad else f"enforced ({n}/{n})", ev)
    return ("not run", f"case failed: {errors[0]}") if errors else NOT_RUN


def _revocation(run: RunData, got: dict[str, Any], errors: list[str], unsupported: bool) -> tuple[str, str]:
    if unsupported:
        return NOT_SUPPORTED
    reachable = [e for e in errors if "still reachable" in e]
    if reachable:  # one repetition the revoked host kept its access is the verdict, however many cut it off
        return (
            f"still reachable ({len(reachable)}/{len(reachable) + len(got.get('revocation_s', []))})",
            reachable[0],
        )
    if got.get("revocation_s"):
        vals = got["revocation_s"]
        worst, d = max(vals)
        n = len(vals)
        return f"cut off in {worst:.1f} s", f"worst of {n} case(s); {_rel(run, d)}"
    if errors and errors[0].startswith(SKIPPED):  # never ran (unavailable here): no verdict either way
        return "not run", errors[0]
    return ("error", errors[0]) if errors else NOT_RUN


def key_scan(run: RunData) -> tuple[str, bool] | None:
    """The output key scan's line and whether it passed; None when the run had none."""
    s = run.records.key_scan
    if s is None:
        return None
    if not isinstance(s, dict) or not isinstance(s.get("hits"), list):
        return f"the key scan's record is unreadable ({str(s)[:80]!r})", False
    if s["hits"]:
        where = ", ".join(
            f"{h.get('output')} at byte {h.get('offset')}" for h in s["hits"][:8] if isinstance(h, dict)
        )
        return f"key material found in the outputs: {where}", False
    outputs = ", ".join(str(o) for o in s.get("outputs", []) if isinstance(o, str))
    return f"no key material in the outputs ({s.get('secrets')} secret values; {outputs})", True


def _rel(run: RunData, path: str) -> str:
    try:
        from pathlib import Path

        return str(Path(path).relative_to(run.run_dir))
    except ValueError:
        return path
