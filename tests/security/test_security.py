"""The plaintext leak check (issue 14 item 1): unencrypted paths are caught, encrypted VPNs pass, a tunnel that
delivers nothing is inconclusive, and the pcap reader / fragment search count exactly. Relay blindness (item 2):
a relay that carries only ciphertext is "metadata only", a relay that forwards the plaintext is caught, and
traffic that goes around the relay is "nothing crossed", never a pass."""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

import pytest

from tunnelbench.catalog import DRIVERS, WORKLOADS
from tunnelbench.instruments.leak_peer import payload
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.workloads.base import CaseContext, WorkloadError
from tunnelbench.workloads.leak import (
    CARRIED_PCT,
    METADATA_ONLY,
    NOTHING_CROSSED,
    PLAINTEXT,
    fragments,
    ip_header,
    leaking,
    new_marker,
    pcap_frames,
    pcap_linktype,
    relay_legs,
    relay_verdict,
)

pytestmark = [pytest.mark.lab]


def _mesh_up(lab_factory, vpn: str, hosts: int, path: str = "direct", settle: bool = False):
    """A lab of `hosts` with `vpn`'s mesh up on `path`; stopped (and checked clean) afterwards."""
    avail = DRIVERS[vpn].availability()
    if not avail.ok:
        pytest.skip(f"{vpn}: {avail.reason}")
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump missing (scripts/setup.sh installs it)")
    lab = lab_factory(hosts, path=path)
    relay = lab.relay if path == "relay" else None
    spec = MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, path=path, relay=relay)
    driver = DRIVERS[vpn](spec)
    driver.configure()
    mesh = Mesh(driver)
    try:
        mesh.start()
        mesh.wait_ready(timeout=60)
        if settle:
            driver.warm_up()
        yield lab, mesh
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


@pytest.fixture
def lab_mesh(lab_factory, request):
    """A 2-host lab with `request.param`'s mesh up."""
    yield from _mesh_up(lab_factory, request.param, 2)


def run_leak(lab, mesh, **params) -> tuple[dict[str, float], float]:
    wl = WORKLOADS["leak"](WORKLOADS["leak"].Params(**params))
    adir = lab.run_dir / "cases" / f"leak-{time.monotonic_ns()}"
    adir.mkdir(parents=True)
    ctx = CaseContext(mesh, lab.hosts[0], lab.hosts[1], adir, time.monotonic() + 60, lab=lab)
    t0 = time.monotonic()
    out = wl.run(ctx)
    took = time.monotonic() - t0
    pcap = adir / ("relay.pcap" if params.get("capture_at") == "relay" else "underlay.pcap")
    assert pcap in out.artifacts and pcap.stat().st_size > 24
    m = {s.name: s.value for s in out.samples}
    assert set(m) <= {s.name for s in wl.metrics}
    print(f"\n{mesh.vpn}: {m} in {took:.1f} s")
    return m, took


@pytest.mark.parametrize("lab_mesh", ["internal", "vxlan"], indirect=True)
def test_unencrypted_paths_are_caught(lab_mesh):
    """Positive controls: no VPN and an unencrypted overlay carry the markers in the clear."""
    m, took = run_leak(*lab_mesh)
    assert m["leak_pass"] == 0
    assert m["leak_markers_delivered_pct"] == 100
    for proto in ("tcp", "udp", "icmp"):
        assert m[f"leak_plaintext_frames_{proto}"] > 0, proto
    assert m["leak_plaintext_frames"] <= m["leak_frames_captured"]
    assert took < 15


@pytest.mark.parametrize("lab_mesh", ["wireguard-go", "nebula", "yggdrasil"], indirect=True)
def test_encrypted_vpns_pass(lab_mesh):
    """yggdrasil: an IPv6-only tunnel (200::/7), so leak_peer's sockets must follow the address family."""
    m, took = run_leak(*lab_mesh)
    assert m["leak_pass"] == 1
    assert m["leak_plaintext_frames"] == 0
    assert m["leak_markers_delivered_pct"] == 100
    assert m["leak_frames_captured"] > 0
    assert took < 15


@pytest.mark.parametrize("lab_mesh", ["wireguard-go"], indirect=True)
def test_tunnel_delivering_nothing_is_inconclusive(lab_mesh):
    """With UDP between the peers dropped at the router, nothing arrives: an error, never a pass."""
    lab, mesh = lab_mesh
    lab.block_udp_between_peers()
    try:
        with pytest.raises(WorkloadError, match=r"inconclusive: 0 of 6 markers arrived"):
            run_leak(lab, mesh, sizes=[64], count=2)
    finally:
        lab.unblock()


def test_no_router_is_refused(tmp_path: Path):
    wl = WORKLOADS["leak"](WORKLOADS["leak"].Params())
    for lab in (None, type("Lab", (), {"router": None})()):
        ctx = CaseContext(None, None, None, tmp_path, time.monotonic() + 5, lab=lab)  # type: ignore[arg-type]
        with pytest.raises(WorkloadError, match="router"):
            wl.run(ctx)


def pcap(frames: list[bytes], order: str, linktype: int = 113) -> bytes:
    """A classic pcap (LINUX_SLL unless told) in the given byte order ("<" or ">")."""
    out = struct.pack(order + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype)
    for i, fr in enumerate(frames):
        out += struct.pack(order + "IIII", 1700000000 + i, 0, len(fr), len(fr)) + fr
    return out


@pytest.mark.parametrize("order", ["<", ">"])
def test_pcap_reader_and_fragment_search(order):
    noise = bytes(range(256))
    marker = new_marker()
    # the "no hit" frames put marker[1:13] and marker[22:32] right after noise, which ends ...fe ff: a marker
    # starting ff (1 in 256) or with fe ff at 20 would complete a fragment there and hit by chance
    while marker[0] == noise[-1] or marker[20:22] == noise[-2:]:
        marker = new_marker()
    assert all(a != b for a, b in zip(marker, marker[1:], strict=False))
    frags = fragments(marker, 12)
    assert frags == [marker, marker[0:12], marker[12:24], marker[20:32]]
    frames = [
        b"\x00" * 16 + payload(marker, 100),  # a whole message
        noise + marker[12:24] + noise,  # one middle fragment, nothing else
        noise + marker[22:32] + noise,  # 10 bytes: shorter than a fragment, no hit
        noise + marker[1:13] + noise,  # a 12-byte window off the fixed offsets: no hit
        noise,
        noise + marker[20:32],  # the tail window, at the frame's very end
    ]
    data = pcap(frames, order)
    got = pcap_frames(data)
    assert got == frames
    assert leaking(got, frags) == 3
    assert leaking(got, fragments(new_marker(), 12)) == 0
    assert pcap_frames(data[:-5])[-1] == frames[-1][:-5]  # a cut-off last record (capture stopped)
    with pytest.raises(WorkloadError):
        pcap_frames(b"\x0a\x0d\x0d\x0a" + bytes(40))  # pcapng is not read


# -- relay blindness (item 2) ----------------------------------------------------------------------------------
@pytest.fixture
def relay_mesh(lab_factory, request):
    """A 3-host lab with path "relay" (UDP between h1 and h2 dropped at the router, h3 the relay host) and
    `request.param`'s mesh up on it, settled (a relay path takes its first seconds to form)."""
    yield from _mesh_up(lab_factory, request.param, 3, path="relay", settle=True)


@pytest.mark.parametrize("relay_mesh", ["nebula", "n2n"], indirect=True)
def test_relay_carrying_ciphertext_is_metadata_only(relay_mesh):
    m, took = run_leak(*relay_mesh, capture_at="relay")
    assert m["relay_verdict"] == METADATA_ONLY
    assert m["relay_plaintext_frames"] == 0
    assert m["relay_carried_pct"] >= 100  # every marker byte (plus the VPN's overhead) crossed h3
    assert m["relay_frames_captured"] > 0
    assert not any(k.startswith("leak_") for k in m)  # leak_* is the router check only
    assert took < 15


def hairpin_through_relay(lab) -> None:
    """A plaintext relay (the positive control): the router hands h1 <-> h2 traffic to h3, which routes it back
    (plain IP forwarding), so every marker crosses h3's interface in the clear. None of the relay VPNs here
    forwards decrypted traffic on its relay's tun device (each is "metadata only"), so the control is built."""
    r, relay = lab.router, lab.relay
    lab.unblock()  # the path table would drop the UDP markers on both passes through the router
    relay.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    relay.run(["sysctl", "-qw", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0"])
    r.run(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", f"net.ipv4.conf.{relay.name}.rp_filter=0"])
    r.run(["ip", "route", "add", "default", "via", relay.underlay_ip, "table", "100"])
    h1, h2 = lab.hosts[0], lab.hosts[1]
    for iif, dst in ((h1.name, h2.underlay_ip), (h2.name, h1.underlay_ip)):  # back from h3: the main table
        r.run(["ip", "rule", "add", "iif", iif, "to", dst, "lookup", "100"])


@pytest.mark.parametrize("relay_mesh", ["internal"], indirect=True)
def test_relay_forwarding_plaintext_is_caught(relay_mesh):
    lab, mesh = relay_mesh
    hairpin_through_relay(lab)
    m, _ = run_leak(lab, mesh, capture_at="relay")
    assert m["relay_verdict"] == PLAINTEXT
    assert m["relay_plaintext_frames"] > 0
    assert m["relay_carried_pct"] >= 100


@pytest.mark.parametrize("relay_mesh", ["internal"], indirect=True)
def test_traffic_around_the_relay_is_nothing_crossed(relay_mesh):
    """UDP unblocked, no VPN: the markers go h1 -> router -> h2 and the relay host sees only its sentinel."""
    lab, mesh = relay_mesh
    lab.unblock()
    m, _ = run_leak(lab, mesh, capture_at="relay")
    assert m["relay_verdict"] == NOTHING_CROSSED
    assert m["relay_plaintext_frames"] == 0
    assert m["relay_carried_pct"] < CARRIED_PCT


def test_relay_capture_needs_a_relay_host(tmp_path: Path):
    wl = WORKLOADS["leak"](WORKLOADS["leak"].Params(capture_at="relay"))
    assert wl.label() == "leak-relay" and wl.headline[0] == "relay_verdict"
    h1, h2, h3 = (type("H", (), {"name": n})() for n in ("h1", "h2", "h3"))
    for relay in (None, h2):
        lab = type("Lab", (), {"router": object(), "relay": relay})()
        ctx = CaseContext(None, h1, h2, tmp_path, time.monotonic() + 5, lab=lab)  # type: ignore[arg-type]
        with pytest.raises(WorkloadError, match=r'\[lab\] path = "relay"' if relay is None else "the server"):
            wl.run(ctx)


def sll2(payload: bytes, ethertype: int = 0x0800) -> bytes:
    """A LINUX_SLL2 frame (tcpdump -i any): protocol, reserved, ifindex, ARPHRD, packet type, address."""
    return struct.pack(">HHiHBB8s", ethertype, 0, 2, 1, 0, 6, b"") + payload


def ipv4(src: str, dst: str, body: bytes) -> bytes:
    s, d = (bytes(int(x) for x in a.split(".")) for a in (src, dst))
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 0, 0, 64, 17, 0, s, d) + body


def test_relay_legs_and_verdict():
    c, r, s = "10.100.1.2", "10.100.3.2", "10.100.2.2"
    sentinel = new_marker(16)
    frames = [
        sll2(ipv4(c, r, bytes(1000))),  # client -> relay, carried
        sll2(ipv4(r, s, bytes(1000))),  # relay -> server, carried
        sll2(ipv4(c, r, bytes(40))),  # 60-byte packet: an ACK or keepalive, below the smallest message
        sll2(ipv4(c, r, sentinel * 8)),  # the sentinel's echo reply: the capture's own, not carried
        sll2(ipv4(s, r, bytes(500))),  # the server's leg back: not client -> server
        sll2(bytes(28), 0x0806),  # ARP
        sll2(struct.pack(">IHBB16s16s", 0x60000000, 100, 17, 64, bytes(16), bytes(16)) + bytes(100), 0x86DD),
    ]
    data = pcap(frames, "<", 276)
    assert pcap_linktype(data) == 276 and pcap_frames(data) == frames
    assert ip_header(frames[0], 276) == (c, r, 1020)
    assert ip_header(frames[-1], 276) == ("::", "::", 140)
    assert ip_header(frames[5], 276) is None
    assert ip_header(bytes(16) + ipv4(c, s, b"x"), 113) is None  # EtherType 0: not IP
    sll1 = bytes(14) + b"\x08\x00" + ipv4(c, s, bytes(72))
    assert ip_header(sll1, 113) == (c, s, 92)
    assert relay_legs(frames, 276, c, s, 92, sentinel) == (1020, 1020)
    assert relay_legs(frames, 276, c, s, 2000, sentinel) == (0, 0)
    assert relay_verdict(3, 0) == relay_verdict(3, 200) == PLAINTEXT
    assert relay_verdict(0, CARRIED_PCT) == relay_verdict(0, 160) == METADATA_ONLY
    assert relay_verdict(0, CARRIED_PCT - 0.1) == relay_verdict(0, 0) == NOTHING_CROSSED


def test_builtin_security_scenarios():
    """`tunnelbench run security-leak` / `security-relay` (two parts of the `security` suite): the leak check with its positive controls on the direct
    path; the relay check for exactly the VPNs of the relay scenario."""
    from tunnelbench.scenario import load_scenario

    default, _ = load_scenario("default")
    relay, _ = load_scenario("relay")
    sec, _ = load_scenario("security-leak")
    assert set(sec.vpns) == {*default.vpns, "vxlan"} and "internal" in sec.vpns
    assert sec.lab.path == "direct" and sec.lab.hosts == 3 and sec.run.repetitions == 1
    (wl,) = sec.build_workloads()
    assert wl.label() == "leak" and wl.params == WORKLOADS["leak"].Params()
    rel, _ = load_scenario("security-relay")
    assert rel.vpns == relay.vpns and rel.lab.path == "relay" and rel.lab.hosts == 3
    assert all("relay" in DRIVERS[v].paths for v in rel.vpns)
    (wl,) = rel.build_workloads()
    assert wl.label() == "leak-relay" and wl.params == WORKLOADS["leak"].Params(capture_at="relay")


# -- off-lab traffic per VPN (item 6) ---------------------------------------------------------------------------
OFFLAB = """
name = "offlab"
vpns = ["internal", "vxlan"]
[run]
repetitions = 2
seed = 3
drift_check_s = 0
[lab]
hosts = 2
[[workloads]]
name = "ping"
count = 5
interval_s = 0.01
"""


def test_offlab_drops_are_counted_per_vpn(tmp_path: Path, monkeypatch):
    """A real run (2 interleaved rounds) where only `internal` sends packets off the lab: 2 per host at each
    bring-up, to TEST-NET-1, which the router drops, and 3 per host unencapsulated to a tunnel address (the
    tunnel_leak counter's positive control: a VPN that sent before its tunnel was up). Its shares are exactly
    those, summed over both sessions."""
    import io
    import json
    import tomllib

    from conftest import lab_missing
    from rich.console import Console

    from tunnelbench.report.reading import read
    from tunnelbench.report.terminal import print_summary
    from tunnelbench.runner.loop import Runner
    from tunnelbench.scenario import parse_scenario
    from tunnelbench.store import DB_NAME, Store

    if lab_missing():
        pytest.skip(lab_missing())
    if not DRIVERS["vxlan"].availability().ok:
        pytest.skip(f"vxlan: {DRIVERS['vxlan'].availability().reason}")
    internal = DRIVERS["internal"]

    def probing_start(self, host) -> None:
        host.run(["ping", "-n", "-q", "-c", "2", "-i", "0.01", "-W", "0.1", "192.0.2.1"], check=False)
        # SSDP's multicast group (UPnP discovery, as tailscaled's port mapper sends it): local, not off-lab
        host.run(["ping", "-n", "-q", "-c", "2", "-i", "0.01", "-W", "0.1", "239.255.255.250"], check=False)
        # a tunnel range address (100.64.0.0/10) no VPN of the run routes: out the underlay, in the clear
        host.run(["ping", "-n", "-q", "-c", "3", "-i", "0.01", "-W", "0.1", "100.127.255.254"], check=False)

    monkeypatch.setattr(internal, "start", probing_start)
    sc = parse_scenario(tomllib.loads(OFFLAB), "offlab test")
    runner = Runner(sc, OFFLAB, Console(file=io.StringIO()), tmp_path)
    assert runner.run().status == "ok"
    store = Store(runner.run_dir / DB_NAME)
    env = store.env(runner.run_id)
    assert int(env["offlab_drops.internal"]) == 2 * 2 * 2  # rounds x hosts x pings
    # and where they went: the router's per-destination set, summed over both sessions
    assert json.loads(env["offlab_dests.internal"]) == {"192.0.2.1": 8} and "offlab_dests.vxlan" not in env
    # the leak counter counts what it should, and only that: 3 per host and session, none of vxlan's
    assert int(env["tunnel_leak_drops.internal"]) == 2 * 2 * 3 and int(env["tunnel_leak_drops.vxlan"]) == 0
    for key in ("offlab_drops", "tunnel_leak_drops"):
        shares = [int(env[f"{key}.{vpn}"]) for vpn in ("internal", "vxlan")]
        assert sum(shares) == int(env[f"router.{key}"]), (key, shares)
    console = Console(record=True, width=300, file=io.StringIO())
    rd = read([(runner.run_dir, runner.run_id)])
    print_summary(rd, console)
    rd.close()
    out = console.export_text()
    assert f"router dropped {env['router.offlab_drops']} packet(s)" in out
    assert "per VPN: internal 8" in out
