"""The NAT-traversal matrix (`tunnelbench nat-matrix`): for each NAT-capable VPN and each pair of NAT types
(h1 behind one, h2 behind the other, the relay host h3 public), does the VPN get h1 -> h2 traffic through,
and which way: straight between the two NATs (hole punched), through another host, or not at all.

One cell = a fresh 3-host `nat` lab with `nat_types = {h1 = T1, h2 = T2}`, the VPN's mesh up (readiness
timeout READY_S), a warm-up of pings over the tunnel (WARMUP: Tailscale and EasyTier start relayed and move
to a direct path after their probes, which takes a few seconds), then a measured ping flood h1 -> h2
(PINGS x SIZE B, ~0.5 MB each way) with the router's path counters (lab/pathcheck.PathWatch) around it:
  direct   >= 80% of the h1<->h2 underlay bytes went straight between the two NATs' public addresses,
  relayed  <= 20% (the rest via the relay host or another node),
  mixed    in between (the path changed during the flood),
  failed   the mesh did not come up, or fewer than half the measured pings were answered.
The thresholds are pathcheck's DIRECT_MIN_PCT / RELAY_MAX_PCT.

Each VPN's row is stored as a probed fact of its feature record (`nat_matrix`, vpns/features.py), so a
run's report shows the matrix last measured on this machine, with the date and version."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunnelbench.catalog import DRIVERS
from tunnelbench.core.files import check_destination, write_atomic
from tunnelbench.lab.make import lab_session
from tunnelbench.lab.netns import NAT_TYPES, NetnsLab
from tunnelbench.lab.pathcheck import DIRECT_MIN_PCT, RELAY_MAX_PCT, PathWatch, share
from tunnelbench.lab.spec import LabCfg
from tunnelbench.vpns.features import save_probe
from tunnelbench.vpns.session import mesh_session

READY_S = 45.0
WARMUP = ("-c", "25", "-i", "0.2")  # 5 s of pings before measuring
PINGS, SIZE = 400, 1200
SHORT = {"full-cone": "FC", "address-restricted": "AR", "port-restricted": "PR", "symmetric": "SYM"}
# the four diagonal pairs and the hard NAT against each of the others
DEFAULT_PAIRS = [*((t, t) for t in NAT_TYPES), *(("symmetric", t) for t in NAT_TYPES if t != "symmetric")]
ALL_PAIRS = list(itertools.combinations_with_replacement(NAT_TYPES, 2))


def pair_key(t1: str, t2: str) -> str:
    return f"{t1} x {t2}"


def nat_drivers() -> list[str]:
    return sorted(n for n, c in DRIVERS.items() if "nat" in c.paths and n != "internal")


def classify(pct: float | None, answered: float) -> str:
    if pct is None or answered < 0.5:
        return "failed"
    if pct >= DIRECT_MIN_PCT:
        return "direct"
    if pct <= RELAY_MAX_PCT:
        return "relayed"
    return "mixed"


def _received(ping_out: str) -> int:
    m = re.search(r"(\d+) (?:packets )?received", ping_out)
    return int(m.group(1)) if m else 0


def cell(vpn: str, t1: str, t2: str, workdir: Path) -> dict[str, Any]:
    """One NAT pair for one VPN, in its own lab (built and destroyed here)."""
    out: dict[str, Any] = {"pair": pair_key(t1, t2), "h1": t1, "h2": t2}
    try:
        cfg = LabCfg(hosts=3, path="nat", nat_types={"h1": t1, "h2": t2})
        with (
            lab_session(cfg, workdir, out) as pt,
            mesh_session(DRIVERS[vpn], pt.lab, None, out, path="nat") as (mesh, _),  # readiness: below
        ):
            lab = pt.lab
            assert isinstance(lab, NetnsLab)  # LabCfg's default backend: the NAT types are namespaces
            h1, h2 = lab.hosts[0], lab.hosts[1]
            try:
                out["ready_s"] = round(mesh.wait_ready(timeout=READY_S), 1)
            except Exception as e:
                out.update(result="failed", direct_pct=None, why=f"mesh not up: {e}"[:300])
                return out
            dst = mesh.tunnel_ip(h2)
            h1.run(["ping", "-q", *WARMUP, "-W", "1", dst], check=False, timeout=60)
            watch = PathWatch(lab, h1, h2)
            before = watch.read()
            p = h1.run(["ping", "-q", "-c", str(PINGS), "-i", "0.005", "-s", str(SIZE), "-W", "2", dst],
                       check=False, timeout=60)  # fmt: skip
            s = share(before, watch.read())
            answered = _received(p.stdout) / PINGS
            pct = s.direct_pct
            out.update(
                result=classify(pct, answered),
                direct_pct=None if pct is None else round(pct, 1),
                answered_pct=round(100 * answered, 1),
                direct_bytes=s.direct,
                via_bytes=s.via,
                inbound_dropped=_nat_drops(lab),
            )
            if out["result"] == "failed":
                out["why"] = f"{_received(p.stdout)}/{PINGS} pings answered"
            return out
    except Exception as e:  # a cell that cannot be measured is recorded, not fatal to the matrix
        out.update(result="failed", direct_pct=None, why=f"{type(e).__name__}: {e}"[:300])
        return out


def _nat_drops(lab: NetnsLab) -> dict[str, int]:
    """Unsolicited inbound packets each NAT dropped during the cell (the NAT type at work)."""
    return {h: lab._counter(n, f"{lab.tag}nat", "inbound_dropped")["packets"] for h, n in lab.nats.items()}


def run_matrix(
    vpns: list[str],
    pairs: list[tuple[str, str]],
    workdir: Path,
    out_json: Path | None = None,
    record: bool = True,
    progress: Callable[[str], object] = print,
) -> dict[str, Any]:
    """Every cell, VPN by VPN; the JSON artifact is rewritten whole after each cell (write_atomic: an
    interrupted matrix, even one killed mid-write, keeps what it measured). `record`: store each VPN's row as the `nat_matrix` probe of its feature record."""
    if out_json is not None:  # before the first cell: a folder we cannot write, or a link there, is said now
        out_json.parent.mkdir(parents=True, exist_ok=True)
        check_destination(out_json)
    result: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "pairs": [pair_key(*p) for p in pairs],
        "thresholds": {"direct_min_pct": DIRECT_MIN_PCT, "relay_max_pct": RELAY_MAX_PCT},
        "vpns": {},
    }
    for vpn in vpns:
        cls = DRIVERS[vpn]
        a = cls.availability()
        row: dict[str, Any] = {"version": a.version, "cells": {}}
        result["vpns"][vpn] = row
        if not a.ok:
            row["unavailable"] = a.reason
            progress(f"{vpn}: unavailable ({a.reason})")
            continue
        for t1, t2 in pairs:
            c = cell(vpn, t1, t2, workdir)
            row["cells"][c["pair"]] = c
            pct = "-" if c.get("direct_pct") is None else f"{c['direct_pct']:.0f}%"
            progress(
                f"{vpn}: h1 {t1} x h2 {t2}: {c['result']} (direct {pct}, {c['seconds']} s)"
                + (f": {c['why']}" if c.get("why") else "")
            )
            if out_json is not None:
                write_atomic(out_json, json.dumps(result, indent=2) + "\n")
        if record and row["cells"]:
            summary = {k: cell_text(c) for k, c in row["cells"].items()}
            save_probe(
                vpn,
                "nat_matrix",
                any(c["result"] != "failed" for c in row["cells"].values()),
                "h1 x h2 NAT types, relay host h3 public; h1->h2 ping flood after a 5 s warm-up, router "
                f"counters: direct >= {DIRECT_MIN_PCT:.0f}%, relayed <= {RELAY_MAX_PCT:.0f}%",
                a.version,
                value=summary,
            )
    result["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if out_json is not None:
        write_atomic(out_json, json.dumps(result, indent=2) + "\n")
    return result


def cell_text(c: dict[str, Any]) -> str:
    pct = c.get("direct_pct")
    return c["result"] if pct is None else f"{c['result']} ({pct:.0f}% direct)"


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header (VPN, then one column per pair) and one row per VPN, for the terminal and the report."""
    pairs = result["pairs"]
    rows = []
    for vpn, row in result["vpns"].items():
        if "unavailable" in row:
            rows.append([vpn, *(["unavailable"] * len(pairs))])
            continue
        rows.append([vpn, *(cell_text(row["cells"][p]) if p in row["cells"] else "-" for p in pairs)])
    head = ["VPN", *(" x ".join(SHORT.get(t, t) for t in p.split(" x ")) for p in pairs)]
    return head, rows
