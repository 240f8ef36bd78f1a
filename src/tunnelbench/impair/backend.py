"""Impairment backends on the lab router: kernel netem where the kernel has it, the native engine
(native/impaird over iptables NFQUEUE) where it does not. Rate limits are always kernel TBF.

Both impair a packet once per direction on the router's forwarding path. The native engine fails closed:
packets are queued without --queue-bypass, so if the daemon dies, traffic stops and the case fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path

from tunnelbench.impair.profiles import Profile
from tunnelbench.lab.addressing import LAB_PREFIX, host_subnet
from tunnelbench.lab.host import CommandError, Host, Process

QUEUE_NUM = 0
CHAIN = "TB_IMPAIR"
ENGINE_PPS_CEILING = 300_000  # measured ceiling of the engine (bench-engine), sizes the kernel queue bound


class ImpairError(RuntimeError):
    pass


def impaird_binary() -> Path | None:
    """The native engine: $TUNNELBENCH_IMPAIRD, the repo's release build, or impaird on PATH."""
    env = os.environ.get("TUNNELBENCH_IMPAIRD")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3] / "native" / "impaird" / "target" / "release" / "impaird"
    if repo.exists():
        return repo
    found = shutil.which("impaird")
    return Path(found) if found else None


class Backend(ABC):
    name: str

    def __init__(self, router: Host, hosts: list[Host], workdir: Path):
        self.router = router
        self.hosts = hosts
        self.workdir = workdir
        self.profile: Profile | None = None

    def ifname(self, host: Host) -> str:
        """The router's interface toward `host` (named after the host by the lab)."""
        return host.name

    def scope(self, profile: Profile) -> list[Host]:
        names = set(profile.hosts) or {h.name for h in self.hosts}
        unknown = names - {h.name for h in self.hosts}
        if unknown:
            raise ImpairError(f"profile {profile.name!r}: unknown hosts {sorted(unknown)}")
        return [h for h in self.hosts if h.name in names]

    @abstractmethod
    def apply(self, profile: Profile, force_engine: bool = False) -> None:
        """Impair the path; force_engine routes packets through the engine even for a no-op profile
        (to measure the engine's own cost)."""

    @abstractmethod
    def clear(self) -> None: ...

    def health(self) -> str | None:
        """None when the impaired path is working as configured, else what is wrong."""
        return None

    def stats(self) -> dict:
        return {}

    # -- rate: kernel TBF on the router's egress toward each host in scope -------------------------------
    def _apply_rate(self, profile: Profile) -> None:
        if not profile.rate_mbit:
            return
        if profile.pairs:
            raise ImpairError(f"profile {profile.name!r}: rate_mbit with pairs is not supported; use hosts")
        rate_bps = profile.rate_mbit * 1e6
        # queue: the bandwidth-delay product of the profile's RTT plus 20 ms, so TCP can fill the pipe
        rtt_s = 2 * (profile.delay_ms + profile.jitter_ms) / 1000 + 0.02
        limit = max(64_000, int(rate_bps / 8 * rtt_s))
        burst = max(32_000, int(rate_bps / 8 / 250))
        for h in self.scope(profile):
            self.router.run(["tc", "qdisc", "replace", "dev", self.ifname(h), "root", "tbf", "rate",
                             f"{profile.rate_mbit}mbit", "burst", str(burst), "limit", str(limit)])  # fmt: skip
        if profile.hosts:
            # the host's uplink: everything it sends, shaped on an IFB fed from the router's ingress
            for h in self.scope(profile):
                ifb = f"ifb{h.name}"
                self.router.run(["ip", "link", "add", ifb, "type", "ifb"])
                self.router.run(["ip", "link", "set", ifb, "up"])
                self.router.run(["tc", "qdisc", "add", "dev", self.ifname(h), "handle", "ffff:", "ingress"])
                self.router.run(["tc", "filter", "add", "dev", self.ifname(h), "parent", "ffff:", "matchall",
                                 "action", "mirred", "egress", "redirect", "dev", ifb])  # fmt: skip
                self.router.run(["tc", "qdisc", "replace", "dev", ifb, "root", "tbf", "rate",
                                 f"{profile.rate_mbit}mbit", "burst", str(burst), "limit", str(limit)])  # fmt: skip

    def _clear_tc(self) -> None:
        for h in self.hosts:
            self.router.run(["tc", "qdisc", "del", "dev", self.ifname(h), "root"], check=False)
            self.router.run(["tc", "qdisc", "del", "dev", self.ifname(h), "ingress"], check=False)
            if self.router.run(["ip", "link", "show", f"ifb{h.name}"], check=False).returncode == 0:
                self.router.run(["ip", "link", "del", f"ifb{h.name}"], check=False)


class NetemBackend(Backend):
    name = "netem"

    def apply(self, profile: Profile, force_engine: bool = False) -> None:
        self.clear()
        self.profile = profile
        if profile.pairs:
            raise ImpairError("the netem backend impairs per host; `pairs` needs the native engine")
        if profile.needs_engine:
            if profile.hosts:
                raise ImpairError(
                    "netem backend: per-host uplink impairment is not implemented; use all hosts"
                )
            args = netem_args(profile)
            for h in self.scope(profile):
                self.router.run(["tc", "qdisc", "replace", "dev", self.ifname(h), "root", "netem", *args])
        else:
            self._apply_rate(profile)

    def clear(self) -> None:
        self._clear_tc()
        self.profile = None


def netem_args(p: Profile) -> list[str]:
    a: list[str] = []
    if p.delay_ms or p.jitter_ms:
        a += ["delay", f"{p.delay_ms}ms"]
        if p.jitter_ms:
            a += [f"{p.jitter_ms}ms"]
            if p.delay_correlation_pct:
                a += [f"{p.delay_correlation_pct}%"]
            if p.distribution != "uniform":
                a += ["distribution", p.distribution]
    if p.loss_pct and p.loss_correlation_pct and p.correlation_model == "markov":
        # rate-preserving correlated loss = a Gilbert chain entering with p(1-c), staying with p + c(1-p)
        q, c = p.loss_pct / 100, p.loss_correlation_pct / 100
        a += ["loss", "gemodel", f"{100 * q * (1 - c):.6g}%", f"{100 * (1 - q) * (1 - c):.6g}%", "0%", "100%"]
    elif p.loss_pct:
        a += ["loss", "random", f"{p.loss_pct}%"] + (
            [f"{p.loss_correlation_pct}%"] if p.loss_correlation_pct else []
        )
    if p.gemodel:
        g = p.gemodel
        a += [
            "loss",
            "gemodel",
            f"{g.p_pct}%",
            f"{g.r_pct}%",
            f"{100 - g.bad_loss_pct}%",
            f"{100 - g.good_loss_pct}%",
        ]
    if p.loss_state:
        s = p.loss_state
        a += ["loss", "state", *(f"{x}%" for x in (s.p13, s.p31, s.p32, s.p23, s.p14))]
    if p.reorder_pct:
        a += ["reorder", f"{p.reorder_pct}%"] + (
            [f"{p.reorder_correlation_pct}%"] if p.reorder_correlation_pct else []
        )
    if p.duplicate_pct:
        a += ["duplicate", f"{p.duplicate_pct}%"]
    if p.corrupt_pct:
        a += ["corrupt", f"{p.corrupt_pct}%"]
    if p.rate_mbit:
        a += ["rate", f"{p.rate_mbit}mbit"]
    return a


def engine_rule(name: str, src: str, dst: str, p: Profile) -> dict:
    r: dict = {
        "name": name, "src": src, "dst": dst, "correlation_model": p.correlation_model,
        "delay_us": int(p.delay_ms * 1000), "jitter_us": int(p.jitter_ms * 1000),
        "distribution": p.distribution, "delay_correlation": p.delay_correlation_pct / 100,
        "loss": None,
        "reorder": {"p": p.reorder_pct / 100, "correlation": p.reorder_correlation_pct / 100},
        "duplicate": {"p": p.duplicate_pct / 100, "correlation": p.duplicate_correlation_pct / 100},
        "corrupt": {"p": p.corrupt_pct / 100, "correlation": 0.0},
    }  # fmt: skip
    if p.loss_pct:
        r["loss"] = {"model": "random", "p": p.loss_pct / 100, "correlation": p.loss_correlation_pct / 100}
    elif p.gemodel:
        g = p.gemodel
        r["loss"] = {"model": "gemodel", "p": g.p_pct / 100, "r": g.r_pct / 100,
                     "h": 1 - g.bad_loss_pct / 100, "k": 1 - g.good_loss_pct / 100}  # fmt: skip
    elif p.loss_state:
        s = p.loss_state
        r["loss"] = {
            "model": "state",
            **{k: getattr(s, k) / 100 for k in ("p13", "p31", "p32", "p23", "p14")},
        }
    return r


class NativeBackend(Backend):
    name = "native"

    def __init__(self, router: Host, hosts: list[Host], workdir: Path, binary: Path):
        super().__init__(router, hosts, workdir)
        self.binary = binary
        self.proc: Process | None = None
        self.forced = False
        self.seed: int | None = None  # fixed for reproducible tests; random per apply otherwise
        self.stats_path = workdir / "impaird-stats.json"

    def version(self) -> str:
        return subprocess.run([str(self.binary), "--version"], capture_output=True, text=True).stdout.strip()

    def rules(self, p: Profile) -> list[dict]:
        by_name = {h.name: h for h in self.hosts}
        idx = {h.name: i for i, h in enumerate(self.hosts, start=1)}
        if p.pairs:
            rules = []
            for a, b in p.pairs:
                if a not in by_name or b not in by_name:
                    raise ImpairError(f"profile {p.name!r}: pair ({a}, {b}) names an unknown host")
                sa, sb = str(host_subnet(idx[a])), str(host_subnet(idx[b]))
                rules += [engine_rule(f"{a}->{b}", sa, sb, p), engine_rule(f"{b}->{a}", sb, sa, p)]
            return rules
        rules = []
        for h in self.scope(p):
            sub = str(host_subnet(idx[h.name]))
            rules.append(engine_rule(f"to-{h.name}", str(LAB_PREFIX), sub, p))
            if p.hosts:  # a restricted scope impairs the host's uplink too
                rules.append(engine_rule(f"from-{h.name}", sub, str(LAB_PREFIX), p))
        return rules

    def apply(self, profile: Profile, force_engine: bool = False) -> None:
        self.clear()
        self.profile = profile
        self._apply_rate(profile)
        if not (profile.needs_engine or force_engine):
            return
        self.forced = force_engine
        held_s = (profile.delay_ms + 3 * profile.jitter_ms) / 1000 + 0.05
        rate_pps = (profile.rate_mbit * 1e6 / 8 / 1500) if profile.rate_mbit else ENGINE_PPS_CEILING
        cfg = {
            "queue": QUEUE_NUM,
            # bound the kernel queue at about 2 x rate x delay packets (the engine drops and counts beyond)
            "queue_maxlen": int(min(400_000, max(4096, 2 * rate_pps * held_s))),
            "stats_path": str(self.stats_path),
            "stats_interval_ms": 200,
            "seed": self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little"),
            "realtime": True,
            "rules": self.rules(profile),
        }
        cfg_path = self.workdir / "impaird.json"
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(json.dumps(cfg, indent=1))
        chk = subprocess.run(
            [str(self.binary), "--check-config", str(cfg_path)], capture_output=True, text=True
        )
        if chk.returncode != 0:
            raise ImpairError(f"impaird rejected the config for {profile.name!r}: {chk.stdout}{chk.stderr}")
        self.stats_path.unlink(missing_ok=True)
        self.proc = self.router.spawn([str(self.binary), "--config", str(cfg_path)], label="impaird",
                                      log_path=self.workdir / "impaird.log")  # fmt: skip
        deadline = time.monotonic() + 5
        while not self.stats_path.exists():
            if not self.proc.alive() or time.monotonic() > deadline:
                raise ImpairError(f"impaird did not start: {self.proc.log_tail(800)}")
            time.sleep(0.02)
        # queue only lab-to-lab forwarded traffic; no --queue-bypass: if the engine dies, packets drop
        self.router.run(["iptables", "-t", "mangle", "-N", CHAIN])
        self.router.run(["iptables", "-t", "mangle", "-A", CHAIN, "-s", str(LAB_PREFIX), "-d", str(LAB_PREFIX),
                         "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)])  # fmt: skip
        self.router.run(["iptables", "-t", "mangle", "-A", "FORWARD", "-j", CHAIN])

    def clear(self) -> None:
        r = self.router.run(["iptables", "-t", "mangle", "-D", "FORWARD", "-j", CHAIN], check=False)
        if r.returncode == 0:
            self.router.run(["iptables", "-t", "mangle", "-F", CHAIN], check=False)
            self.router.run(["iptables", "-t", "mangle", "-X", CHAIN], check=False)
        if self.proc is not None:
            self.proc.stop(grace=2)
            self.proc = None
        self._clear_tc()
        self.profile = None
        self.forced = False

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def health(self) -> str | None:
        if self.profile is None or not (self.profile.needs_engine or self.forced):
            return None
        if self.proc is None or not self.proc.alive():
            tail = self.proc.log_tail(400) if self.proc else ""
            return f"the impairment engine (impaird) is not running: traffic is blocked (fail closed). {tail}"
        try:
            age = time.time() - self.stats_path.stat().st_mtime
        except OSError:
            return "impaird wrote no stats file"
        if age > 2.0:
            return f"impaird stats are {age:.1f} s old: the engine is stalled"
        return None


def netem_available(router: Host) -> bool:
    """Probe netem for real on a dummy interface in the router namespace."""
    try:
        router.run(["ip", "link", "add", "tbprobe0", "type", "dummy"])
    except CommandError:
        return False
    try:
        r = router.run(
            ["tc", "qdisc", "add", "dev", "tbprobe0", "root", "netem", "delay", "1ms"], check=False
        )
        return r.returncode == 0
    finally:
        router.run(["ip", "link", "del", "tbprobe0"], check=False)


def make_backend(choice: str, router: Host, hosts: list[Host], workdir: Path) -> Backend:
    """choice: auto | netem | native. auto = netem where the kernel has it (the field's standard)."""
    if choice in ("auto", "netem") and netem_available(router):
        return NetemBackend(router, hosts, workdir)
    if choice == "netem":
        raise ImpairError("impair.backend = 'netem' but this kernel has no netem (see `tunnelbench doctor`)")
    binary = impaird_binary()
    if binary is None or not binary.exists():
        raise ImpairError("no netem in this kernel and the native engine is not built: run "
                          "`cargo build --release` in native/impaird (scripts/setup.sh does it)")  # fmt: skip
    return NativeBackend(router, hosts, workdir, binary)
