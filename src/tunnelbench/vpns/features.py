"""Feature records: what each VPN is (protocol, ciphers, data plane, topology, NAT traversal, relay,
ACLs, unattended join, self-hostable control plane, platforms, license), every fact with its source.

A fact is `{"value": ..., "source": "<doc URL>" | "probe: <what the lab checked>", "probed": bool}`.
Facts the lab can check (does the relay carry traffic when UDP between peers is blocked, does the mesh
come up with peers behind NAT, the NAT-traversal matrix per pair of NAT types) are measured by
`tests/test_paths.py` (the relay and NAT probes) and `tunnelbench nat-matrix` (tunnelbench/natmatrix.py), and
recorded in $TUNNELBENCH_CACHE/probes.json; `record()` merges the latest probe into the documented
record, so a run stores what was last observed on this kind of machine, with the date."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from tunnelbench.vpns.install import cache_root

# documented field -> the probe that checks it; a probe with `data` (the NAT-traversal matrix: NAT pair ->
# "direct (97% direct)" | "relayed (0% direct)" | "failed", from `tunnelbench nat-matrix`) has that as its value
PROBED_FIELDS = {"relay": "relay_probe", "nat_traversal": "nat_probe", "nat_traversal_matrix": "nat_matrix"}


def fact(value, source: str) -> dict:
    return {"value": value, "source": source, "probed": source.startswith("probe:")}


def _probes_path() -> Path:
    return Path(os.environ.get("TUNNELBENCH_PROBES", str(cache_root() / "probes.json")))


def load_probes() -> dict:
    try:
        return json.loads(_probes_path().read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def save_probe(vpn: str, what: str, ok: bool, detail: str, version: str | None = None, value=None) -> None:
    """Record what the lab observed (what: "relay_probe" | "nat_probe" | "nat_matrix"; value: a structured
    result, the fact's value instead of `ok`)."""
    path = _probes_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = load_probes()
    data.setdefault(vpn, {})[what] = {
        "ok": ok,
        "detail": detail,
        "version": version,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **({"value": value} if value is not None else {}),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def record(vpn: str, documented: dict) -> dict:
    """The documented record with the lab's latest probes added as their own facts."""
    out = dict(documented)
    probes = load_probes().get(vpn, {})
    for key in PROBED_FIELDS.values():
        p = probes.get(key)
        if p is not None:
            out[key] = fact(
                p.get("value", p["ok"]), f"probe: {p['detail']} ({p['at']}, version {p.get('version')})"
            )
    return out
