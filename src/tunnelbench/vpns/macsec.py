"""MACsec (IEEE 802.1AE) in the kernel with static keys: GCM-AES-128, every frame encrypted and
integrity-protected, replay protection on. MACsec protects one Ethernet segment; the namespace lab's
underlay is routed (each host has its own link to the router), so each pair's MACsec runs over a GREtap
carrier (the `gretap` driver's device) that gives the two hosts a private Ethernet segment. What is measured
is therefore MACsec + GREtap (70 bytes of overhead: 32 of MACsec, 38 of the carrier), recorded in settings.

Per host: one transmit key (its secure channel, SCI = carrier MAC + port 1); per peer, a receive channel
with that peer's key. No MKA (no key agreement daemon): keys are made per run, kept in a 0600 file per
host and handed to the kernel with `ip -batch` from that file, never on a command line."""

from __future__ import annotations

import secrets

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.features import IPROUTE_MACSEC, kernel_tunnel_record
from tunnelbench.vpns.gretap import GreTap
from tunnelbench.vpns.kernel_tunnel import KernelTunnel

CIPHER = "gcm-aes-128"
MACSEC_OVERHEAD = 32  # SecTAG with SCI (16) + ICV (16)


class Macsec(KernelTunnel):
    name = "macsec"
    summary = "MACsec (802.1AE, GCM-AES-128, static keys) in the kernel, over a GREtap carrier per peer"
    # the feature record (vpns/features.py): each fact with its source
    features = kernel_tunnel_record(
        ("MACsec (IEEE 802.1AE) over a GREtap carrier per peer", IPROUTE_MACSEC),
        ("GCM-AES-128, static keys (no MKA), replay protection", IPROUTE_MACSEC),
    )
    kernel_features = ("gretap", "macsec")
    default_mtu = GreTap.default_mtu - MACSEC_OVERHEAD  # 1430: the carrier's own default, 1462
    l2 = True
    wire = GreTap.wire
    encrypted = True

    def __init__(self, spec: MeshSpec) -> None:
        super().__init__(spec)
        self.carrier = GreTap(spec)
        self.settings = {
            "mode": "MACsec per peer over a GREtap carrier (routed underlay)",
            "cipher": CIPHER,
            "keys": "static, one transmit key per host",
            "replay_protect": True,
            "encapsulation": "MACsec in GREtap (ip protocol gre)",
            "mtu": self.mtu,
        }
        self.keys: dict[str, str] = {}

    def carrier_name(self, host: Host, peer: Host) -> str:
        return f"{self.spec.tag}c{self.index(peer)}"

    def configure(self) -> None:
        self.keys = {h.name: secrets.token_hex(16) for h in self.spec.hosts}

    def start(self, host: Host) -> None:
        assert self.mtu is not None  # default_mtu is set
        lines = []
        for peer in self.peers(host):
            carrier, dev = self.carrier_name(host, peer), self.link_name(host, peer)
            host.run(
                ["ip", "link", "add", carrier, "address", self.mac(host), *self.carrier.link_args(host, peer)]
            )
            # the carrier is sized for the MACsec device on it, whatever tunnel MTU the scenario asks for
            host.run(["ip", "link", "set", carrier, "mtu", str(self.mtu + MACSEC_OVERHEAD), "up"])
            host.run(
                [
                    "ip",
                    "link",
                    "add",
                    "link",
                    carrier,
                    dev,
                    "type",
                    "macsec",
                    "port",
                    "1",
                    "cipher",
                    CIPHER,
                    "encrypt",
                    "on",
                    "replay",
                    "on",
                    "window",
                    "128",
                ]
            )
            lines += [
                f"macsec add {dev} tx sa 0 pn 1 on key 01 {self.keys[host.name]}",
                f"macsec add {dev} rx port 1 address {self.mac(peer)}",
                f"macsec add {dev} rx port 1 address {self.mac(peer)} sa 0 pn 1 on key 02 "
                f"{self.keys[peer.name]}",
            ]
        keyfile = self.host_dir(host) / "macsec-keys.batch"
        host.write_file(keyfile, "\n".join(lines) + "\n", 0o600)
        host.run(["ip", "-batch", str(keyfile)])
        for peer in self.peers(host):
            self.address(host, peer, self.link_name(host, peer))

    def after_stop(self, host: Host) -> None:
        super().after_stop(host)  # the MACsec devices
        for peer in self.peers(host):
            if self.link_exists(host, c := self.carrier_name(host, peer)):
                host.run(["ip", "link", "del", c], check=False)
