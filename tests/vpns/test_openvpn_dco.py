"""OpenVPN's two data paths (issue 46): `openvpn` (userspace, --disable-dco) and `openvpn-dco` (the kernel's
ovpn-dco module). Without a lab: what each asks OpenVPN for (checked against `openvpn --help`), how the data path
in use is read back (real `ip -d -j link` and OpenVPN log lines), and that a kernel without the module refuses
openvpn-dco with the module named, in `list`/`doctor` too. In the kernel lane (the module built for its kernel by
scripts/kernel-lane): a DCO tunnel and a userspace one in the same VM, where the kernel's counters and the
openvpn processes' own I/O say which carries the bytes, and the DCO/userspace TCP ratio (printed, not asserted:
the VM is emulated)."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import pytest
from test_driver_configs_more import FolderHost, opts

from tunnelbench.catalog import DRIVERS, resolve
from tunnelbench.doctor import vpn_and_workload_checks
from tunnelbench.lab import kernel
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh
from tunnelbench.vpns.openvpn import data_path_problem, device_kinds

# `ip -d -j link show` as iproute2 6.1 prints it: a userspace tunnel (this machine, `ip tuntap add t0 mode tun`)
# and an ovpn-dco device made by OpenVPN 2.6.14 in the kernel lane's VM (Debian 6.1, ovpn-dco-v2 0.0+git20231103)
IP_JSON = (
    '[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"qdisc":"noqueue",'
    '"operstate":"UNKNOWN","link_type":"loopback"},'
    '{"ifindex":2,"ifname":"t0","flags":["POINTOPOINT","MULTICAST","NOARP"],"mtu":1500,"qdisc":"noop",'
    '"operstate":"DOWN","link_type":"none","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","pi":false,'
    '"vnet_hdr":false,"multi_queue":false,"persist":true}}},'
    '{"ifindex":3,"ifname":"dcoa","flags":["POINTOPOINT","MULTICAST","NOARP","UP","LOWER_UP"],"mtu":1500,'
    '"qdisc":"pfifo_fast","operstate":"UNKNOWN","link_type":"none","linkinfo":{"info_kind":"ovpn-dco"}}]'
)
# OpenVPN 2.6.14's own lines (its log in the lane's VM; the "Note" is README.dco.md's, for a kernel without it)
DCO_LOG = """2026-11-28 18:03:47 DCO version: 0.0+git20231103
2026-11-28 18:03:48 net_iface_new: add dcoa type ovpn-dco
2026-11-28 18:03:48 DCO device dcoa opened
2026-11-28 18:03:48 net_iface_mtu_set: mtu 1500 for dcoa
"""
NO_MODULE_LOG = """2026-11-28 18:03:47 DCO version: N/A
2026-11-28 18:03:47 Note: Kernel support for ovpn-dco missing, disabling data channel offload.
2026-11-28 18:03:48 TUN/TAP device dcoa opened
"""
TUN_LOG = "2026-11-28 18:03:48 TUN/TAP device t0 opened\n"


def test_device_kinds_are_the_kernels_linkinfo():
    assert device_kinds(IP_JSON) == {"lo": "", "t0": "tun", "dcoa": "ovpn-dco"}


def test_a_tunnel_is_on_the_path_asked_for_only_when_kernel_and_openvpn_both_say_so():
    assert data_path_problem("dcoa", "ovpn-dco", DCO_LOG, dco=True) is None
    assert data_path_problem("t0", "tun", TUN_LOG, dco=False) is None
    # OpenVPN fell back to userspace: the device is a tun, and OpenVPN's reason is quoted
    why = data_path_problem("dcoa", "tun", NO_MODULE_LOG, dco=True)
    assert why is not None and why.startswith("dcoa is a tun device, not ovpn-dco")
    assert "Kernel support for ovpn-dco missing" in why
    # the kernel's word alone, or OpenVPN's alone, is not enough; nor a DCO device where userspace was asked
    assert data_path_problem("dcoa", "ovpn-dco", TUN_LOG, dco=True) is not None
    assert data_path_problem("dcoa", "tun", DCO_LOG, dco=True) is not None
    assert data_path_problem("dcoa", "ovpn-dco", DCO_LOG, dco=False) is not None
    assert "missing device" in (data_path_problem("gone", "", "", dco=True) or "")


@pytest.mark.parametrize("topology", ["mesh", "star"])
def test_only_openvpn_dco_leaves_openvpn_its_dco(tmp_path, topology):
    """The userspace driver asks for --disable-dco on every tunnel, openvpn-dco never does (OpenVPN 2.6 then
    uses the module where it is loaded); both command lines hold only options `openvpn --help` lists."""
    help_text = subprocess.run(["openvpn", "--help"], capture_output=True, text=True).stdout
    assert "\n--disable-dco " in help_text or "\n--disable-dco\n" in help_text
    for name, disabled in (("openvpn", True), ("openvpn-dco", False)):
        hosts = [FolderHost(i, tmp_path / name / topology) for i in (1, 2, 3)]
        spec = MeshSpec(hosts=hosts, tag="tbdc00", workdir=tmp_path, topology=topology, hub=hosts[0])
        d = DRIVERS[name](spec)
        d.configure()
        lines = (
            [d._star_argv(h) for h in hosts]
            if topology == "star"
            else [d._argv(h, p, k, h is s) for k, (s, c) in enumerate(d.pairs) for h, p in ((s, c), (c, s))]
        )
        for argv in lines:
            o = opts(argv)
            assert ("--disable-dco" in o) is disabled, (name, argv)
            unknown = [x for x in o if f"\n{x} " not in help_text and f"\n{x}\n" not in help_text]
            assert not unknown, f"options openvpn --help does not list: {unknown}"
        assert d.settings["dco"] is not disabled


def _kernel_without_dco(monkeypatch) -> str:
    """This process's kernel probe answers as a kernel without the module does (`ip link add o0 type ovpn-dco`
    on this machine's 6.18: the kernel's own words) and has every other feature."""
    why = "Error: Unknown device type."
    monkeypatch.setitem(
        kernel._CACHE, "local", {f: why if f == "ovpn-dco" else None for f in kernel.FEATURES}
    )
    return why


def test_without_the_module_openvpn_dco_is_impossible_here_and_says_why(monkeypatch):
    why = _kernel_without_dco(monkeypatch)
    user, dco = DRIVERS["openvpn"].availability(), DRIVERS["openvpn-dco"].availability()
    assert user.ok, user
    assert dco.state == "impossible here"
    assert dco.reason == (
        f"this kernel ({platform.release()}) has no OpenVPN data-channel offload (module ovpn_dco_v2): {why}"
    )
    assert resolve("openvpn-dco@debian").availability().reason == dco.reason
    rows = {c.name: c for c in vpn_and_workload_checks() if c.group == "vpns"}  # `list` and `doctor`
    assert (
        rows["openvpn-dco"].state == "impossible here"
        and "(module ovpn_dco_v2)" in rows["openvpn-dco"].detail
    )
    assert rows["openvpn"].ok


def test_the_version_says_openvpns_build_and_the_modules():
    label = DRIVERS["openvpn-dco"].version_label("2.6.14 + ovpn-dco 0.0+git20231103")
    pkg = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "openvpn"], capture_output=True, text=True)
    assert label == f"2.6.14 (debian {pkg.stdout}) + ovpn-dco 0.0+git20231103"


# -- the kernel lane ---------------------------------------------------------------------------------------------
MTU = 1400  # one tunnel MTU for both, as a scenario's fairness.tunnel_mtu sets (the underlay's is 1500)
SECONDS = 3  # per data path: the VM is emulated (TCG), a ratio is all it can give


def _io_bytes(pid: int) -> int:
    """What the process moved through read/write calls (a tun's packets; not its UDP socket's sendmsg/recvmsg)."""
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(io["rchar"]) + int(io["wchar"])


def _rx_bytes(host, dev: str) -> int:
    (link,) = json.loads(host.run(["ip", "-s", "-j", "link", "show", "dev", dev]).stdout)
    return int(link["stats64"]["rx"]["bytes"])


def _tcp(lab, vpn: str) -> tuple[float, dict[str, float]]:
    """A mesh of `vpn` on the lab's two hosts; h1 sends to h2 over TCP (iperf3) for SECONDS. Returns the rate
    iperf3 measured and the byte counts: received by iperf3, the tunnel device's rx on h2 (the kernel's
    counter; ovpn-dco's own for a DCO device), and the openvpn processes' read/write bytes."""
    cls = DRIVERS[vpn]
    driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir, mtu=MTU))
    driver.configure()
    mesh = Mesh(driver)
    h1, h2 = lab.hosts
    server = None
    try:
        mesh.start()
        mesh.wait_ready(timeout=60)
        dev = driver.peer_ifname(h2, h1)
        (link,) = json.loads(h2.run(["ip", "-d", "-j", "link", "show", "dev", dev]).stdout)
        assert link["linkinfo"]["info_kind"] == ("ovpn-dco" if cls.dco else "tun"), link
        assert driver.settings["data_path"]["in_use"] == (
            "kernel (ovpn-dco)" if cls.dco else "userspace (tun)"
        )
        server = h2.spawn(
            ["iperf3", "-s", "-1", "-B", mesh.tunnel_ip(h2)],
            label="iperf3",
            log_path=lab.run_dir / f"{vpn}.log",
        )
        end = time.monotonic() + 20
        while "5201" not in h2.run(["ss", "-Htln", "sport", "= :5201"]).stdout and time.monotonic() < end:
            time.sleep(0.1)
        pids = [p.pid for h in lab.hosts for p in driver.procs[h.name]]
        io0, rx0 = {p: _io_bytes(p) for p in pids}, _rx_bytes(h2, dev)
        r = h1.run(["iperf3", "-c", mesh.tunnel_ip(h2), "-t", str(SECONDS), "-J"], timeout=120)
        got = json.loads(r.stdout)["end"]["sum_received"]
        counts = {
            "received": float(got["bytes"]),
            "device_rx": float(_rx_bytes(h2, dev) - rx0),
            "openvpn_io": float(sum(_io_bytes(p) - io0[p] for p in pids)),
        }
        return float(got["bits_per_second"]) / 1e6, counts
    finally:
        if server is not None:
            server.stop()
        mesh.stop()
        assert mesh.leftovers() == []


@pytest.mark.lab
@pytest.mark.kernel
def test_dco_carries_the_bytes_in_the_kernel_and_its_tcp_ratio_to_userspace(lab_factory, capsys):
    """The same two hosts, one OpenVPN tunnel each way of running it. DCO: the ovpn-dco device's receive
    counter grows by what iperf3 received plus the TCP/IP headers, and the openvpn processes read and write
    almost nothing (<1%): the kernel carries the bytes. Userspace: openvpn reads every packet from one tun
    and writes it to the other (>= 2x the bytes). Then the DCO/userspace TCP ratio, printed."""
    a = DRIVERS["openvpn-dco"].availability()
    if not a.ok:
        pytest.skip(f"openvpn-dco: {a.reason}")
    lab = lab_factory(2)
    dco_mbps, dco = _tcp(lab, "openvpn-dco")
    user_mbps, user = _tcp(lab, "openvpn")
    # each segment carries 52 bytes of TCP/IP headers (timestamps on) with at most MTU - 52 of data (~4%), and
    # the emulated VM's retransmissions are counted by the device, not by iperf3
    assert dco["received"] > 0 and 1.0 <= dco["device_rx"] / dco["received"] <= 1.25, dco
    assert dco["openvpn_io"] < 0.01 * dco["received"], dco
    assert user["openvpn_io"] >= 2 * user["received"], user
    with capsys.disabled():
        print(
            f"\nopenvpn-dco {a.version}: kernel data path (ovpn-dco device; its rx +{dco['device_rx']:.0f} B for "
            f"{dco['received']:.0f} B iperf3 received; openvpn read/wrote {dco['openvpn_io']:.0f} B); userspace "
            f"openvpn read/wrote {user['openvpn_io']:.0f} B for {user['received']:.0f} B. TCP h1->h2, {SECONDS} s, "
            f"MTU {MTU}: DCO {dco_mbps:.1f} Mbit/s, userspace {user_mbps:.1f} Mbit/s, "
            f"DCO/userspace {dco_mbps / user_mbps:.2f} (emulated VM: the ratio only)"
        )
