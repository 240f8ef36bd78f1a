"""A run's recorded facts, read once from its environment table: the calibration of every profile, the
engine's tax per VPN, key hygiene per VPN and the key scan, the drift reference. The writers (the runner,
security/) store each as one JSON value under a named key (`calibration.<profile>`, `engine_tax.<vpn>`,
`keys.<vpn>`, `keys.scan`, `drift.reference`); this is the one place that knows those names, so a report
reads what the run recorded, not today's idea of it. A value that is not JSON is kept as text (an older
run's), never dropped silently."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CALIBRATION = "calibration."
CALIBRATION_BASE = "calibration.base"
ENGINE_TAX = "engine_tax."
KEYS = "keys."
KEY_SCAN = "keys.scan"
DRIFT = "drift.reference"
INTERFERENCE = "interference"  # runner/guard.py's tally: cases disturbed, measured again, kept, by what


def json_value(raw: str | None, keep_text: bool = True) -> Any:
    """A stored value parsed as JSON; one that is not JSON is its text (keep_text) or None."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        return raw if keep_text else None


@dataclass
class Records:
    calibration_base: Any = None  # {"one_way_ms", "rtt_ms"} of the raw path, when profiles were calibrated
    calibrations: dict[str, Any] = field(default_factory=dict)  # profile -> its calibration record
    engine_tax: dict[str, Any] = field(default_factory=dict)  # VPN -> {engine mode: tax check}
    keys: dict[str, Any] = field(default_factory=dict)  # VPN -> its key-hygiene record
    key_scan: Any = None  # the outputs searched for key material, after the report
    drift: list[Any] = field(default_factory=list)  # the raw path's reference at every round
    interference: dict[str, Any] | None = None  # what took the lab's CPUs while the run measured

    @classmethod
    def of(cls, env: dict[str, str]) -> Records:
        r = cls(
            calibration_base=json_value(env.get(CALIBRATION_BASE)), key_scan=json_value(env.get(KEY_SCAN))
        )
        for k in sorted(env):
            if k.startswith(CALIBRATION) and k != CALIBRATION_BASE:
                r.calibrations[k.removeprefix(CALIBRATION)] = json_value(env[k])
            elif k.startswith(ENGINE_TAX):
                r.engine_tax[k.removeprefix(ENGINE_TAX)] = json_value(env[k])
            elif k.startswith(KEYS) and k != KEY_SCAN:
                r.keys[k.removeprefix(KEYS)] = json_value(env[k])
        drift = json_value(env.get(DRIFT))
        r.drift = drift if isinstance(drift, list) else []
        busy = json_value(env.get(INTERFERENCE))
        r.interference = busy if isinstance(busy, dict) else None
        return r

    def calibration_misses(self) -> dict[str, list[str]]:
        """Per impaired profile, the calibration checks that came out of tolerance (impair/calibrate.py)."""
        out: dict[str, list[str]] = {}
        for prof, cal in self.calibrations.items():
            if not isinstance(cal, dict):
                continue
            bad = [
                f"{c.get('quantity')} {c['measured']:.3g} vs {c['configured']:.3g} {c.get('unit', '')}".rstrip()
                for c in cal.get("checks", [])
                if isinstance(c, dict)
                and c.get("ok") is False
                and isinstance(c.get("measured"), int | float)
                and isinstance(c.get("configured"), int | float)
            ]
            if bad:
                out[prof] = bad
        return out

    def key_violations(self) -> dict[str, int]:
        """Per VPN, the key-hygiene violations its run recorded."""
        return {
            vpn: len(rec.get("violations", [])) for vpn, rec in self.keys.items() if isinstance(rec, dict)
        }

    @staticmethod
    def is_record(key: str) -> bool:
        """An environment key this holds (the report's environment table leaves the calibrations to their own
        section)."""
        return key.startswith(CALIBRATION)
