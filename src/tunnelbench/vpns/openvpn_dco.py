"""OpenVPN 2.6 with its data-channel offload (DCO): the same tunnels as `openvpn` (vpns/openvpn.py: a full mesh
of p2p TLS tunnels, or the star's one server), with the data channel (encryption, the packets) in the kernel's
ovpn-dco module while openvpn keeps the TLS control channel and hands it the keys. This is how OpenVPN 2.6 runs
wherever the module is loaded, so it is its own VPN beside `openvpn` (which asks for --disable-dco), as kernel
`wireguard` is beside `wireguard-go`: one run measures both data paths, each with its own row and availability.

The module is the out-of-tree ovpn-dco-v2 (Debian 12: openvpn-dco-dkms), not mainline's `ovpn` (6.16+), which
only OpenVPN 2.7 drives. Where the kernel has no ovpn-dco, availability() says so with the kernel's answer
(lab/kernel.py creates an ovpn-dco device in a scratch namespace) and the VPN is impossible here; the kernel
lane (scripts/kernel-lane) builds the module for its Debian kernel and loads it. What ran is read back per
tunnel in start() (OpenVpn._read_data_path): an ovpn-dco device and OpenVPN's "DCO device X opened", or the
start fails with what OpenVPN said about DCO."""

from __future__ import annotations

from tunnelbench.lab.host import Host
from tunnelbench.vpns.features import one_source
from tunnelbench.vpns.openvpn import DCO_MODULE_VERSION, OPENVPN_MANUAL, OpenVpn

DCO_README = "https://github.com/OpenVPN/openvpn/blob/release/2.6/README.dco.md"


class OpenVpnDco(OpenVpn):
    name = "openvpn-dco"
    summary = (
        "OpenVPN 2.6 full mesh of p2p TLS tunnels (one per pair, UDP 1194+k), AES-256-GCM, data channel in "
        "the kernel (ovpn-dco module)"
    )
    # the feature record (vpns/features.py): each fact with its source
    features = one_source(
        OPENVPN_MANUAL,
        protocol="OpenVPN (TLS control channel, custom data channel) over UDP/TCP",
        ciphers=(
            "AEAD data ciphers only (AES-128/192/256-GCM, ChaCha20-Poly1305; here AES-256-GCM)",
            DCO_README,
        ),
        data_plane=("kernel (ovpn-dco module); TLS control channel in userspace openvpn", DCO_README),
        topology="client-server or point-to-point; full mesh of p2p tunnels by the driver",
        nat_traversal="client behind NAT to a reachable server",
        relay=(
            "server forwards between clients by the kernel's routing table (no userspace client-to-client)",
            DCO_README,
        ),
        acl="per-client config (CCD), packet filter plugins",
        unattended_join="certificates",
        self_hosted_control="yes (the server)",
        platforms=("Linux (ovpn-dco), Windows (ovpn-dco-win)", DCO_README),
        license="GPL-2.0",
    )
    kernel_features = ("ovpn-dco",)
    dco = True

    @classmethod
    def version(cls, host: Host) -> str:
        # OpenVPN's, then the module's, both on the machine that runs them ("2.6.14 + ovpn-dco 0.0+git20231103")
        r = host.run(["cat", DCO_MODULE_VERSION], check=False, timeout=10)
        module = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "built-in"
        return f"{super().version(host)} + ovpn-dco {module}"

    @classmethod
    def version_label(cls, reported: str) -> str:
        # where OpenVPN's build comes from (Debian's) goes with OpenVPN's version, not the module's
        openvpn, _, module = reported.partition(" + ")
        return f"{super().version_label(openvpn)} + {module}" if module else super().version_label(reported)
