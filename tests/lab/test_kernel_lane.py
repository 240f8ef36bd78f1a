"""The full-kernel lane's own checks (scripts/kernel-lane): the kernel features are there, the probe's
answers agree with what the kernel does when asked directly, and the VM the lane boots has no way out."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from conftest import lab_state
from test_vpn_mesh import secret_files_by_content

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab import kernel
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh

pytestmark = [pytest.mark.lab]


def _ip(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True)


def test_probe_agrees_with_the_kernel():
    """The probe's verdict for GRE and netem is what `ip link add` / `tc qdisc add` answer when asked
    directly (here, in a namespace the test makes), on any kernel: a probe that always said yes, or no,
    fails on one of the two kernels CI runs."""
    have = kernel.features()
    ns = "tbkltest"
    assert _ip("netns", "add", ns).returncode == 0
    try:
        gre = _ip("-n", ns, "link", "add", "g0", "type", "gre", "local", "192.0.2.1", "remote", "192.0.2.2")
        assert (gre.returncode == 0) == (have["gre"] is None), (gre.stderr, have["gre"])
        _ip("-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        netem = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "v0", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
        )
        assert (netem.returncode == 0) == (have["netem"] is None), (netem.stderr, have["netem"])
    finally:
        _ip("netns", "del", ns)
    assert not [n for n in _ip("netns", "list").stdout.split() if n.startswith("tbkp")]


@pytest.mark.kernel
def test_lane_kernel_has_every_feature():
    have = kernel.features()
    assert {f: have[f] for f in kernel.LANE_FEATURES if have[f] is not None} == {}


@pytest.mark.kernel
def test_the_vm_has_no_network_but_loopback():
    """Inside the lane's VM (TB_KERNEL_LANE=1) the root namespace has no NIC and no route: whatever a VPN
    under test sends toward a public address has nowhere to go, whatever the lab's own guard does."""
    if os.environ.get("TB_KERNEL_LANE") != "1":
        pytest.skip("runs inside the lane's VM only (on a full kernel run directly, the host has its NICs)")
    links = _ip("-o", "link", "show").stdout.splitlines()
    kinds = {ln.split(":")[1].strip().split("@")[0] for ln in links}
    # the kernel's fallback tunnel devices (made when gre/ipip/vti load) are down and have no address
    assert kinds <= {"lo", *kernel.FALLBACK_LINKS}, kinds
    routes = _ip("route", "show", "table", "all").stdout.splitlines()
    assert routes and all(" dev lo " in r + " " for r in routes), routes
    r = subprocess.run(["ping", "-c1", "-W1", "9.9.9.9"], capture_output=True, text=True)
    assert r.returncode != 0 and ("unreachable" in r.stderr + r.stdout or "100% packet loss" in r.stdout)


@pytest.mark.kernel
def test_the_labs_guard_drops_offlab_traffic_on_this_kernel_too(lab_factory):
    """The router namespace's guard (drop and count what is not addressed to the lab) on the lane's kernel:
    with kernel tunnels loaded, a host's packets toward a non-lab address still never leave."""
    lab = lab_factory(2)
    before = lab.offlab_drops()
    lab.hosts[0].run(["ping", "-c2", "-i0.05", "-W1", "192.0.2.1"], check=False)
    assert lab.offlab_drops() >= before + 2


KERNEL_DRIVERS = sorted(n for n, d in DRIVERS.items() if set(d.kernel_features) & set(kernel.LANE_FEATURES))
# IPsec under another encapsulation, each ~50 s of the lane under TCG: what they add over their parts (the
# inner tunnel's own mesh test, gre-ipsec's cleartext test, ipsec-vti's routed SAs) runs in the long lane
# (scripts/test --long), which keeps the default kernel lane inside CI's share. gue too (37 s): the fou
# module's other encapsulation, on the same receive port setup fou's mesh test covers. gre-ipsec (56 s) and
# ipsec-transport (39 s): test_ipsec_never_sends_cleartext brings each up, pings across it (ESP only on the
# wire) and checks its leftovers; their key files are the strongSwan code ipsec-tunnel's mesh test checks.
# gretap, ipip, geneve (~32 s each): KernelTunnel subclasses that differ from gre only in the `ip link add`
# arguments, which test_kernel_tunnel_links_one_device_per_peer_of_its_kind checks on every run. openvpn-dco
# (45 s): openvpn's code but for --disable-dco; tests/vpns/test_openvpn_dco.py brings it up on every run
LONG_KERNEL_DRIVERS = {
    "openvpn-dco",
    "gretap",
    "ipip",
    "geneve",
    "geneve-ipsec",
    "gretap-ipsec",
    "vxlan-ipsec",
    "ipsec-xfrmi",
    "gue",
    "gre-ipsec",
    "ipsec-transport",
}


MTU = 1360  # [fairness] tunnel_mtu, as tests/vpns/test_vpn_mtu.py uses for the other drivers


@contextmanager
def _count(lab, name: str, match: str) -> Iterator[Callable[[], int]]:
    """An nftables counter of `match` on the router's forward hook (before the lab's own rules), removed at
    the end (the lab is the module's: the next test counts in a table of its own)."""
    rules = f"table inet {name} {{\n chain c {{\n  type filter hook forward priority -10; policy accept;\n  {match} counter\n }}\n}}\n"
    nft = ["ip", "netns", "exec", lab.router.netns, "nft"]
    subprocess.run([*nft, "-f", "-"], input=rules, text=True, check=True)

    def packets() -> int:
        out = subprocess.run(
            [*nft, "list", "table", "inet", name], capture_output=True, text=True, check=True
        ).stdout
        return int(re.search(r"counter packets (\d+)", out).group(1))  # type: ignore[union-attr]

    try:
        yield packets
    finally:
        subprocess.run([*nft, "delete", "table", "inet", name], check=True)


@pytest.mark.kernel
@pytest.mark.parametrize(
    "vpn",
    [pytest.param(v, marks=[pytest.mark.long] if v in LONG_KERNEL_DRIVERS else []) for v in KERNEL_DRIVERS],
)
def test_kernel_driver_mesh(vpn, module_lab):
    """One bring-up per kernel driver (the lane's time is the budget), everything tests/vpns/test_vpn_mesh.py and
    tests/vpns/test_vpn_mtu.py check for the other drivers, plus what the wire shows: a 3-host mesh where every
    ordered pair answers, private keys 0600, the scenario's common tunnel MTU on the path to the peer, pings
    between two hosts crossing the router as the driver's encapsulation (its `wire` match, both directions),
    and nothing of the tunnel left after teardown: by the driver's own account, and on the hosts as the kernel
    lists them (the drivers take turns on one lab, as a run's VPNs do)."""
    cls = DRIVERS[vpn]
    lab = module_lab
    before_state = lab_state(lab)
    with _count(lab, f"{lab.tag}w{vpn.replace('-', '')}", cls.wire) as packets:
        _mesh_on(lab, cls, vpn, packets)
    assert lab_state(lab) == before_state


def _mesh_on(lab, cls, vpn: str, packets: Callable[[], int]) -> None:
    mtu = MTU if cls.default_mtu else None  # ipsec-transport has no tunnel device: the underlay's MTU
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, mtu=mtu))
    driver.configure()
    mesh = Mesh(driver)
    try:
        mesh.start()
        mesh.wait_ready(timeout=60)
        assert mesh.pairs_down() == []
        # every file the driver declares secret and every one holding key material by content (as
        # tests/vpns/test_vpn_mesh.py does for the other drivers): its real mode, group and others shut out
        declared = {f.resolve() for h in lab.hosts for f in driver.secret_files(h)}
        found = {
            f.resolve() for _, d in driver.host_dirs() for f in secret_files_by_content(d)
        }  # this driver's
        modes = {f: stat.S_IMODE(os.stat(f).st_mode) for f in sorted(declared | found)}
        open_ = {str(f): f"{m:04o}" for f, m in modes.items() if m & 0o077}
        assert open_ == {}, f"{vpn}: secret files readable by group or others: {open_}"
        h1, h2 = lab.hosts[0], lab.hosts[1]
        if mtu:
            route = h1.run(["ip", "-o", "route", "get", mesh.tunnel_ip(h2)]).stdout.split()
            # a policy-based tunnel (ipsec-tunnel) has no device of its own: its MTU is on the route
            got = (
                int(route[route.index("mtu") + 1])
                if "mtu" in route
                else int(h1.run(["cat", f"/sys/class/net/{route[route.index('dev') + 1]}/mtu"]).stdout)
            )
            assert got == MTU, f"{vpn}: path MTU {got} ({' '.join(route)}), not the scenario's {MTU}"
            assert (
                driver.settings.get("mtu", MTU) == MTU
            )  # as tests/vpns/test_vpn_mtu.py: where a driver records it
        before = packets()
        r = h1.run(["ping", "-c", "20", "-i", "0.02", "-W", "2", mesh.tunnel_ip(h2)], check=False)
        assert " 0% packet loss" in r.stdout, r.stdout
        assert packets() - before >= 40  # 20 requests + 20 replies, all encapsulated
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("vpn", "clear"), [("ipsec-transport", "ip protocol icmp"), ("gre-ipsec", "ip protocol gre")]
)
def test_ipsec_never_sends_cleartext(vpn, clear, module_lab):
    """IPsec with trap policies (vpns/ipsec.py): from charon's start through readiness and pings, the router
    never forwards the cleartext the SAs protect (ICMP between the underlay addresses, GRE), only ESP."""
    cls = DRIVERS[vpn]
    lab = module_lab
    before_state = lab_state(lab)
    with _count(lab, f"{lab.tag}c{vpn.replace('-', '')}", clear) as packets:
        _cleartext_on(lab, cls, vpn, clear, packets)
    assert lab_state(lab) == before_state


def _cleartext_on(lab, cls, vpn: str, clear: str, packets: Callable[[], int]) -> None:
    driver = cls(MeshSpec(hosts=list(lab.hosts[:2]), tag=lab.tag, workdir=lab.run_dir))
    driver.configure()
    mesh = Mesh(driver)
    try:
        mesh.start()
        mesh.wait_ready(timeout=30)
        h1, h2 = lab.hosts[:2]
        for a, b in ((h1, h2), (h2, h1)):
            r = a.run(["ping", "-c", "10", "-i", "0.02", "-W", "2", mesh.tunnel_ip(b)], check=False)
            assert " 0% packet loss" in r.stdout, r.stdout
        assert packets() == 0, f"{vpn}: cleartext ({clear}) crossed the router"
    finally:
        mesh.stop()
    assert mesh.leftovers() == []


@pytest.mark.kernel
def test_every_kernel_driver_is_available_on_a_full_kernel():
    """Where the kernel has the modules, `tunnelbench list` shows each kernel driver available with a version
    (on this machine's kernel: impossible here, with the module named)."""
    states = {n: DRIVERS[n].availability() for n in KERNEL_DRIVERS}
    assert {n: a.reason for n, a in states.items() if not a.ok} == {}
    assert all(a.version for a in states.values()), states


def test_kernel_drivers_name_the_missing_module_on_a_kernel_without_it():
    have = kernel.features()
    for n in KERNEL_DRIVERS:
        lacking = [f for f in DRIVERS[n].kernel_features if have[f] is not None]
        a = DRIVERS[n].availability()
        if lacking:
            assert (
                a.state == "impossible here" and f"(module {kernel.FEATURES[lacking[0]][1]})" in a.reason
            ), a
        else:
            assert a.ok, a
