"""A run's key hygiene, session by session (keys.py does the checking): once per VPN while its mesh is up, its
secret files' mode, owner and place (`keys.<vpn>`); after every session's stop, even one that raised
(`stop_session`), its secret values into memory, its secret files removed (unless `[run] keep_keys`) and its
logs redacted; a failed case's daemon logs kept with those values redacted; after the report, every output
searched for them (`keys.scan`). What a killed run never got to remove, `clean` and `run --resume` sweep
(keys.sweep_run)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunnelbench.analysis.records import Records
from tunnelbench.security import keys
from tunnelbench.vpns.base import VpnDriver

Say = Callable[[str, str], None]
SetEnv = Callable[[dict[str, Any]], None]
Phase = Callable[[str, str, float], None]


class KeyHygiene:
    def __init__(self, run_dir: Path, keep: bool, say: Say, set_env: SetEnv, phase: Phase) -> None:
        self.run_dir, self.keep = run_dir, keep
        self.say, self.set_env, self.phase = say, set_env, phase
        # per VPN its record (keys.<vpn>), and the secret values of every session, kept in memory until the
        # outputs are scanned: the report is written after the run ends
        self.records: dict[str, dict[str, Any]] = {}
        self.secrets = keys.Secrets()

    def resume(self, env: dict[str, str]) -> None:
        """A resumed run keeps the records of the earlier processes (their secret values are gone with them)."""
        self.records.update({vpn: r for vpn, r in Records.of(env).keys.items() if isinstance(r, dict)})

    def check(self, vpn: str, driver: VpnDriver) -> None:
        """Once per VPN while its mesh is up: its secret files' mode, owner and place (keys.<vpn>)."""
        t0 = time.monotonic()
        try:
            rec = keys.check(driver, self.run_dir)
        except Exception as e:  # a check that cannot run is recorded, never ends the run
            rec = {"error": str(e), "files_checked": 0, "violations": []}
        self.records[vpn] = {**rec, "removed": [], "kept": self.keep}
        self.set_env({f"keys.{vpn}": self.records[vpn]})
        self.phase(vpn, "key_check", time.monotonic() - t0)
        for v in rec["violations"]:
            self.say(f"{vpn}: key hygiene: {v['path']}: {v['why']}", "red")

    def stop_session(self, vpn: str, driver: VpnDriver, stop: Callable[[], None]) -> None:
        """Stop a mesh session (`stop`: Mesh.stop) and end its keys whatever the stop does: a stop that raises
        (a daemon that will not die, a driver's after_stop failing) still has the session's secret values
        collected and its secret files removed before the exception goes on."""
        try:
            stop()
        finally:
            self.session_ended(vpn, driver)

    def session_ended(self, vpn: str, driver: VpnDriver) -> None:
        """After every session's stop (processes gone): its secret values into memory, its secret files removed
        unless keep_keys. Each session has its own folders, so a later session of the VPN is not touched."""
        try:
            removed = keys.collect_and_remove(driver, self.secrets, self.keep, self.run_dir)
        except Exception as e:
            self.say(f"{vpn}: removing its keys failed: {e}", "red")
            return
        rec = self.records.setdefault(
            vpn, {"files_checked": 0, "violations": [], "removed": [], "kept": self.keep}
        )
        rec["removed"] = [*rec.get("removed", []), *removed]
        self.set_env({f"keys.{vpn}": rec})

    def keep_logs(self, driver: VpnDriver, dest: Path) -> None:
        """A failed case's daemon logs, for the report: with the session's secret values redacted (some
        daemons log their config, keys included, and the report embeds these logs)."""
        dest.mkdir(parents=True, exist_ok=True)
        try:
            secrets = self.secrets.all() | keys.session_secrets(driver)
        except Exception:
            secrets = self.secrets.all()
        for h, procs in driver.procs.items():
            for p in procs:
                p.copy_log(dest / f"{h}-{p.label}.log")
                keys.redact(dest / f"{h}-{p.label}.log", secrets)

    def scan_outputs(self, run_id: str) -> dict[str, Any]:
        """After the report is written: search it, the store and the exports for every secret value of the run
        (the result: outputs, counts, offsets; never a value)."""
        return keys.scan_outputs(self.run_dir, run_id, self.secrets.all())
