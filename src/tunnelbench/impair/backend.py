"""Impairment backends on the lab router: kernel netem where the kernel has it, the native engine
(native/impaird over iptables NFQUEUE) where it does not. Rate limits are always kernel TBF.

Both impair a packet once per direction on the router's forwarding path. The native engine fails closed:
packets are queued without --queue-bypass, so if the daemon dies, traffic stops and the case fails.

Everything goes through the Host API (run, spawn, write_file, read_file), so the router may be an SSH host
(`router.remote`). On a remote router the interfaces are real NICs that carry other traffic (the SSH
control connection among it): qdiscs then match only peer-to-peer packets (a tagged prio root with u32
filters, see `FilteredTc`), iptables rules match peer addresses only, and everything created is journaled
on the host so `clean --inventory` can undo it. `EgressNetemBackend` is the other real-host placement:
netem on each peer's own egress, impairing what it sends to the other peers (as the ten-VPN thesis did)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunnelbench.impair.profiles import Profile
from tunnelbench.lab.addressing import LAB_PREFIX, host_subnet
from tunnelbench.lab.host import CommandError, Host, Process, host_arch, remote_build
from tunnelbench.lab.journal import register_undo

QUEUE_NUM = 0
CHAIN = "TB_IMPAIR"
ENGINE_PPS_CEILING = 300_000  # measured ceiling of the engine (bench-engine), sizes the kernel queue bound
TC_HANDLE = "7462"  # "tb": the prio root tunnelbench puts on a real host's interface (FilteredTc)
LEAF_HANDLE = "7463"  # the qdisc in its 4th band
PRIOMAP = "1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1"  # the default map: unmatched traffic never reaches band 4
# netem per wire packet: a TBF in front of netem whose largest packet is one wire packet (device MTU + Ethernet
# header) segments every GSO/TSO super-packet at enqueue (sch_tbf.c tbf_enqueue -> tbf_segment) and hands each
# segment to its child, netem, which then decides loss, duplication, reordering and corruption per wire packet,
# not per super-packet (up to 64 KB, ~44 segments dropped or delayed as one). Its rate, where the profile has
# none, is far above any link's, so it segments and never shapes. Used where the native engine segments too
# (a profile with a per-wire decision, or gso = "segment"); delay/jitter/rate-only profiles keep a root netem
# that takes super-packets whole, as the engine's "gso" mode does.
NETEM_PER_WIRE = "per wire packet (a TBF with a one-packet max size segments GSO super-packets before netem)"
NETEM_WHOLE = "GSO super-packets whole (root netem)"
SEGMENT_RATE = "1000gbit"
ETH_HLEN = 14
LINE_RATE_BPS = 25e9  # sizes netem's queue where the profile has no rate (veth TCP measured ~21 Gbit/s)
NETEM_MIN_LIMIT = 1000  # netem's own default, in packets


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


class FilteredTc:
    """Qdiscs on a real host's interface that touch only the peers' packets: a prio root (handle 7462:)
    whose 4th band gets the leaf (netem or tbf) and only the packets the u32 filters select. Everything
    else keeps the default bands. Journaled per interface; `clear` removes only our root."""

    def __init__(self, host: Host):
        self.host = host
        self.entries: dict[str, dict[str, Any]] = {}
        self.active: set[str] = set()  # devices set up since the last clear (several peers may share one)

    def apply(
        self,
        dev: str,
        matches: list[tuple[str | None, str]],
        leaf: list[str],
        child: list[str] | None = None,
    ) -> None:
        """matches: (src or None, dst) IPv4 addresses; leaf: e.g. ["netem", "delay", "5ms"]; child: a qdisc
        under a classful leaf (netem under the segmenting TBF)."""
        h = self.host
        if dev in self.active:  # the same profile's leaf is already there: only steer more packets into it
            self._filters(dev, matches)
            return
        if dev not in self.entries and h.journal is not None:
            self.entries[dev] = h.journal.add({"kind": "qdisc", "dev": dev, "handle": f"{TC_HANDLE}:"})
        r = h.run(
            [
                "tc",
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "handle",
                f"{TC_HANDLE}:",
                "prio",
                "bands",
                "4",
                "priomap",
                *PRIOMAP.split(),
            ],
            check=False,
        )
        if r.returncode != 0:
            raise ImpairError(
                f"{h.name}: cannot put a prio qdisc on {dev} (kernel module sch_prio?): {r.stderr.strip()}"
            )
        self.active.add(dev)
        h.run(
            ["tc", "qdisc", "add", "dev", dev, "parent", f"{TC_HANDLE}:4", "handle", f"{LEAF_HANDLE}:", *leaf]
        )
        if child:
            h.run(["tc", "qdisc", "add", "dev", dev, "parent", f"{LEAF_HANDLE}:1", *child])
        self._filters(dev, matches)

    def _filters(self, dev: str, matches: list[tuple[str | None, str]]) -> None:
        h = self.host
        for src, dst in matches:
            m = ["match", "ip", "dst", f"{dst}/32"] + (["match", "ip", "src", f"{src}/32"] if src else [])
            h.run(
                [
                    "tc",
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    f"{TC_HANDLE}:",
                    "protocol",
                    "ip",
                    "prio",
                    "1",
                    "u32",
                    *m,
                    "flowid",
                    f"{TC_HANDLE}:4",
                ]
            )

    def clear(self) -> None:
        self.active.clear()
        for dev, entry in list(self.entries.items()):
            clear_filtered_root(self.host, dev)
            if self.host.journal is not None:
                self.host.journal.release(entry)
            del self.entries[dev]


def clear_filtered_root(host: Host, dev: str) -> bool:
    """Delete the root qdisc of `dev` only if it is ours (handle 7462:); True if one was removed."""
    shown = host.run(["tc", "qdisc", "show", "dev", dev, "root"], check=False).stdout
    if f" {TC_HANDLE}: root" not in shown:
        return False
    return host.run(["tc", "qdisc", "del", "dev", dev, "root"], check=False).returncode == 0


class Backend(ABC):
    name: str
    # "auto": GSO/GRO super-packets pass whole when the profile makes no per-wire-packet decision (netem's
    # semantics: it delays an skb, which may be a GSO packet); "segment": always per wire packet
    gso_mode = "auto"

    def per_wire(self, p: Profile) -> bool:
        """Does the backend decide per wire packet under `p` (segmenting GSO super-packets first)?"""
        return p.needs_engine and (self.gso_mode == "segment" or p.per_wire)

    def netem_mode(self, p: Profile) -> str | None:
        """netem backends: how netem sees the packets under `p`, for the run's environment record."""
        return None

    def __init__(
        self, router: Host, hosts: Sequence[Host], workdir: Path, ifnames: dict[str, str] | None = None
    ):
        self.router = router
        self.hosts = hosts
        self.workdir = workdir
        self.profile: Profile | None = None
        self.ifnames = ifnames or {}  # remote router: its interface toward each peer (`ip route get`)
        self.remote = router.remote
        self.tc = FilteredTc(router)

    def ifname(self, host: Host) -> str:
        """The router's interface toward `host` (named after the host by the namespace lab)."""
        return self.ifnames.get(host.name, host.name)

    def toward(self, h: Host) -> list[tuple[str | None, str]]:
        """Remote router: (src, dst) of the peer packets forwarded toward `h`."""
        return [(o.underlay_ip, h.underlay_ip) for o in self.hosts if o is not h]

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

    def stats(self) -> dict[str, Any]:
        return {}

    # -- rate: kernel TBF on the router's egress toward each host in scope -------------------------------
    def _apply_rate(self, profile: Profile) -> None:
        if not profile.rate_mbit:
            return
        if profile.pairs:
            raise ImpairError(f"profile {profile.name!r}: rate_mbit with pairs is not supported; use hosts")
        tbf = tbf_args(profile)
        if self.remote:
            if profile.hosts:
                raise ImpairError(
                    f"profile {profile.name!r}: a host-scoped rate limit (uplink shaping) is not "
                    "supported on SSH hosts yet; use all hosts"
                )
            for h in self.scope(profile):
                self.tc.apply(self.ifname(h), self.toward(h), tbf)
            return
        for h in self.scope(profile):
            self.router.run(["tc", "qdisc", "replace", "dev", self.ifname(h), "root", *tbf])
        if profile.hosts:
            # the host's uplink: everything it sends, shaped on an IFB fed from the router's ingress
            for h in self.scope(profile):
                ifb = f"ifb{h.name}"
                self.router.run(["ip", "link", "add", ifb, "type", "ifb"])
                self.router.run(["ip", "link", "set", ifb, "up"])
                self.router.run(["tc", "qdisc", "add", "dev", self.ifname(h), "handle", "ffff:", "ingress"])
                self.router.run(["tc", "filter", "add", "dev", self.ifname(h), "parent", "ffff:", "matchall",
                                 "action", "mirred", "egress", "redirect", "dev", ifb])  # fmt: skip
                self.router.run(["tc", "qdisc", "replace", "dev", ifb, "root", *tbf])

    def _clear_tc(self) -> None:
        if self.remote:
            self.tc.clear()
            return
        for h in self.hosts:
            self.router.run(["tc", "qdisc", "del", "dev", self.ifname(h), "root"], check=False)
            self.router.run(["tc", "qdisc", "del", "dev", self.ifname(h), "ingress"], check=False)
            if self.router.run(["ip", "link", "show", f"ifb{h.name}"], check=False).returncode == 0:
                self.router.run(["ip", "link", "del", f"ifb{h.name}"], check=False)


class NetemBackend(Backend):
    name = "netem"

    def netem_mode(self, p: Profile) -> str | None:
        return (NETEM_PER_WIRE if self.per_wire(p) else NETEM_WHOLE) if p.needs_engine else None

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
            for h in self.scope(profile):
                dev = self.ifname(h)
                if self.per_wire(profile):  # netem under a segmenting TBF
                    leaf, child = per_wire_netem(profile, device_mtu(self.router, dev))
                else:  # netem alone: it takes GSO super-packets whole
                    leaf, child = ["netem", *netem_args(profile)], None
                if self.remote:
                    self.tc.apply(dev, self.toward(h), leaf, child)
                    continue
                self.router.run(
                    ["tc", "qdisc", "replace", "dev", dev, "root", "handle", f"{LEAF_HANDLE}:", *leaf]
                )
                if child:
                    self.router.run(["tc", "qdisc", "add", "dev", dev, "parent", f"{LEAF_HANDLE}:1", *child])
        else:
            self._apply_rate(profile)

    def clear(self) -> None:
        self._clear_tc()
        self.profile = None


def tbf_args(p: Profile) -> list[str]:
    assert p.rate_mbit is not None  # a rate limit's arguments
    rate_bps = p.rate_mbit * 1e6
    # queue: the bandwidth-delay product of the profile's RTT plus 20 ms, so TCP can fill the pipe
    rtt_s = 2 * (p.delay_ms + p.jitter_ms) / 1000 + 0.02
    limit = max(64_000, int(rate_bps / 8 * rtt_s))
    burst = max(32_000, int(rate_bps / 8 / 250))
    return ["tbf", "rate", f"{p.rate_mbit}mbit", "burst", str(burst), "limit", str(limit)]


def device_mtu(host: Host, dev: str) -> int:
    """The MTU of `dev` on `host` (`ip -o link show`)."""
    words = host.run(["ip", "-o", "link", "show", "dev", dev]).stdout.split()
    return int(words[words.index("mtu") + 1])


def per_wire_netem(p: Profile, mtu: int) -> tuple[list[str], list[str]]:
    """The qdiscs that make netem decide per wire packet on a device of this MTU: a TBF (to put first) and
    netem (its child, parent <tbf handle>:1).

    TBF's largest packet (max_size) is its burst, or with a peak rate min(burst, mtu): here one wire packet,
    MTU + Ethernet header. tbf_enqueue segments a bigger GSO skb (skb_gso_segment, its segments no bigger
    than that) and enqueues each segment to netem: each gets its own loss/duplicate/reorder/corrupt draw.
    Without a rate the TBF's rate is SEGMENT_RATE and its burst one wire packet (it never shapes); with one,
    the TBF is the profile's rate limit (tbf_args, as for a rate-only profile) and its peak rate SEGMENT_RATE
    over a one-packet bucket sets max_size (netem's own `rate` is not used). netem's queue then counts wire
    packets, not super-packets: its limit is the rate x (RTT + 20 ms) of tbf_args, in wire packets (netem holds
    both the delay line and, under a rate, the packets waiting for TBF's tokens)."""
    seg = mtu + ETH_HLEN
    rate_bps = p.rate_mbit * 1e6 if p.rate_mbit else LINE_RATE_BPS
    rtt_s = 2 * (p.delay_ms + p.jitter_ms) / 1000 + 0.02
    limit = max(NETEM_MIN_LIMIT, int(rate_bps / 8 * rtt_s / seg))
    if p.rate_mbit:
        tbf = [*tbf_args(p), "peakrate", SEGMENT_RATE, "mtu", str(seg)]
    else:
        # (a TBF's limit only sizes its default bfifo child, which netem replaces)
        tbf = ["tbf", "rate", SEGMENT_RATE, "burst", str(seg), "limit", str(NETEM_MIN_LIMIT * seg)]
    return tbf, ["netem", "limit", str(limit), *netem_args(p, rate=False)]


class EgressNetemBackend(Backend):
    """netem on each peer's own egress interface (its underlay_if): every host impairs what it sends to
    the other peers, so a packet is impaired once per direction, as on the router. Needs netem on every
    peer; the u32 filters keep all other traffic (the SSH control connection) unimpaired."""

    name = "netem-egress"

    def netem_mode(self, p: Profile) -> str | None:
        return (NETEM_PER_WIRE if self.per_wire(p) else NETEM_WHOLE) if p.needs_engine else None

    def __init__(self, hosts: Sequence[Host], workdir: Path):
        super().__init__(hosts[0], hosts, workdir)
        self.remote = True
        self.tcs = {h.name: FilteredTc(h) for h in hosts}

    def _targets(self, p: Profile, src: Host) -> list[Host]:
        """Peers whose packets from `src` are impaired: the router semantics (toward hosts in scope, and
        from them when the profile names hosts), or the named pairs."""
        if p.pairs:
            names = {h.name for h in self.hosts}
            for a, b in p.pairs:
                if a not in names or b not in names:
                    raise ImpairError(f"profile {p.name!r}: pair ({a}, {b}) names an unknown host")
            return [
                d
                for d in self.hosts
                if d is not src and any({a, b} == {src.name, d.name} for a, b in p.pairs)
            ]
        scope = {h.name for h in self.scope(p)}
        return [
            d for d in self.hosts if d is not src and (d.name in scope or (p.hosts and src.name in scope))
        ]

    def apply(self, profile: Profile, force_engine: bool = False) -> None:
        self.clear()
        self.profile = profile
        if profile.hosts and profile.rate_mbit and not profile.needs_engine:
            raise ImpairError(
                f"profile {profile.name!r}: a host-scoped rate limit is not supported on egress"
            )
        if not profile.needs_engine and not profile.rate_mbit:
            return
        for h in self.hosts:
            dsts = self._targets(profile, h)
            if not dsts:
                continue
            if self.per_wire(profile):
                leaf, child = per_wire_netem(profile, device_mtu(h, h.underlay_if))
            elif profile.needs_engine:
                leaf, child = ["netem", *netem_args(profile)], None
            else:
                leaf, child = tbf_args(profile), None
            self.tcs[h.name].apply(h.underlay_if, [(None, d.underlay_ip) for d in dsts], leaf, child)

    def clear(self) -> None:
        for tc in self.tcs.values():
            tc.clear()
        self.profile = None


def netem_args(p: Profile, rate: bool = True) -> list[str]:
    """netem's arguments for the profile; rate=False leaves the rate limit out (a TBF in front does it)."""
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
        a += ["loss", "gemodel", f"{100 * q * (1 - c):.6g}%", f"{100 * (1 - q) * (1 - c):.6g}%", "100%", "0%"]
    elif p.loss_pct:
        a += ["loss", "random", f"{p.loss_pct}%"] + (
            [f"{p.loss_correlation_pct}%"] if p.loss_correlation_pct else []
        )
    if p.gemodel:
        # tc-netem(8): `loss gemodel p r 1-h 1-k`, where 1-h is the loss probability in the bad state and 1-k
        # the loss probability in the good state (iproute2 turns 1-h into the kernel's h itself)
        g = p.gemodel
        a += ["loss", "gemodel", f"{g.p_pct}%", f"{g.r_pct}%", f"{g.bad_loss_pct}%", f"{g.good_loss_pct}%"]
    if p.loss_state:
        s = p.loss_state
        a += ["loss", "state", *(f"{x}%" for x in (s.p13, s.p31, s.p32, s.p23, s.p14))]
    if p.reorder_pct:
        # netem's correlated uniform (get_crandom) keeps the mean but narrows the spread, so a small reorder
        # probability is almost never drawn: `reorder 2.5% 50%` reordered 0 of 3000 probes on Debian's 6.1
        # kernel (2.3% without the correlation). Under the markov model (rate first) the correlation is left out
        a += ["reorder", f"{p.reorder_pct}%"] + (
            [f"{p.reorder_correlation_pct}%"]
            if p.reorder_correlation_pct and p.correlation_model != "markov"
            else []
        )
    if p.duplicate_pct:
        a += ["duplicate", f"{p.duplicate_pct}%"]
    if p.corrupt_pct:
        a += ["corrupt", f"{p.corrupt_pct}%"]
    if p.rate_mbit and rate:
        a += ["rate", f"{p.rate_mbit}mbit"]
    return a


def engine_rule(name: str, src: str, dst: str, p: Profile) -> dict[str, Any]:
    r: dict[str, Any] = {
        "name": name,
        "src": src,
        "dst": dst,
        "correlation_model": p.correlation_model,
        "delay_us": int(p.delay_ms * 1000),
        "jitter_us": int(p.jitter_ms * 1000),
        "distribution": p.distribution,
        "delay_correlation": p.delay_correlation_pct / 100,
        "loss": None,
        "reorder": {"p": p.reorder_pct / 100, "correlation": p.reorder_correlation_pct / 100},
        "duplicate": {"p": p.duplicate_pct / 100, "correlation": p.duplicate_correlation_pct / 100},
        "corrupt": {"p": p.corrupt_pct / 100, "correlation": 0.0},
    }
    if p.loss_pct:
        r["loss"] = {"model": "random", "p": p.loss_pct / 100, "correlation": p.loss_correlation_pct / 100}
    elif p.gemodel:
        g = p.gemodel
        r["loss"] = {
            "model": "gemodel",
            "p": g.p_pct / 100,
            "r": g.r_pct / 100,
            "h": 1 - g.bad_loss_pct / 100,
            "k": 1 - g.good_loss_pct / 100,
        }
    elif p.loss_state:
        s = p.loss_state
        r["loss"] = {
            "model": "state",
            **{k: getattr(s, k) / 100 for k in ("p13", "p31", "p32", "p23", "p14")},
        }
    return r


class NativeBackend(Backend):
    name = "native"

    def __init__(
        self,
        router: Host,
        hosts: Sequence[Host],
        workdir: Path,
        binary: Path,
        ifnames: dict[str, str] | None = None,
        chain: str = CHAIN,
    ):
        super().__init__(router, hosts, workdir, ifnames)
        self.binary = binary  # a path on the router (copied there for a remote router)
        self.chain = chain
        self.proc: Process | None = None
        self.forced = False
        self.seed: int | None = None  # fixed for reproducible tests; random per apply otherwise
        self.stats_path = workdir / "impaird-stats.json"
        self._chain_entry: dict[str, Any] | None = None
        # "auto": GSO/GRO super-packets are queued whole and the engine decides per wire packet inside them (one
        # verdict when all pass alike, kernel segmentation on a second queue otherwise); "segment": the kernel
        # segments every super-packet before queueing (the old, slower mode)
        self.gso_mode = "auto"  # (Backend.gso_mode)
        self.gso = False  # what the running engine does
        self.cpus: str | None = None  # CPU list the engine is confined to (cpu placement), None = any
        # an engine with CPUs of its own busy-polls (no cross-CPU wake-up per burst) and needs no real-time
        # priority (nothing else runs there); sharing CPUs it sleeps between packets at SCHED_FIFO
        self.busy_poll_us = 0
        self.realtime = True

    def version(self) -> str:
        return self.router.run([str(self.binary), "--version"], check=False).stdout.strip()

    def place(self, cpus: str | None, busy_poll_us: int | None = None, realtime: bool | None = None) -> None:
        """Confine the engine to `cpus` (None = any). With CPUs of its own it busy-polls (1 ms) and needs no
        SCHED_FIFO (nothing else runs there); sharing, it sleeps between packets at SCHED_FIFO."""
        own = cpus is not None
        self.cpus = cpus
        self.busy_poll_us = busy_poll_us if busy_poll_us is not None else (1000 if own else 0)
        self.realtime = realtime if realtime is not None else not own

    def _net(self, h: Host) -> str:
        return f"{h.underlay_ip}/32" if self.remote else str(host_subnet(self._idx[h.name]))

    def rules(self, p: Profile) -> list[dict[str, Any]]:
        by_name = {h.name: h for h in self.hosts}
        self._idx = {h.name: i for i, h in enumerate(self.hosts, start=1)}
        everyone = "0.0.0.0/0" if self.remote else str(LAB_PREFIX)  # remote: only peer pairs are queued
        if p.pairs:
            rules = []
            for a, b in p.pairs:
                if a not in by_name or b not in by_name:
                    raise ImpairError(f"profile {p.name!r}: pair ({a}, {b}) names an unknown host")
                sa, sb = self._net(by_name[a]), self._net(by_name[b])
                rules += [engine_rule(f"{a}->{b}", sa, sb, p), engine_rule(f"{b}->{a}", sb, sa, p)]
            return rules
        rules = []
        for h in self.scope(p):
            sub = self._net(h)
            rules.append(engine_rule(f"to-{h.name}", everyone, sub, p))
            if p.hosts:  # a restricted scope impairs the host's uplink too
                rules.append(engine_rule(f"from-{h.name}", sub, everyone, p))
        return rules

    def apply(self, profile: Profile, force_engine: bool = False) -> None:
        self.clear()
        self.profile = profile
        self._apply_rate(profile)
        if not (profile.needs_engine or force_engine):
            return
        self.forced = force_engine
        self.gso = self.gso_mode == "auto"
        held_s = (profile.delay_ms + 3 * profile.jitter_ms) / 1000 + 0.05
        rate_pps = (profile.rate_mbit * 1e6 / 8 / 1500) if profile.rate_mbit else ENGINE_PPS_CEILING
        cfg = {
            "queue": QUEUE_NUM,
            # bound the kernel queue at about 2 x rate x delay packets (the engine drops and counts beyond)
            "queue_maxlen": int(min(400_000, max(4096, 2 * rate_pps * held_s))),
            "stats_path": str(self.stats_path),
            "stats_interval_ms": 200,
            "seed": self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little"),
            "realtime": self.realtime,
            "gso": self.gso,
            "busy_poll_us": self.busy_poll_us,
            "rules": self.rules(profile),
        }
        cfg_path = self.workdir / "impaird.json"
        r = self.router
        r.write_file(cfg_path, json.dumps(cfg, indent=1))
        chk = r.run([str(self.binary), "--check-config", str(cfg_path)], check=False)
        if chk.returncode != 0:
            raise ImpairError(f"impaird rejected the config for {profile.name!r}: {chk.stdout}{chk.stderr}")
        r.remove(self.stats_path)
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        self.proc = r.spawn(
            [*pin, str(self.binary), "--config", str(cfg_path)],
            label="impaird",
            log_path=self.workdir / "impaird.log",
        )
        deadline = time.monotonic() + 10
        while not r.exists(self.stats_path):
            if not self.proc.alive() or time.monotonic() > deadline:
                raise ImpairError(f"impaird did not start: {self.proc.log_tail(800)}")
            time.sleep(0.02)
        # queue only lab-to-lab forwarded traffic; no --queue-bypass: if the engine dies, packets drop
        if r.journal is not None and self.remote:
            self._chain_entry = r.journal.add(
                {"kind": "iptables_chain", "table": "mangle", "chain": self.chain, "from": "FORWARD"}
            )
        r.run(["iptables", "-t", "mangle", "-N", self.chain])
        if self.remote:  # real networks: peer-to-peer packets only (never the control connection)
            for a in self.hosts:
                for b in self.hosts:
                    if a is not b:
                        r.run(["iptables", "-t", "mangle", "-A", self.chain, "-s", f"{a.underlay_ip}/32",
                               "-d", f"{b.underlay_ip}/32", "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)])  # fmt: skip
        else:
            r.run(["iptables", "-t", "mangle", "-A", self.chain, "-s", str(LAB_PREFIX), "-d", str(LAB_PREFIX),
                   "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)])  # fmt: skip
        r.run(["iptables", "-t", "mangle", "-A", "FORWARD", "-j", self.chain])

    def clear(self) -> None:
        remove_iptables_chain(self.router, "mangle", self.chain, "FORWARD")
        if self._chain_entry is not None and self.router.journal is not None:
            self.router.journal.release(self._chain_entry)
            self._chain_entry = None
        if self.proc is not None:
            self.proc.stop(grace=2)
            self.proc = None
        self._clear_tc()
        self.profile = None
        self.forced = False

    def stats(self) -> dict[str, Any]:
        try:
            stats: dict[str, Any] = json.loads(self.router.read_file(self.stats_path))
            return stats
        except (OSError, CommandError, json.JSONDecodeError):
            return {}

    def _stats_age(self) -> float | None:
        if not self.remote:
            try:
                return time.time() - self.stats_path.stat().st_mtime
            except OSError:
                return None
        q = str(self.stats_path).replace("'", "")
        r = self.router.run(
            ["sh", "-c", f"m=$(stat -c %Y '{q}') && echo $(( $(date +%s) - m ))"], check=False
        )
        try:
            # whole seconds: an age of 2 may be up to 3 s; allow it
            return max(0.0, float(r.stdout.strip()) - 1.0)
        except ValueError:
            return None

    def health(self) -> str | None:
        if self.profile is None or not (self.profile.needs_engine or self.forced):
            return None
        if self.proc is None or not self.proc.alive():
            tail = self.proc.log_tail(400) if self.proc else ""
            return f"the impairment engine (impaird) is not running: traffic is blocked (fail closed). {tail}"
        age = self._stats_age()
        if age is None:
            return "impaird wrote no stats file"
        if age > 2.0:
            return f"impaird stats are {age:.1f} s old: the engine is stalled"
        return None


def remove_iptables_chain(host: Host, table: str, chain: str, parent: str) -> bool:
    """Unhook, flush and delete an iptables chain we made; True if it existed."""
    r = host.run(["iptables", "-t", table, "-D", parent, "-j", chain], check=False)
    if r.returncode == 0:
        host.run(["iptables", "-t", table, "-F", chain], check=False)
        host.run(["iptables", "-t", table, "-X", chain], check=False)
    return r.returncode == 0


def _undo_qdisc(host: Host, entry: dict[str, Any]) -> str | None:
    return f"qdisc on {entry['dev']}" if clear_filtered_root(host, entry["dev"]) else None


def _undo_iptables_chain(host: Host, entry: dict[str, Any]) -> str | None:
    gone = remove_iptables_chain(
        host, entry.get("table", "mangle"), entry["chain"], entry.get("from", "FORWARD")
    )
    return f"iptables chain {entry['chain']}" if gone else None


# what a killed run's impairment left on a real host (FilteredTc's prio roots, the engine's NFQUEUE chain):
# `clean --inventory` and the SSH teardown undo these journal entries through the lab's registry
register_undo("qdisc", _undo_qdisc)
register_undo("iptables_chain", _undo_iptables_chain)


def netem_available(router: Host, probe_if: str = "tbprobe0") -> bool:
    """Probe netem for real on a throwaway interface on the router (dummy, or a veth pair where the kernel
    has no dummy driver). On an SSH host pass a tagged probe_if so `clean` would find a leftover."""
    made = False
    for kind in (["dummy"], ["veth", "peer", "name", probe_if + "p"]):
        if router.run(["ip", "link", "add", probe_if, "type", *kind], check=False).returncode == 0:
            made = True
            break
    if not made:
        return False
    try:
        r = router.run(["tc", "qdisc", "add", "dev", probe_if, "root", "netem", "delay", "1ms"], check=False)
        return r.returncode == 0
    finally:
        router.run(["ip", "link", "del", probe_if], check=False)


def remote_impaird(router: Host) -> Path:
    """The native engine on an SSH router: the local build copied to its work folder when the architectures
    match, else an impaird on its PATH (lab.host.remote_build)."""
    local = impaird_binary()
    found = remote_build(router, "impaird", local)
    if found is not None:
        return Path(found)
    arch = host_arch(router)
    raise ImpairError(
        f"{router.name} has no netem and no impaird: the local build "
        + (f"is for {platform.machine()}, the host is {arch}" if local else "does not exist")
        + "; build native/impaird for it (cargo build --release --target ...) and put impaird on its PATH"
    )


def make_backend(
    choice: str,
    router: Host,
    hosts: Sequence[Host],
    workdir: Path,
    ifnames: dict[str, str] | None = None,
    tag: str = "",
) -> Backend:
    """choice: auto | netem | native. auto = netem where the kernel has it (the field's standard).
    A remote (SSH) router: ifnames are its interfaces toward each peer, tag names what it creates there."""
    probe_if = f"{tag}nprobe" if router.remote else "tbprobe0"
    if choice in ("auto", "netem") and netem_available(router, probe_if):
        return NetemBackend(router, hosts, workdir, ifnames)
    if choice == "netem":
        raise ImpairError(
            f"impair.backend = 'netem' but {router.name}'s kernel has no netem (see `tunnelbench doctor`)"
        )
    if router.remote:
        chain = f"{CHAIN}_{tag}" if tag else CHAIN
        return NativeBackend(router, hosts, workdir, remote_impaird(router), ifnames, chain)
    binary = impaird_binary()
    if binary is None or not binary.exists():
        raise ImpairError(
            "no netem in this kernel and the native engine is not built: run "
            "`cargo build --release` in native/impaird (scripts/setup.sh does it)"
        )
    return NativeBackend(router, hosts, workdir, binary)
