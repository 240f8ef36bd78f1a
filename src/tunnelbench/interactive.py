"""The interactive lab: `tunnelbench up`, `exec`, `down`.

`up` builds the namespace lab and one VPN's mesh (optionally under an impairment profile) and returns to the
shell while they stay up; `exec HOST -- CMD` runs a command in a host's namespace; `down` tears the mesh down
with the driver's verified teardown and destroys the lab.

Who keeps the lab: a keeper process. `up` starts `python -m tunnelbench.interactive keep REQUEST` in its own
session (no terminal: Ctrl-C, SIGHUP and the shell's exit never reach it) and waits on a pipe until the keeper
says the mesh answers. The keeper builds the lab and the mesh itself, so the VPN daemons are its children
(each in its own session too, Host.spawn): nothing kills them when `up` exits, none becomes a zombie, and the
driver, its Process objects and the impairment backend stay alive in memory for `down`, which only signals
the keeper (SIGTERM) and reads back what its teardown verified. The same teardown as a run: mesh.stop(),
keys removed, driver leftovers (processes, interfaces, routes) checked, namespaces destroyed, journal ended.

Journal and clean: the keeper owns the run's journal (`Journal` registers the creating process), journals
itself as a process, and journals the state file as a path. While the keeper lives, `tunnelbench clean` skips
the lab as a running run (`down` is the way to end it; `clean --force` kills the keeper and everything it
journaled). If the keeper dies (SIGKILL, OOM), the lab is a crashed run: `clean` or `down` undo it from the
journal: daemons killed, namespaces deleted, state file removed.

State: REGISTRY/up/<run_id>.json (REGISTRY = /run/tunnelbench or $TUNNELBENCH_REGISTRY), with the hosts'
names, namespaces, underlay and tunnel addresses, daemon PIDs and the keeper's PID. Configs, keys (0600, the
driver's) and logs go to the run folder, RESULTS/<run_id> (run_id = up-<date>-<time>-<tag>)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tunnelbench.lab.journal import REGISTRY, Journal, Leftovers, proc_start_ticks, read_open_entries
from tunnelbench.lab.journaling import process_alive
from tunnelbench.lab.lock import LabLock

if TYPE_CHECKING:
    from tunnelbench.impair.backend import Backend
    from tunnelbench.lab.netns import NetnsLab
    from tunnelbench.vpns.mesh import Mesh

STATE_DIR = REGISTRY / "up"
READY_TIMEOUT_EXTRA_S = 180.0  # on top of the scenario's tunnel timeout: lab build, configure, profile


class UpError(RuntimeError):
    """A user-facing failure of up/exec/down (printed as plain text, exit code `code`)."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


class Interrupted(BaseException):  # not an Exception: no handler may swallow it
    pass


# -- state files ---------------------------------------------------------------------------------------------
@dataclass
class UpLab:
    path: Path
    state: dict[str, Any]

    @property
    def run_id(self) -> str:
        run_id: str = self.state["run_id"]
        return run_id

    def keeper_alive(self) -> bool:
        k = self.state.get("keeper", {})
        return bool(k.get("pid")) and process_alive(k["pid"], k.get("start"))

    def host(self, name: str) -> dict[str, Any] | None:
        return next((h for h in self.state["hosts"] if h["name"] == name), None)


def up_labs() -> list[UpLab]:
    out: list[UpLab] = []
    if not STATE_DIR.is_dir():
        return out
    for p in sorted(STATE_DIR.glob("*.json")):
        try:
            out.append(UpLab(p, json.loads(p.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def pick_lab(ref: str | None) -> UpLab:
    labs = up_labs()
    if not labs:
        raise UpError("no lab is up (start one with `tunnelbench up`)")
    if ref is None:
        if len(labs) > 1:
            raise UpError(
                f"{len(labs)} labs are up: {', '.join(lab.run_id for lab in labs)}; pick one with --lab RUN_ID"
            )
        return labs[0]
    match = [lab for lab in labs if lab.run_id == ref] or [lab for lab in labs if ref in lab.run_id]
    if len(match) != 1:
        raise UpError(
            f"lab {ref!r} matches {len(match)} of the labs up ({', '.join(lab.run_id for lab in labs)})"
        )
    return match[0]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# -- up (the command's side) ---------------------------------------------------------------------------------
def prepare(
    scenario: Path | None, vpn: str, profile: str, hosts: int | None
) -> tuple[Any, dict[str, Any], str]:
    """The scenario with the command line's VPN, profile and host count; raises UpError on anything invalid."""
    import tomllib

    from tunnelbench.catalog import resolve
    from tunnelbench.scenario import ScenarioError, load_scenario, parse_scenario

    try:
        _sc, text = load_scenario(scenario)
        data = tomllib.loads(text)
        data["vpns"] = [vpn]
        data["profiles"] = [profile]
        if hosts is not None:
            data.setdefault("lab", {})["hosts"] = hosts
        source = f"{scenario or 'default scenario'} with up's --vpn/--profile/--hosts"
        sc = parse_scenario(data, source)
    except ScenarioError as e:
        raise UpError(str(e), 2) from None
    if sc.lab.backend != "netns":
        raise UpError(f"`tunnelbench up` runs the namespace lab only (lab.backend is {sc.lab.backend!r})", 2)
    if sc.lab.hosts < 2:
        raise UpError("`tunnelbench up` needs at least 2 hosts", 2)
    try:
        cls = resolve(vpn)
    except ValueError as e:
        raise UpError(str(e), 2) from None
    avail = cls.availability(None)
    if not avail.ok:
        raise UpError(f"{vpn} cannot run here: {avail.reason}", 2)
    if sc.lab.path not in cls.paths:
        raise UpError(
            f"{vpn}: " + cls.paths_why.get(sc.lab.path, f"does not support the {sc.lab.path!r} path"), 2
        )
    if sc.lab.topology not in cls.topologies:
        raise UpError(f"{vpn} does not support topology {sc.lab.topology!r}", 2)
    return sc, data, source


def up(
    scenario: Path | None,
    vpn: str,
    profile: str,
    hosts: int | None,
    results: Path | None,
    say: Callable[[str], object] = print,
) -> UpLab:
    """Start a keeper for a new lab and wait until it reports the mesh up; returns the lab's state."""
    from tunnelbench.lab.tags import new_run_id, new_tag

    sc, data, source = prepare(scenario, vpn, profile, hosts)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(STATE_DIR / ".lock", "w")  # noqa: SIM115 (held until the keeper reports)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `up`s at once: the second sees the first's lab
        for lab in up_labs():
            if lab.keeper_alive():
                raise UpError(
                    f"a lab is already up: {lab.run_id} ({lab.state['vpn']}, "
                    f"{len(lab.state['hosts'])} hosts); run `tunnelbench down` first"
                )
            say(f"stale lab {lab.run_id} (its keeper is gone): `tunnelbench down {lab.run_id}` cleans it up")
        tag = new_tag()
        run_id = f"up-{new_run_id(tag)}"
        run_dir = (results or Path(sc.run.results_dir)).absolute() / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        request = {
            "run_id": run_id,
            "tag": tag,
            "run_dir": str(run_dir),
            "vpn": vpn,
            "profile": profile,
            "scenario": data,
            "source": source,
        }
        _write_json(run_dir / "up-request.json", request)
        say(f"lab {run_id} -> {run_dir}")
        r, w = os.pipe()
        log = open(run_dir / "keeper.log", "ab")  # noqa: SIM115
        try:
            keeper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tunnelbench.interactive",
                    "keep",
                    str(run_dir / "up-request.json"),
                    str(w),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(w,),
                start_new_session=True,  # the terminal's Ctrl-C and hangup never reach the lab
            )
        finally:
            os.close(w)
            log.close()
        try:
            msg = _wait_ready(r, keeper, sc.run.tunnel_timeout_s + READY_TIMEOUT_EXTRA_S)
        except (KeyboardInterrupt, UpError):
            with contextlib.suppress(ProcessLookupError):
                keeper.send_signal(signal.SIGTERM)  # the keeper tears down what it made
            _drain(r, 120)
            keeper.wait(30)
            raise
        finally:
            os.close(r)
        if not msg.get("ok"):
            keeper.wait(60)
            raise UpError(
                f"up failed: {msg.get('error', 'the keeper exited without a word')} "
                f"(log: {run_dir / 'keeper.log'})"
            )
        return UpLab(Path(msg["state"]), json.loads(Path(msg["state"]).read_text()))
    finally:
        lock.close()


def _drain(fd: int, timeout: float) -> bytes:
    out, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out


def _wait_ready(fd: int, keeper: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    data = _drain(fd, timeout)
    if not data:
        if keeper.poll() is None:
            raise UpError(f"the lab did not come up within {timeout:.0f} s")
        return {"ok": False, "error": f"the keeper exited ({keeper.returncode}) before the mesh was up"}
    try:
        msg: dict[str, Any] = json.loads(data.decode().strip().splitlines()[-1])
        return msg
    except (json.JSONDecodeError, IndexError):
        return {"ok": False, "error": f"unreadable keeper message {data[:200]!r}"}


def print_up(lab: UpLab, console: Console) -> None:
    s = lab.state
    t = Table(
        title=Text(f"lab {s['run_id']}: {s['vpn']} {s.get('version') or ''}, profile {s['profile']}"),
        title_justify="left",
    )
    for c in ("host", "namespace", "underlay address", "tunnel address", "daemons (pid)"):
        t.add_column(c)
    for h in s["hosts"]:
        daemons = ", ".join(f"{d['label']} {d['pid']}" for d in h["daemons"]) or "–"
        t.add_row(
            Text(h["name"]), Text(h["netns"]), Text(h["underlay_ip"]), Text(h["tunnel_ip"]), Text(daemons)
        )
    t.add_row(
        Text("router"),
        Text(s["router_netns"]),
        Text(f"forwards {s['hosts'][0]['name']}..{s['hosts'][-1]['name']}"),
        Text("–"),
        Text("–"),
    )
    console.print(t)
    h1, h2 = s["hosts"][0], s["hosts"][1]
    for v in s.get("key_violations", []):
        console.print(Text(f"key hygiene: {v['path']}: {v['why']}", style="red"))
    if s.get("impair_backend"):
        console.print(Text(f"profile {s['profile']} applied on the router with {s['impair_backend']}"))
    console.print(Text(f"configs, keys and logs: {s['run_dir']}"))
    console.print(Text(f"try:  tunnelbench exec {h1['name']} -- ping -c3 {h2['tunnel_ip']}"))
    console.print(Text(f"      tunnelbench exec {h1['name']}   (a shell in {h1['netns']})"))
    console.print(Text("end:  tunnelbench down"))


# -- exec ----------------------------------------------------------------------------------------------------
def exec_argv(host: str, cmd: Sequence[str], lab_ref: str | None) -> list[str]:
    """The argv that runs `cmd` (default: the user's shell) in `host`'s namespace of the lab up."""
    lab = pick_lab(lab_ref)
    h = lab.host(host)
    if h is None:
        names = [x["name"] for x in lab.state["hosts"]] + ["router"]
        if host == "router":
            h = {"name": "router", "netns": lab.state["router_netns"]}
        else:
            raise UpError(f"no host {host!r} in lab {lab.run_id}; hosts: {', '.join(names)}", 2)
    if not Path(f"/run/netns/{h['netns']}").exists():
        raise UpError(
            f"namespace {h['netns']} of lab {lab.run_id} is gone (the lab crashed?): "
            f"run `tunnelbench down {lab.run_id}`"
        )
    argv = list(cmd) or [os.environ.get("SHELL") or "bash"]
    return ["ip", "netns", "exec", h["netns"], *argv]


def exec_in(host: str, cmd: Sequence[str], lab_ref: str | None) -> None:
    """Replace this process with the command in the host's namespace: the terminal, stdin and the exit code
    are the command's own."""
    argv = exec_argv(host, cmd, lab_ref)
    os.environ["TUNNELBENCH_HOST"] = host
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


# -- down ----------------------------------------------------------------------------------------------------
@dataclass
class DownReport:
    run_id: str
    lines: list[str]  # what was done and verified
    problems: list[str]


def down(ref: str | None, timeout: float = 180.0) -> DownReport:
    lab = pick_lab(ref)
    s = lab.state
    run_dir = Path(s["run_dir"])
    lines: list[str] = []
    problems: list[str] = []
    if lab.keeper_alive():
        result_path = run_dir / "down.json"
        result_path.unlink(missing_ok=True)
        os.kill(s["keeper"]["pid"], signal.SIGTERM)
        end = time.monotonic() + timeout
        while lab.keeper_alive() and time.monotonic() < end:
            time.sleep(0.05)
        if lab.keeper_alive():
            problems.append(
                f"the keeper (pid {s['keeper']['pid']}) did not finish its teardown in {timeout:.0f} s"
            )
        try:
            res = json.loads(result_path.read_text())
            lines += res.get("lines", [])
            problems += res.get("problems", [])
        except (OSError, json.JSONDecodeError):
            problems.append(f"the keeper left no teardown report (see {run_dir / 'keeper.log'})")
    else:  # the keeper died: the journal says what is left (as `tunnelbench clean` does for a crashed run)
        lines.append(f"the keeper of {lab.run_id} is gone: undoing what its journal lists")
        from tunnelbench.lab.clean import clean_run

        try:  # the registry's copy of the journal when there is one (it survives a deleted results folder)
            from tunnelbench.lab.journal import run_leftovers

            left = run_leftovers(lab.run_id, run_dir)
        except ImportError:
            left = Leftovers(lab.run_id, run_dir, None, None, read_open_entries(run_dir / "journal.jsonl"))
        rep = clean_run(left)
        lines += [f"removed {x}" for x in rep.removed]
        problems += rep.problems + rep.skipped
    # verify independently of whoever tore down: no namespace, no daemon, no state file
    lab_ns = [h["netns"] for h in s["hosts"]] + [s["router_netns"], *s.get("other_netns", [])]
    left_ns = [n for n in lab_ns if Path(f"/run/netns/{n}").exists()]
    daemons = [d for h in s["hosts"] for d in h["daemons"]]
    alive = [d for d in daemons if process_alive(d["pid"], d.get("start"))]
    lab.path.unlink(missing_ok=True)
    problems += [f"namespace {n} still exists" for n in left_ns]
    problems += [f"{d['label']} pid {d['pid']} still runs" for d in alive]
    if not left_ns:
        lines.append(f"verified: no namespace of the lab is left ({len(lab_ns)} checked)")
    if daemons and not alive:
        lines.append(
            f"verified: {len(daemons)} daemon process(es) gone ({', '.join(str(d['pid']) for d in daemons)})"
        )
    if not lab.path.exists():
        lines.append(f"verified: state file {lab.path} removed")
    return DownReport(lab.run_id, lines, problems)


# -- the keeper ----------------------------------------------------------------------------------------------
def _raise_interrupted(signum: int, _frame: FrameType | None) -> NoReturn:
    raise Interrupted(signal.Signals(signum).name)


class Keeper:
    def __init__(self, request: dict[str, Any], ready_fd: int):
        from tunnelbench.scenario import parse_scenario

        self.req = request
        self.ready_fd: int | None = ready_fd
        self.sc = parse_scenario(request["scenario"], request["source"])
        self.run_id, self.tag, self.vpn = request["run_id"], request["tag"], request["vpn"]
        self.run_dir = Path(request["run_dir"])
        self.state_path = STATE_DIR / f"{self.run_id}.json"
        self.journal: Journal | None = None
        self.lock: LabLock | None = None
        self.self_entry: dict[str, Any] | None = None
        self.state_entry: dict[str, Any] | None = None
        self.lab: NetnsLab | None = None
        self.mesh: Mesh | None = None
        self.backend: Backend | None = None
        self.state: dict[str, Any] = {}

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    def tell(self, msg: dict[str, Any]) -> None:
        if self.ready_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, (json.dumps(msg) + "\n").encode())
        os.close(self.ready_fd)
        self.ready_fd = None

    def main(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, _raise_interrupted)
        try:
            self.bring_up()
        except (Exception, Interrupted) as e:
            self.log(traceback.format_exc())
            self._ignore_signals()
            res = self.teardown()
            why = "interrupted" if isinstance(e, Interrupted) else f"{type(e).__name__}: {e}"
            if res["problems"]:
                why += f"; teardown problems: {'; '.join(res['problems'])}"
            self.tell({"ok": False, "error": why})
            return 1
        self.tell({"ok": True, "state": str(self.state_path)})
        self.log("up; waiting for `tunnelbench down` (SIGTERM)")
        try:
            while True:
                time.sleep(1.0)
                if not Path(f"/run/netns/{self.state['router_netns']}").exists():
                    self.log("the lab's namespaces are gone (cleaned by someone else): ending")
                    break
        except Interrupted as e:
            self.log(f"{e}: tearing down")
        self._ignore_signals()
        res = self.teardown()
        _write_json(self.run_dir / "down.json", res)
        self.log(json.dumps(res))
        return 1 if res["problems"] else 0

    @staticmethod
    def _ignore_signals() -> None:  # teardown must finish even if another signal arrives
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)

    def bring_up(self) -> None:
        from tunnelbench.catalog import resolve
        from tunnelbench.impair.backend import make_backend
        from tunnelbench.lab.make import make_lab
        from tunnelbench.lab.netns import NetnsLab
        from tunnelbench.security import keys
        from tunnelbench.vpns.session import make_mesh, start_mesh

        sc = self.sc
        # one lab per machine (lab/lock.py): held by this keeper until it ends, after the teardown
        self.lock = LabLock("up", self.run_id, self.run_dir).acquire()
        self.journal = Journal(self.run_dir, self.run_id)  # registers this process as the run's owner
        self.self_entry = self.journal.process(os.getpid(), sys.argv, "local")
        self.log(f"building the lab ({sc.lab.hosts} hosts, tag {self.tag})")
        lab = make_lab(sc.lab, self.tag, self.run_dir, self.journal)
        assert isinstance(lab, NetnsLab)  # `up` runs the namespace lab only (prepare)
        self.lab = lab
        lab.build()
        lab.wait_links()
        cls = resolve(self.vpn)
        avail = cls.availability(lab.hosts)
        if not avail.ok:
            raise RuntimeError(f"{self.vpn} cannot run here: {avail.reason}")
        server = next(h for h in lab.hosts if h.name == sc.lab.server)
        self.mesh = mesh = make_mesh(
            cls,
            lab,
            options=sc.vpn_options,
            mtu=sc.fairness.tunnel_mtu,
            path=sc.lab.path,
            topology=sc.lab.topology,
            hub=server,
        )
        driver = mesh.driver
        self.log(f"configuring {self.vpn} {avail.version}")
        started = start_mesh(mesh, sc.run.tunnel_timeout_s)
        self.log(f"mesh answering after {started.waited_s or 0.0:.2f} s")
        p = sc.profile(self.req["profile"])
        if not p.is_baseline:
            self.backend = make_backend(sc.impair.backend, lab.router, lab.hosts, self.run_dir / "impair")
            self.backend.gso_mode = sc.impair.gso  # (netem too: per wire packet or super-packets whole)
            self.backend.apply(p)
            mesh.wait_ready(sc.run.tunnel_timeout_s + mesh.expect_delay(p.delay_ms, p.jitter_ms))
            self.log(f"profile {p.name} applied with {self.backend.name}: {p.summary()}")
        key_rec = keys.check(driver, self.run_dir)
        other_ns = [n.netns for n in getattr(lab, "nats", {}).values()]
        self.state = {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "tag": self.tag,
            "vpn": self.vpn,
            "version": avail.version,
            "driver": f"{cls.__module__}.{cls.__qualname__}",
            "profile": p.name,
            "impair_backend": self.backend.name if self.backend is not None else None,
            "router_netns": lab.router.netns,
            "other_netns": other_ns,
            "keeper": {"pid": os.getpid(), "start": proc_start_ticks(os.getpid())},
            "started": time.time(),
            "key_violations": key_rec["violations"],
            "hosts": [
                {
                    "name": h.name,
                    "netns": h.netns,
                    "underlay_ip": h.underlay_ip,
                    "tunnel_ip": mesh.tunnel_ip(h),
                    "daemons": [
                        {"label": d.label, "pid": d.pid, "start": proc_start_ticks(d.pid)}
                        for d in driver.daemons(h)
                    ],  # fmt: skip
                }
                for h in lab.hosts
            ],
        }
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.state_entry = self.journal.path_entry(str(self.state_path))  # journal first: clean finds it
        _write_json(self.state_path, self.state)

    def teardown(self) -> dict[str, Any]:
        """The run's verified teardown: impairment cleared, mesh stopped, keys removed, leftovers checked,
        namespaces destroyed, journal ended. Returns what was done ("lines") and what failed ("problems")."""
        from tunnelbench.security import keys
        from tunnelbench.vpns.session import end_mesh

        lines: list[str] = []
        problems: list[str] = []
        if self.backend is not None:
            try:
                self.backend.clear()
                lines.append(f"impairment cleared ({self.backend.name})")
            except Exception as e:
                problems.append(f"clearing the impairment: {e}")
        if self.mesh is not None:
            mesh, driver = self.mesh, self.mesh.driver
            procs = [p for ps in mesh.daemons().values() for p in ps]

            def stop() -> None:
                """The mesh stopped, what stopped said; the keys removed whatever the stop did."""
                try:
                    mesh.stop()
                    gone = [p for p in procs if not p.alive()]
                    if procs:
                        lines.append(
                            f"{self.vpn} stopped: "
                            + ", ".join(f"{p.host.name} {p.label} pid {p.pid}" for p in gone)
                        )
                    problems.extend(
                        f"{p.host.name} {p.label} pid {p.pid} still runs" for p in procs if p.alive()
                    )
                finally:
                    try:
                        removed = keys.collect_and_remove(driver, keys.Secrets(), False, self.run_dir)
                        if removed:
                            lines.append(f"{len(removed)} secret file(s) removed")
                    except Exception as e:
                        problems.append(f"removing keys: {e}")

            try:
                left = end_mesh(mesh, stop)
            except Exception as e:
                problems.append(f"stopping {self.vpn}: {e}")
                try:  # the teardown is verified all the same
                    left = mesh.leftovers()
                except Exception as e:
                    left = [f"cannot inspect: {e}"]
            if left:
                problems += [f"teardown left {x}" for x in left]
            else:
                lines.append(f"verified: {self.vpn} left no process, interface or route on any host")
        if self.lab is not None:
            ns = [
                h.netns for h in [*self.lab.hosts, *getattr(self.lab, "nats", {}).values(), self.lab.router]
            ]
            probs = self.lab.destroy()
            problems += probs
            if not probs:
                lines.append(f"namespaces deleted: {', '.join(ns)}")
        if self.state_entry is not None and self.journal is not None:
            self.state_path.unlink(missing_ok=True)
            self.journal.release(self.state_entry)
        if self.journal is not None:
            if self.self_entry is not None:
                self.journal.release(self.self_entry)
            if not problems:
                self.journal.end()
                lines.append("journal ended")
            else:  # keep the run registered: `tunnelbench clean` retries what is left
                lines.append("journal kept open for `tunnelbench clean`")
        return {"lines": lines, "problems": problems}


def _keep(request_path: str, fd: str) -> int:
    req = json.loads(Path(request_path).read_text())
    return Keeper(req, int(fd)).main()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "keep":
        sys.exit(_keep(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m tunnelbench.interactive keep REQUEST.json FD (started by `tunnelbench up`)")
