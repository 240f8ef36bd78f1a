"""Plaintext leak check (security conformance, and relay blindness): random marker messages go over the tunnel
from the client to the server's tunnel address (TCP, UDP, ICMP; several sizes) while one namespace captures
every frame it sees (tcpdump -i any). A captured frame that holds the marker or any fixed-offset fragment of
it (offsets 0, f, 2f, ... and the tail window, f = fragment_bytes) is plaintext.

capture_at = "router" (the leak check, metrics leak_*): the router namespace, which forwards every underlay frame
between hosts. The check fails if any frame there holds plaintext.

capture_at = "relay" (relay blindness, metrics relay_*): the lab's relay host (`[lab] path = "relay"`),
which sees its underlay and any tunnel device the VPN's relay daemon has there: a relay that routes at the
VPN layer (a mesh node) shows the decrypted marker on its tun device. Verdict: 0 = the relay sees plaintext,
1 = metadata only (it carried the markers' frames as ciphertext), 2 = nothing crossed the relay (the VPN went
around it: no verdict on blindness). "Carried" = on each leg, client -> relay and relay -> server, the
marker-sized frames (IP packets at least as long as the smallest message plus IPv4 and UDP headers) add up to
at least half the marker bytes sent: a relay that carried the markers moves all of them plus its overhead
(measured 141-186%), while the VPN's own keepalives and pings with the relay over the second or two of a check
are far fewer bytes (a VPN that compressed the repetitive messages could show 2; none of the relay VPNs here
does). A relay that holds the
keys but switches in process memory (a SoftEther hub terminates TLS) shows no plaintext to a capture: the
verdict is what crosses the relay host's interfaces, not what its daemon could read.

Each (protocol, size) stream has its own 32-byte marker (ICMP: 16, all that `ping -p` carries), so a hit
names what leaked. A message of N bytes is its marker repeated to N bytes, so every size carries whole
markers. The control: every marker must arrive intact at the server (TCP/UDP: counted by leak_peer; ICMP:
echo replies), and the capture must have dropped nothing and written a plaintext sentinel the capturing
namespace pings after the markers (so it holds every frame before it); otherwise the case fails as
inconclusive, since a tunnel that delivers nothing, or a capture that misses frames, trivially "does not leak".
Positive controls: `internal` (no VPN) and `vxlan` (no encryption) must be caught leaking at the router; a
relay host that forwards the plaintext (tests/security/test_security.py) must be caught at the relay.

Evidence: underlay.pcap (or relay.pcap) and leak.json (per stream: marker, messages delivered, plaintext
frames; the relay's legs) in the case folder."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import signal
import struct
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments import leak_peer
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.lab.host import Host, Process
from tunnelbench.workloads.base import CaseContext, Params, Workload, WorkloadError

Proto = Literal["tcp", "udp", "icmp"]
PORT = 47031  # leak_peer's TCP and UDP port on the server's tunnel address
PING_PATTERN = 16  # ping -p fills the payload with at most 16 pattern bytes
PING_STAMP = 16  # ...after a 16-byte timestamp in the first payload bytes
IP_UDP_HEADERS = 28  # IPv4 + UDP: the least any packet carrying a message adds to it
BLOCK_TIMEOUT_S = 1.0  # tcpdump's pcap timeout: a partly filled capture block reaches it after this
STATS = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel)$", re.M)
# link-layer header length and offset of the EtherType: Ethernet, Linux cooked (-i any) v1 and v2
LINKTYPES = {1: (14, 12), 113: (16, 14), 276: (20, 0)}
# relay_verdict values
PLAINTEXT, METADATA_ONLY, NOTHING_CROSSED = 0, 1, 2
ROUTER_HEADLINE = ("leak_pass", "leak_plaintext_frames", "leak_markers_delivered_pct")
RELAY_HEADLINE = ("relay_verdict", "relay_plaintext_frames", "relay_carried_pct")
CARRIED_PCT = 50  # % of the marker bytes both legs through the relay must carry for "the markers crossed it"


class LeakParams(Params):
    sizes: list[Annotated[int, Field(ge=16, le=1400)]] = Field(
        [64, 512, 1300], min_length=1, description="message payload bytes"
    )
    protocols: list[Proto] = Field(["tcp", "udp", "icmp"], min_length=1, description="protocols sent")
    count: int = Field(5, ge=1, le=1000, description="messages per protocol and size")
    fragment_bytes: int = Field(
        12, ge=8, le=32, description="window searched at marker offsets 0, f, 2f, ... (plus the whole marker)"
    )
    capture_at: Literal["router", "relay"] = Field(
        "router",
        description='where to capture: "router" (every underlay frame; leak_* metrics) or "relay" (the lab\'s '
        'relay host, [lab] path = "relay"; relay_* metrics)',
    )

    @model_validator(mode="after")
    def _fits(self) -> LeakParams:
        if self.fragment_bytes > min(self.sizes):
            raise ValueError(
                f"fragment_bytes {self.fragment_bytes} exceeds the smallest size {min(self.sizes)}"
            )
        if "icmp" in self.protocols and min(self.sizes) < PING_STAMP + PING_PATTERN:
            raise ValueError(
                f"icmp needs sizes >= {PING_STAMP + PING_PATTERN}: ping's timestamp takes the "
                f"first {PING_STAMP} payload bytes, the marker pattern follows"
            )
        return self


def new_marker(n: int = 32) -> bytes:
    """Random bytes without repeated neighbours: no run (00 00 00 ...) that padding could match by chance."""
    while True:
        m = secrets.token_bytes(n)
        if all(a != b for a, b in zip(m, m[1:], strict=False)):
            return m


def fragments(marker: bytes, f: int) -> list[bytes]:
    """The whole marker and its f-byte windows at offsets 0, f, 2f, ... plus the tail window (every byte)."""
    f = min(f, len(marker))
    offsets = list(range(0, len(marker) - f + 1, f))
    if offsets[-1] != len(marker) - f:
        offsets.append(len(marker) - f)
    return [marker] + [marker[o : o + f] for o in offsets]


PCAP_ORDER = {
    b"\xd4\xc3\xb2\xa1": "<",
    b"\x4d\x3c\xb2\xa1": "<",
    b"\xa1\xb2\xc3\xd4": ">",
    b"\xa1\xb2\x3c\x4d": ">",
}


def _pcap_order(data: bytes) -> str:
    if len(data) < 24 or data[:4] not in PCAP_ORDER:
        raise WorkloadError("the capture is not a classic pcap file")
    return PCAP_ORDER[data[:4]]


def pcap_frames(data: bytes) -> list[bytes]:
    """Frames of a classic pcap file, either byte order (µs or ns stamps); a cut-off last record is kept."""
    rec = struct.Struct(_pcap_order(data) + "IIII")  # ts_sec, ts_frac, incl_len, orig_len
    frames, off = [], 24
    while off + rec.size <= len(data):
        incl = rec.unpack_from(data, off)[2]
        off += rec.size
        frames.append(data[off : off + incl])
        off += incl
    return frames


def pcap_linktype(data: bytes) -> int:
    linktype: int = struct.unpack_from(_pcap_order(data) + "I", data, 20)[0]
    return linktype


def ip_header(frame: bytes, linktype: int) -> tuple[str, str, int] | None:
    """(source, destination, IP packet length) of an IPv4 or IPv6 frame; None for anything else."""
    if linktype not in LINKTYPES:
        return None
    hdr, et = LINKTYPES[linktype]
    ip = frame[hdr:]
    ethertype = frame[et : et + 2]
    if ethertype == b"\x08\x00" and len(ip) >= 20:
        length = struct.unpack_from(">H", ip, 2)[0]
        return str(ipaddress.IPv4Address(ip[12:16])), str(ipaddress.IPv4Address(ip[16:20])), length
    if ethertype == b"\x86\xdd" and len(ip) >= 40:
        length = 40 + struct.unpack_from(">H", ip, 4)[0]
        return str(ipaddress.IPv6Address(ip[8:24])), str(ipaddress.IPv6Address(ip[24:40])), length
    return None


def leaking(frames: list[bytes], needles: list[bytes]) -> int:
    """How many frames contain any of the needles."""
    return sum(1 for fr in frames if any(n in fr for n in needles))


def relay_legs(
    frames: list[bytes], linktype: int, client: str, server: str, min_len: int, sentinel: bytes
) -> tuple[int, int]:
    """IP bytes of the marker-sized frames (IP packet >= min_len) the relay received from the client and sent
    to the server, not counting the capture's own sentinel ping."""
    from_client = to_server = 0
    for fr in frames:
        h = ip_header(fr, linktype)
        if h is None or h[2] < min_len or sentinel in fr:
            continue
        from_client += h[2] if h[0] == client else 0
        to_server += h[2] if h[1] == server else 0
    return from_client, to_server


def relay_verdict(plaintext_frames: int, carried_pct: float) -> int:
    """PLAINTEXT if the relay saw a marker fragment, METADATA_ONLY if its lighter leg carried at least half the
    marker bytes without one, NOTHING_CROSSED otherwise (the traffic went around it: no claim of blindness)."""
    if plaintext_frames:
        return PLAINTEXT
    return METADATA_ONLY if carried_pct >= CARRIED_PCT else NOTHING_CROSSED


def peer_argv(host: Host) -> list[str]:
    """leak_peer on `host`, run as a plain script (not -m: that would import every workload first); on an
    SSH host the stdlib-only file is copied there once."""
    if not host.remote:
        return [sys.executable, leak_peer.__file__]
    path = host.workdir / "leak" / "tbleakpeer.py"
    if host.__dict__.get("_tb_leak_peer") != path:
        host.write_file(path, Path(leak_peer.__file__).read_bytes(), 0o755)
        host.__dict__["_tb_leak_peer"] = path
    return ["python3", str(path)]


def wait_log(proc: Process, text: str, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while text not in proc.log_tail(4000):
        if time.monotonic() > end or not proc.alive():
            proc.stop(grace=1)
            raise WorkloadError(f"{what} did not start: {proc.log_tail(400)}")
        time.sleep(0.02)


class Capture:
    """tcpdump -i any in one host's namespace for the length of a `with` block, into `<name>.pcap` in the case
    folder. Complete when the kernel dropped nothing and the plaintext sentinel that mark() pings from that
    namespace after the markers is in the file: the file then holds every frame before it (the last block is
    handed over only after tcpdump's timeout; seen: 8 of 344 frames missing without the sentinel)."""

    def __init__(self, host: Host, artifact_dir: Path, name: str) -> None:
        self.host = host
        self.local = artifact_dir / f"{name}.pcap"
        self.pcap = (host.workdir / "leak" if host.remote else artifact_dir) / f"{name}.pcap"
        self.log = artifact_dir / f"{name}-tcpdump.log"
        self.sentinel = new_marker(PING_PATTERN)
        self.proc: Process | None = None
        self.data = b""
        self.stats: dict[str, int] = {}

    def __enter__(self) -> Capture:
        self.host.mkdir(self.pcap.parent)
        # -Z root: Debian's tcpdump would otherwise drop to user tcpdump, who cannot write the case folder.
        # No --immediate-mode: libpcap then falls back to TPACKET_V2, one ring slot per snaplen (64 slots in
        # 32 MB at -s 0; seen dropping 87 of 340 frames of a wireguard-go burst). TPACKET_V3 packs frames into
        # blocks handed over when full or after tcpdump's 1 s timeout; -B 32 MB: room for bursts while
        # tcpdump is descheduled on a busy machine.
        argv = [
            "tcpdump",
            "-n",
            "-i",
            "any",
            "-s",
            "0",
            "-U",
            "-B",
            "32768",
            "-Z",
            "root",
            "-w",
            str(self.pcap),
        ]
        self.proc = self.host.spawn(argv, label=f"leak-tcpdump-{self.host.name}", log_path=self.log)
        wait_log(self.proc, "listening on", 15, f"tcpdump on {self.host.name}")
        return self

    def mark(self, target_ip: str) -> None:
        """Ping the sentinel from the capturing namespace, then wait until tcpdump has written it."""
        self.host.run(["ping", "-n", "-q", "-c", "1", "-W", "1", "-p", self.sentinel.hex(), target_ip],
                      check=False)  # fmt: skip
        end = time.monotonic() + BLOCK_TIMEOUT_S + 3
        while time.monotonic() < end:
            if self.host.exists(self.pcap) and self.sentinel in self.host.read_file(self.pcap):
                return
            time.sleep(0.1)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.proc is not None
        self.host.signal(self.proc.pid, signal.SIGINT)  # tcpdump writes what it has read, prints its counts
        self.proc.wait(5)
        self.proc.stop(grace=2)
        self.stats = {what: int(n) for n, what in STATS.findall(self.proc.log_tail(4000))}  # tcpdump's own

    def frames(self) -> list[bytes]:
        self.data = self.host.read_file(self.pcap)
        if self.host.remote:
            self.local.write_bytes(self.data)
        return pcap_frames(self.data)

    @property
    def linktype(self) -> int:
        return pcap_linktype(self.data)

    def incomplete(self) -> str | None:
        """Why the capture cannot prove an absence (None: it holds every frame up to the sentinel)."""
        dropped = self.stats.get("dropped by kernel", 0)
        if dropped:
            return f"dropped {dropped} frames"
        return None if self.sentinel in self.data else "lacks the sentinel pinged after the markers"


class Leak(Workload):
    name = "leak"
    summary = (
        "plaintext leak: markers sent over the tunnel must not appear in any underlay frame at the router "
        "(capture_at relay: on the relay host, relay blindness)"
    )
    tools = ("ping", "tcpdump")
    # the summary shows whichever exist; an instance leads with its own (the runner's adaptive repetitions
    # follow headline[0])
    headline = (*ROUTER_HEADLINE, *RELAY_HEADLINE)
    Params = LeakParams
    params: LeakParams
    metrics = (
        MetricSpec("leak_pass", "bool", "higher", "1 = no marker fragment in any underlay frame, 0 = leaked"),
        MetricSpec("leak_plaintext_frames", "frames", "lower", "underlay frames holding a marker fragment"),
        MetricSpec("leak_plaintext_frames_tcp", "frames", "lower", "the same, TCP markers"),
        MetricSpec("leak_plaintext_frames_udp", "frames", "lower", "the same, UDP markers"),
        MetricSpec("leak_plaintext_frames_icmp", "frames", "lower", "the same, ICMP echo patterns"),
        MetricSpec("leak_markers_delivered_pct", "%", "higher", "markers the server received intact"),
        MetricSpec("leak_frames_captured", "frames", "none", "underlay frames the router captured"),
        MetricSpec(
            "relay_verdict",
            "verdict",
            "none",
            "what the relay host sees: 0 = plaintext, 1 = metadata only (carried ciphertext), "
            "2 = nothing crossed the relay (no claim)",
        ),
        MetricSpec(
            "relay_plaintext_frames", "frames", "lower", "frames on the relay host holding a marker fragment"
        ),
        MetricSpec(
            "relay_carried_pct",
            "%",
            "none",
            "bytes of marker-sized frames on the relay's lighter leg (client -> relay, relay -> server), "
            f"% of the marker bytes sent; >= {CARRIED_PCT}: the markers crossed the relay",
        ),
        MetricSpec(
            "relay_frames_captured", "frames", "none", "frames the relay host captured during the check"
        ),
    )

    def __init__(self, params: LeakParams) -> None:
        super().__init__(params)
        if params.capture_at == "relay":
            self.headline = (*RELAY_HEADLINE, *ROUTER_HEADLINE)

    def label(self) -> str:
        return "leak" if self.params.capture_at == "router" else "leak-relay"

    def expected_seconds(self) -> float:
        p = self.params
        return 10 + len(p.sizes) * len(p.protocols) * p.count * 0.02

    def _capture_host(self, ctx: CaseContext) -> Host:
        lab = ctx.lab
        if self.params.capture_at == "router":
            router = lab.router if lab else None
            if router is None:
                raise WorkloadError(
                    "the leak check needs the lab's router host: it captures the underlay there"
                )
            return router
        relay = lab.relay if lab else None
        if relay is None:
            raise WorkloadError(
                'leak with capture_at = "relay" needs a relay host: set [lab] path = "relay" '
                '(relay = "hN", default the last host)'
            )
        if relay in (ctx.client, ctx.server):
            raise WorkloadError(
                f"the relay host {relay.name} is the client or the server: it would see the markers "
                "as an endpoint, not as a relay"
            )
        return relay

    def run(self, ctx: CaseContext) -> Outcome:
        p = self.params
        at = self._capture_host(ctx)
        t0 = time.monotonic()
        streams: dict[tuple[str, int], bytes] = {
            (pr, n): new_marker(PING_PATTERN if pr == "icmp" else 32) for pr in p.protocols for n in p.sizes
        }
        with Capture(at, ctx.artifact_dir, "underlay" if p.capture_at == "router" else "relay") as cap:
            delivered = self._send(ctx, p, streams)
            cap.mark(ctx.client.public_ip)
        frames = cap.frames()
        hits = {k: leaking(frames, fragments(m, p.fragment_bytes)) for k, m in streams.items()}
        plain = leaking(frames, [f for m in streams.values() for f in fragments(m, p.fragment_bytes)])
        evidence = [
            {
                "protocol": pr,
                "size": n,
                "marker": m.hex(),
                "sent": p.count,
                "delivered": delivered[pr, n],
                "plaintext_frames": hits[pr, n],
            }
            for (pr, n), m in streams.items()
        ]
        record: dict[str, Any] = {
            "capture_at": p.capture_at,
            "host": at.name,
            "streams": evidence,
            "capture": cap.stats,
        }
        carried_pct = 0.0
        if p.capture_at == "relay":
            legs = relay_legs(
                frames,
                cap.linktype,
                ctx.client.public_ip,
                ctx.server.public_ip,
                min(p.sizes) + IP_UDP_HEADERS,
                cap.sentinel,
            )
            marker_bytes = p.count * sum(n for _, n in streams)
            carried_pct = 100.0 * min(legs) / marker_bytes
            record["relay"] = {
                "from_client_bytes": legs[0],
                "to_server_bytes": legs[1],
                "marker_bytes": marker_bytes,
                "min_ip_bytes": min(p.sizes) + IP_UDP_HEADERS,
                "verdict": relay_verdict(plain, carried_pct),
            }
        (ctx.artifact_dir / "leak.json").write_text(json.dumps(record, indent=1))
        out = Outcome(artifacts=[cap.local, ctx.artifact_dir / "leak.json"])
        out.measure_s = time.monotonic() - t0
        sent, got = p.count * len(streams), sum(delivered.values())
        if got < sent:
            short = ", ".join(f"{pr}/{n}: {d}" for (pr, n), d in delivered.items() if d < p.count)
            raise WorkloadError(
                f"inconclusive: {got} of {sent} markers arrived over the tunnel ({short} of "
                f"{p.count}); {plain} captured frames held plaintext"
            )
        # a capture that missed frames proves a leak it saw, but not the absence of one
        why = cap.incomplete()
        if not plain and why:
            raise WorkloadError(f"inconclusive: the capture on {at.name} {why}")
        if p.capture_at == "relay":
            out.add("relay_verdict", relay_verdict(plain, carried_pct))
            out.add("relay_plaintext_frames", plain)
            out.add("relay_carried_pct", carried_pct)
            out.add("relay_frames_captured", len(frames))
            return out
        out.add("leak_pass", 0 if plain else 1)
        out.add("leak_plaintext_frames", plain)
        for pr in p.protocols:
            out.add(f"leak_plaintext_frames_{pr}", sum(h for (q, _), h in hits.items() if q == pr))
        out.add("leak_markers_delivered_pct", 100.0 * got / sent)
        out.add("leak_frames_captured", len(frames))
        return out

    def _send(
        self, ctx: CaseContext, p: LeakParams, streams: dict[tuple[str, int], bytes]
    ) -> dict[tuple[str, int], int]:
        """Send every stream; returns {(protocol, size): messages the server received intact}."""
        delivered = dict.fromkeys(streams, 0)
        specs = [f"{pr}:{n}:{m.hex()}" for (pr, n), m in streams.items() if pr != "icmp"]
        if specs:
            srv = ctx.server.spawn([*peer_argv(ctx.server), "recv", "--bind", ctx.server_ip, "--port", str(PORT),
                                    "--count", str(p.count), "--total-s", f"{ctx.remaining():.0f}", *specs],
                                   label="leak-recv", log_path=ctx.artifact_dir / "leak-recv.log")  # fmt: skip
            try:
                wait_log(srv, "ready", 30, "leak_peer receiver")  # Python start-up, not a measurement
                ctx.client.run([*peer_argv(ctx.client), "send", "--to", ctx.server_ip, "--port", str(PORT),
                                "--count", str(p.count), *specs], timeout=ctx.remaining())  # fmt: skip
                srv.wait(1.0)  # it exits by itself once every message arrived; stragglers get a second
            finally:
                srv.stop(grace=2)
            last = [ln for ln in srv.log_tail(4000).splitlines() if ln.startswith("{")]
            if not last:
                raise WorkloadError(f"leak_peer receiver reported nothing: {srv.log_tail(400)}")
            for key, n in json.loads(last[-1]).items():
                pr, size = key.split(":")
                delivered[pr, int(size)] = n
        for (pr, n), m in streams.items():
            if pr == "icmp":
                r = ctx.client.run(["ping", "-n", "-q", "-c", str(p.count), "-i", "0.01", "-W", "1", "-s", str(n),
                                    "-p", m.hex(), ctx.server_ip], timeout=ctx.remaining(), check=False)  # fmt: skip
                delivered[pr, n] = min(p.count, parse_ping(r.stdout)["received"])
        return delivered
