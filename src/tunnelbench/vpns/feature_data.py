"""The documented half of every VPN's feature record (vpns/features.py adds the lab's probes).

Each fact: value + source (a documentation page, or "probe: ..." when this lab checked it, or
"driver: ..." when it is what this lab's driver configures). Attached to the driver classes in
vpns/__init__.py as `features`."""

from __future__ import annotations

from tunnelbench.vpns.features import fact

WG_DOC = "https://www.wireguard.com/protocol/"
TS_DERP = "https://tailscale.com/kb/1232/derp-servers"
NEBULA_RELAY = "https://nebula.defined.net/docs/config/relay/"
NEBULA_PUNCHY = "https://nebula.defined.net/docs/config/punchy"
ET_GH = "https://github.com/EasyTier/EasyTier"
ET_P2P = "https://www.easytier.cn/en/guide/network/p2p-optimize.html"
VPNCLOUD_GH = "https://github.com/dswd/vpncloud"
YGG = "https://yggdrasil-network.github.io/"
HS_DERP = "https://headscale.net/latest/ref/derp"


def _wg(data_plane: str, src: str, license_: tuple[str, str]) -> dict:
    return {
        "protocol": fact("WireGuard (Noise IK over UDP)", WG_DOC),
        "ciphers": fact("ChaCha20-Poly1305, Curve25519, BLAKE2s (fixed, no negotiation)", WG_DOC),
        "data_plane": fact(data_plane, src),
        "topology": fact(
            "point-to-point peers; full mesh as configured by the driver", "driver: one peer per host"
        ),
        "nat_traversal": fact("none beyond persistent keepalive (no rendezvous)", WG_DOC),
        "relay": fact("none", WG_DOC),
        "acl": fact("per peer allowed-ips (cryptokey routing)", WG_DOC),
        "unattended_join": fact("static keys and configs (no control plane)", WG_DOC),
        "self_hosted_control": fact("no control plane", WG_DOC),
        "platforms": fact("Linux, BSD, macOS, Windows, Android, iOS", "https://www.wireguard.com/install/"),
        "license": fact(*license_),
    }


DOCUMENTED: dict[str, dict] = {
    "wireguard": _wg("kernel", "https://www.wireguard.com/", ("GPL-2.0", "https://www.wireguard.com/")),
    "wireguard-go": _wg(
        "userspace (Go), TUN",
        "https://git.zx2c4.com/wireguard-go/about/",
        ("MIT", "https://git.zx2c4.com/wireguard-go/about/"),
    ),  # fmt: skip
    "boringtun": _wg(
        "userspace (Rust), TUN",
        "https://github.com/cloudflare/boringtun",
        ("BSD-3-Clause", "https://github.com/cloudflare/boringtun"),
    ),  # fmt: skip
    "tailscale": {
        "protocol": fact(
            "WireGuard data plane; disco + DERP control side channel", "https://pkg.go.dev/tailscale.com/derp"
        ),
        "ciphers": fact("ChaCha20-Poly1305 / Curve25519 (WireGuard); DERP over TLS", TS_DERP),
        "data_plane": fact(
            "userspace (wireguard-go in tailscaled) on a kernel TUN with GSO/GRO",
            "https://tailscale.com/blog/more-throughput",
        ),
        "topology": fact("full mesh, coordinated by a control server", TS_DERP),
        "nat_traversal": fact(
            "STUN + disco hole punching", "https://tailscale.com/blog/how-nat-traversal-works"
        ),
        "relay": fact("DERP over HTTPS/TCP (and peer relays over UDP)", TS_DERP),
        "acl": fact("tailnet policy (users, groups, tags, ports)", "https://tailscale.com/kb/1018/acls"),
        "unattended_join": fact(
            "pre-auth keys (reusable, ephemeral)", "https://headscale.net/latest/ref/integration/"
        ),
        "self_hosted_control": fact("yes with Headscale (and self-hosted derper)", HS_DERP),
        "platforms": fact("Linux, Windows, macOS, iOS, Android, BSD", "https://tailscale.com/download"),
        "license": fact(
            "BSD-3-Clause (client, derper); Headscale BSD-3-Clause", "https://pkg.go.dev/tailscale.com/derp"
        ),
    },
    "nebula": {
        "protocol": fact("Noise IX handshakes over UDP", "https://nebula.defined.net/docs/"),
        "ciphers": fact(
            "AES-256-GCM or ChaCha20-Poly1305 (network-wide choice)",
            "https://nebula.defined.net/docs/config/cipher/",
        ),
        "data_plane": fact("userspace (Go), TUN", "https://github.com/slackhq/nebula"),
        "topology": fact(
            "full mesh with lighthouses for discovery",
            "https://manpages.ubuntu.com/manpages/lunar/man5/nebula.yml.5.html",
        ),
        "nat_traversal": fact("lighthouse-coordinated UDP hole punching (punchy)", NEBULA_PUNCHY),
        "relay": fact("relay hosts over UDP (since 1.6.0)", NEBULA_RELAY),
        "acl": fact(
            "built-in stateful firewall by certificate name/group, port, proto",
            "https://nebula.defined.net/docs/config/firewall/",
        ),
        "unattended_join": fact(
            "per-host certificates signed by the CA (offline)", "https://nebula.defined.net/docs/"
        ),
        "self_hosted_control": fact(
            "yes (lighthouses are ordinary nodes)", "https://nebula.defined.net/docs/"
        ),
        "platforms": fact(
            "Linux, macOS, Windows, iOS, Android, FreeBSD", "https://github.com/slackhq/nebula"
        ),
        "license": fact("MIT", "https://github.com/slackhq/nebula"),
    },
    "easytier": {
        "protocol": fact("own protocol over UDP/TCP/WebSocket/QUIC/WireGuard transports", ET_GH),
        "ciphers": fact(
            "AES-GCM (default) with a key from the network secret",
            "https://wiki.metacubex.one/en/config/proxies/easytier/",
        ),
        "data_plane": fact("userspace (Rust, tokio), TUN", ET_GH),
        "topology": fact("decentralised mesh; every node routes and relays", ET_GH),
        "nat_traversal": fact("UDP hole punching", ET_P2P),
        "relay": fact("any node relays (UDP or TCP links)", ET_P2P),
        "acl": fact("network name + secret; whitelists for relaying", ET_GH),
        "unattended_join": fact("yes (config file with the network secret)", ET_GH),
        "self_hosted_control": fact("no control plane needed (public or own relay nodes)", ET_GH),
        "platforms": fact("Linux, macOS, Windows (iOS/Android later)", ET_GH),
        "license": fact("LGPL-3.0", ET_GH),
    },
    "vpncloud": {
        "protocol": fact("own peer-to-peer protocol over UDP", VPNCLOUD_GH),
        "ciphers": fact("Curve25519 keys; AES-256-GCM / AES-128-GCM / ChaCha20-Poly1305", VPNCLOUD_GH),
        "data_plane": fact("userspace (Rust), TUN or TAP", VPNCLOUD_GH),
        "topology": fact("automatic full mesh, no central server", VPNCLOUD_GH),
        "nat_traversal": fact("hole punching, UPnP port forwarding", VPNCLOUD_GH),
        "relay": fact("none", VPNCLOUD_GH),
        "acl": fact("shared password or trusted public keys", VPNCLOUD_GH),
        "unattended_join": fact("yes (password or key in config)", VPNCLOUD_GH),
        "self_hosted_control": fact("no control plane", VPNCLOUD_GH),
        "platforms": fact("Linux", VPNCLOUD_GH),
        "license": fact("GPL-3.0", "https://docs.rs/crate/vpncloud/2.3.0/source/"),
    },
    "yggdrasil": {
        "protocol": fact(
            "own routing protocol (spanning tree + greedy routing) over TCP/TLS/QUIC links", YGG
        ),
        "ciphers": fact("Ed25519 node keys, end-to-end encrypted sessions", YGG),
        "data_plane": fact(
            "userspace (Go), TUN, IPv6 200::/7 only", "https://pkg.go.dev/github.com/vikulin/yggdrasil-go"
        ),
        "topology": fact("self-arranging mesh over configured peerings", YGG),
        "nat_traversal": fact("outbound peerings to a reachable node (no hole punching)", YGG),
        "relay": fact("every node routes for others (TCP links)", YGG),
        "acl": fact("AllowedPublicKeys for incoming peerings only", YGG),
        "unattended_join": fact("yes (generated config)", YGG),
        "self_hosted_control": fact("no control plane", YGG),
        "platforms": fact(
            "Linux, macOS, Windows, BSD, OpenWrt", "https://pkg.go.dev/github.com/vikulin/yggdrasil-go"
        ),
        "license": fact("LGPL-3.0", "https://openwrt.org/packages/pkgdata/yggdrasil"),
    },
    "n2n": {
        "protocol": fact("n2n v1 over UDP, layer 2 (TAP)", "https://www.ntop.org/products/n2n/"),
        "ciphers": fact("Twofish with a shared community key (v1)", "driver: edge -k / N2N_KEY"),
        "data_plane": fact("userspace (C), TAP", "https://www.ntop.org/products/n2n/"),
        "topology": fact("peer to peer edges, supernode for discovery", "https://www.ntop.org/products/n2n/"),
        "nat_traversal": fact(
            "via the supernode (registration keeps NAT mappings)", "https://www.ntop.org/products/n2n/"
        ),
        "relay": fact(
            "supernode forwards when edges cannot reach each other (UDP)",
            "https://www.ntop.org/products/n2n/",
        ),
        "acl": fact("community name + key only", "https://www.ntop.org/products/n2n/"),
        "unattended_join": fact("yes (command line)", "driver"),
        "self_hosted_control": fact("yes (supernode)", "https://www.ntop.org/products/n2n/"),
        "platforms": fact("Linux, BSD, macOS, Windows", "https://www.ntop.org/products/n2n/"),
        "license": fact("GPL-3.0", "https://github.com/ntop/n2n"),
    },
    "fastd": {
        "protocol": fact("fastd over UDP (tun or tap)", "https://fastd.readthedocs.io/"),
        "ciphers": fact(
            "salsa2012+umac (used), chacha20-poly1305, aes128-gcm, null",
            "https://fastd.readthedocs.io/en/stable/crypto/methods.html",
        ),
        "data_plane": fact("userspace (C)", "https://fastd.readthedocs.io/"),
        "topology": fact("peer lists; TAP mode switches between peers", "https://fastd.readthedocs.io/"),
        "nat_traversal": fact(
            "one side behind NAT (the other must be reachable)", "https://fastd.readthedocs.io/"
        ),
        "relay": fact("none (a node may forward with `forward yes`)", "https://fastd.readthedocs.io/"),
        "acl": fact("per-peer public keys or on-verify hook", "https://fastd.readthedocs.io/"),
        "unattended_join": fact("static configs", "https://fastd.readthedocs.io/"),
        "self_hosted_control": fact("no control plane", "https://fastd.readthedocs.io/"),
        "platforms": fact("Linux, BSD, macOS", "https://fastd.readthedocs.io/"),
        "license": fact("BSD-2-Clause", "https://github.com/NeoRaider/fastd"),
    },
    "vxlan": {
        "protocol": fact("VXLAN (RFC 7348), UDP 4789", "https://www.rfc-editor.org/rfc/rfc7348"),
        "ciphers": fact("none (no encryption, no authentication)", "https://www.rfc-editor.org/rfc/rfc7348"),
        "data_plane": fact("kernel", "https://docs.kernel.org/networking/vxlan.html"),
        "topology": fact("static full mesh (FDB entries)", "driver: bridge fdb per peer"),
        "nat_traversal": fact("none", "https://www.rfc-editor.org/rfc/rfc7348"),
        "relay": fact("none", "https://www.rfc-editor.org/rfc/rfc7348"),
        "acl": fact("none", "https://www.rfc-editor.org/rfc/rfc7348"),
        "unattended_join": fact("static", "driver"),
        "self_hosted_control": fact("no control plane", "driver"),
        "platforms": fact("Linux, BSD, most switches", "https://docs.kernel.org/networking/vxlan.html"),
        "license": fact("GPL-2.0 (Linux)", "https://docs.kernel.org/networking/vxlan.html"),
    },
}


def _rec(src: str, **facts: str | tuple[str, str]) -> dict:
    """A record whose facts all come from one page unless a (value, source) pair is given."""
    return {k: fact(*v) if isinstance(v, tuple) else fact(v, src) for k, v in facts.items()}


SS = "https://docs.strongswan.org/docs/5.9/plugins/kernel-libipsec.html"
SE = "https://www.softether.org/1-features"
IN = "https://github.com/tonarino/innernet"
TINC = "https://www.tinc-vpn.org/documentation-1.0/"
OVPN = "https://openvpn.net/community-resources/reference-manual-for-openvpn-2-6/"
OCSERV = "https://www.infradead.org/ocserv/manual.html"
OCSERV_TECH = "https://ocserv.gitlab.io/www/technical.html"
OPENCONNECT = "https://en.wikipedia.org/wiki/OpenConnect"

DOCUMENTED.update(
    {
        "strongswan": _rec(
            "https://docs.strongswan.org/docs/5.9/swanctl/swanctlConf.html",
            protocol="IKEv2 + ESP (IPsec)",
            ciphers="negotiated IKE/ESP proposals (here AES-256-GCM, X25519)",
            data_plane=("kernel XFRM, or userspace ESP-in-UDP with kernel-libipsec (used here)", SS),
            topology="site-to-site SAs; full mesh as configured by the driver",
            nat_traversal=(
                "NAT-T (ESP in UDP 4500) to a reachable responder",
                "https://docs.strongswan.org/docs/5.9/features/natTraversal.html",
            ),
            relay="none",
            acl="traffic selectors per CHILD_SA",
            unattended_join="static configs, PSK or certificates",
            self_hosted_control="no control plane",
            platforms="Linux, BSD, macOS, Android, Windows (client)",
            license=("GPL-2.0", "https://github.com/strongswan/strongswan"),
        ),
        "softether": _rec(
            SE,
            protocol="SSL-VPN (SoftEther protocol, L2 over TLS/TCP) plus L2TP/IPsec, OpenVPN, SSTP servers",
            ciphers="TLS cipher suites (here ECDHE-RSA-AES256-GCM-SHA384)",
            data_plane="userspace (C), TAP",
            topology="star around a virtual hub",
            nat_traversal="clients dial out over TCP 443; NAT-T and VPN Azure",
            relay="the hub carries all traffic (TCP)",
            acl="per-user/group access lists on the virtual hub",
            unattended_join="accounts via vpncmd",
            self_hosted_control="yes (the server is the hub)",
            platforms="Windows, Linux, macOS, FreeBSD, Solaris",
            license=("Apache-2.0", "https://github.com/SoftEtherVPN/SoftEtherVPN"),
        ),
        "innernet": _rec(
            IN,
            protocol="WireGuard, coordination server API over the tunnel",
            ciphers="WireGuard (ChaCha20-Poly1305, Curve25519)",
            data_plane="kernel WireGuard or userspace (wireguard-go, used here)",
            topology="full mesh, peers grouped in CIDRs",
            nat_traversal="endpoint discovery and NAT traversal via the server (since 1.5)",
            relay="none",
            acl="CIDR associations between groups",
            unattended_join="one-time invitation files",
            self_hosted_control="yes (innernet-server)",
            platforms="Linux, macOS",
            license="MIT",
        ),
        "tinc": _rec(
            TINC,
            protocol="tinc 1.0 meta protocol (TCP) + UDP data",
            ciphers="OpenSSL EVP (default Blowfish-CBC + HMAC-SHA1)",
            data_plane="userspace (C), TUN/TAP",
            topology="full mesh data, meta connections as configured",
            nat_traversal="relays via meta connections when UDP fails",
            relay="forwarding through other nodes (TCP/UDP)",
            acl="host files per node",
            unattended_join="exchange of host files",
            self_hosted_control="no control plane",
            platforms="Linux, BSD, macOS, Windows",
            license="GPL-2.0+",
        ),
        "openvpn": _rec(
            OVPN,
            protocol="OpenVPN (TLS control channel, custom data channel) over UDP/TCP",
            ciphers="negotiated data ciphers (here AES-256-GCM)",
            data_plane="userspace (or kernel with ovpn-dco; off here)",
            topology="client-server or point-to-point; full mesh of p2p tunnels by the driver",
            nat_traversal="client behind NAT to a reachable server",
            relay="server-side client-to-client forwarding",
            acl="per-client config (CCD), packet filter plugins",
            unattended_join="certificates",
            self_hosted_control="yes (the server)",
            platforms="Linux, BSD, macOS, Windows, Android, iOS",
            license="GPL-2.0",
        ),
        "openconnect": _rec(
            OCSERV,
            protocol="AnyConnect-compatible SSL VPN: control and backup data channel over HTTPS (TLS/TCP), "
            "data over DTLS/UDP, TLS fallback when UDP fails",
            ciphers="negotiated TLS/DTLS cipher suites (GnuTLS priorities; here AES-256-GCM, DTLS 1.2 with PSK "
            "from the TLS session)",
            data_plane="userspace (C, GnuTLS), TUN; one unprivileged worker process per client",
            topology=(
                "client-server (the server is the hub); full mesh of per-pair servers by the driver",
                "driver: one ocserv per pair",
            ),
            nat_traversal="clients dial out over TCP/UDP (443 by default) to a reachable server",
            relay=("the server routes between its clients (kernel forwarding, not ocserv)", OCSERV_TECH),
            acl="per-user/group config: routes, restrict-user-to-routes/ports (firewall script)",
            unattended_join="client certificates (or passwords, PAM, RADIUS); openconnect --non-inter",
            self_hosted_control="yes (the server)",
            platforms=(
                "server: Linux, BSD; openconnect client: Linux, BSD, macOS, Solaris, Windows, Android",
                OPENCONNECT,
            ),
            license=("GPL-2.0+ (ocserv), LGPL-2.1 (openconnect)", "https://gitlab.com/openconnect/ocserv"),
        ),
    }
)

KTUN = "https://developers.redhat.com/blog/2019/05/17/an-introduction-to-linux-virtual-interfaces-tunnels"
IPROUTE_LINK = "https://man7.org/linux/man-pages/man8/ip-link.8.html"
IPROUTE_MACSEC = "https://man7.org/linux/man-pages/man8/ip-macsec.8.html"


def _kernel_tunnel(protocol: tuple[str, str], ciphers: tuple[str, str] | None = None) -> dict:
    """A kernel tunnel of Gentile et al.: static, no control plane, Linux only; unencrypted unless `ciphers`."""
    none = ("none (no encryption, no authentication): a baseline, not a VPN", protocol[1])
    return {
        "protocol": fact(*protocol),
        "ciphers": fact(*(ciphers or none)),
        "data_plane": fact("kernel", IPROUTE_LINK),
        "topology": fact(
            "point-to-point devices; full mesh of one device per peer", "driver: one device per peer"
        ),
        "nat_traversal": fact("none", KTUN),
        "relay": fact("none", KTUN),
        "acl": fact("none", KTUN),
        "unattended_join": fact("static configuration", "driver"),
        "self_hosted_control": fact("no control plane", "driver"),
        "platforms": fact("Linux (most also in BSDs and routers)", KTUN),
        "license": fact("GPL-2.0 (Linux)", "https://www.kernel.org/"),
    }


DOCUMENTED.update(
    {
        "gre": _kernel_tunnel(("GRE (RFC 2784), IP protocol 47", "https://www.rfc-editor.org/rfc/rfc2784")),
        "gretap": _kernel_tunnel(("Ethernet over GRE (protocol 0x6558)", KTUN)),
        "ipip": _kernel_tunnel(
            ("IP in IP (RFC 2003), IP protocol 4", "https://www.rfc-editor.org/rfc/rfc2003")
        ),
        "fou": _kernel_tunnel(("FOU: IP in IP over UDP", "https://lwn.net/Articles/614348/")),
        "gue": _kernel_tunnel(
            (
                "GUE: IP in IP over UDP with a GUE header",
                "https://datatracker.ietf.org/doc/html/draft-ietf-intarea-gue",
            )
        ),  # fmt: skip
        "geneve": _kernel_tunnel(("GENEVE (RFC 8926), UDP 6081", "https://www.rfc-editor.org/rfc/rfc8926")),
        "macsec": _kernel_tunnel(
            ("MACsec (IEEE 802.1AE) over a GREtap carrier per peer", IPROUTE_MACSEC),
            ("GCM-AES-128, static keys (no MKA), replay protection", IPROUTE_MACSEC),
        ),
    }
)

SWANCTL = "https://docs.strongswan.org/docs/5.9/swanctl/swanctlConf.html"
SS_ROUTE = "https://docs.strongswan.org/docs/5.9/features/routeBasedVpn.html"


def _kernel_ipsec(protocol: str, data_plane: tuple[str, str], acl: str) -> dict:
    """strongSwan IKEv2 with the kernel's ESP (vpns/ipsec.py, vpns/ipsec_overlay.py): static per-pair SAs."""
    return _rec(
        SWANCTL,
        protocol=protocol,
        ciphers="negotiated IKE/ESP proposals (here IKE AES-256-GCM/X25519, ESP AES-256-GCM)",
        data_plane=data_plane,
        topology=("IKEv2 SA per pair; full mesh of one IKE_SA per peer", "driver: one connection per peer"),
        nat_traversal=(
            "none here: plain ESP (IP protocol 50) needs direct reachability; NAT-T exists (UDP 4500)",
            "https://docs.strongswan.org/docs/5.9/features/natTraversal.html",
        ),
        relay="none",
        acl=acl,
        unattended_join="static configs, PSK per pair (certificates possible)",
        self_hosted_control="no control plane",
        platforms=("Linux (XFRM); strongSwan also on BSD, macOS, Windows", "https://docs.strongswan.org/"),
        license=("GPL-2.0 (strongSwan, Linux)", "https://github.com/strongswan/strongswan"),
    )


_XFRM = (
    "kernel XFRM (ESP in the kernel), charon for IKE only",
    "https://docs.strongswan.org/docs/5.9/howtos/introduction.html",
)

DOCUMENTED.update(
    {
        "ipsec-tunnel": _kernel_ipsec(
            "IKEv2 + ESP tunnel mode (policy-based)", _XFRM, "traffic selectors per CHILD_SA (trap policies)"
        ),
        "ipsec-transport": _kernel_ipsec(
            "IKEv2 + ESP transport mode between the hosts' addresses",
            _XFRM,
            "traffic selectors per CHILD_SA (trap policies: nothing in clear)",
        ),
        "ipsec-vti": _kernel_ipsec(
            "IKEv2 + ESP tunnel mode, route-based (VTI devices, marks)",
            ("kernel XFRM via VTI devices (ip_vti)", SS_ROUTE),
            "routes to the VTI devices; selectors per CHILD_SA",
        ),
        "ipsec-xfrmi": _kernel_ipsec(
            "IKEv2 + ESP tunnel mode, route-based (XFRM interfaces, if_id)",
            ("kernel XFRM via XFRM interfaces (xfrm_interface)", SS_ROUTE),
            "routes to the XFRM interfaces; selectors per CHILD_SA",
        ),
        "gre-ipsec": _kernel_ipsec(
            "GRE (RFC 2784) in IKEv2 + ESP transport mode", _XFRM, "CHILD_SA selectors: GRE between the pair"
        ),
        "gretap-ipsec": _kernel_ipsec(
            "GREtap (Ethernet over GRE) in IKEv2 + ESP transport mode",
            _XFRM,
            "CHILD_SA selectors: GRE between the pair",
        ),
        "vxlan-ipsec": _kernel_ipsec(
            "VXLAN (RFC 7348, UDP 4789) in IKEv2 + ESP transport mode",
            _XFRM,
            "CHILD_SA selectors: UDP to/from port 4789 between the pair",
        ),
        "geneve-ipsec": _kernel_ipsec(
            "GENEVE (RFC 8926, UDP 6081) in IKEv2 + ESP transport mode",
            _XFRM,
            "CHILD_SA selectors: UDP to/from port 6081 between the pair",
        ),
    }
)
