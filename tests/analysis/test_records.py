"""A run's recorded facts (analysis/records.py) from a hand-written environment table: each record under its
own name, the runner's base and scan keys apart, a value that is not JSON kept as text, and the two
judgements read from them (calibration checks out of tolerance, key-hygiene violations per VPN)."""

from __future__ import annotations

import json

from tunnelbench.analysis.records import Records

ENV = {
    "calibration.base": json.dumps({"one_way_ms": 0.01, "rtt_ms": 0.02}),
    "calibration.medium": json.dumps(
        {
            "profile": "medium",
            "ok": False,
            "checks": [
                {"quantity": "loss", "measured": 2.5, "configured": 1.0, "unit": "%", "ok": False},
                {"quantity": "delay", "measured": 4.06, "configured": 3.9, "unit": "ms", "ok": True},
            ],
        }
    ),
    "calibration.old": "delay 4 ms",  # an older run's text
    "engine_tax.nebula": json.dumps({"gso": {"tax_pct": 3.5}}),
    "keys.nebula": json.dumps({"violations": [{"path": "a"}, {"path": "b"}]}),
    "keys.tinc": json.dumps({"violations": []}),
    "keys.scan": json.dumps({"hits": []}),
    "drift.reference": json.dumps([{"when": "round 1", "goodput_mbps": 18000.0}]),
    "lab.hosts": "3",
}


def test_each_record_under_its_name():
    r = Records.of(ENV)
    assert r.calibration_base == {"one_way_ms": 0.01, "rtt_ms": 0.02}
    assert sorted(r.calibrations) == ["medium", "old"] and r.calibrations["old"] == "delay 4 ms"
    assert r.engine_tax == {"nebula": {"gso": {"tax_pct": 3.5}}}
    assert sorted(r.keys) == ["nebula", "tinc"] and r.key_scan == {"hits": []}
    assert r.drift == [{"when": "round 1", "goodput_mbps": 18000.0}]
    assert Records.is_record("calibration.medium") and not Records.is_record("lab.hosts")


def test_what_is_judged_from_them():
    r = Records.of(ENV)
    assert r.calibration_misses() == {"medium": ["loss 2.5 vs 1 %"]}
    assert r.key_violations() == {"nebula": 2, "tinc": 0}
    empty = Records.of({"lab.hosts": "3"})
    assert (empty.calibrations, empty.drift, empty.calibration_misses()) == ({}, [], {})
