"""Feature records: what each VPN is (protocol, ciphers, data plane, topology, NAT traversal, relay,
ACLs, unattended join, self-hostable control plane, platforms, license), every fact with its source.

A fact is `{"value": ..., "source": "<doc URL>" | "probe: <what the lab checked>", "probed": bool}`.
Facts the lab can check (does the relay carry traffic when UDP between peers is blocked, does the mesh
come up with peers behind NAT, the NAT-traversal matrix per pair of NAT types) are measured by
`tests/lab/test_paths.py` (the relay and NAT probes) and `tunnelbench nat-matrix` (tunnelbench/sweeps/natmatrix.py), and
recorded in $TUNNELBENCH_CACHE/probes.json; `record()` merges the latest probe into the documented
record, so a run stores what was last observed on this kind of machine, with the date."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any

from tunnelbench.vpns.install import cache_root

# documented field -> the probe that checks it; a probe with `data` (the NAT-traversal matrix: NAT pair ->
# "direct (97% direct)" | "relayed (0% direct)" | "failed", from `tunnelbench nat-matrix`) has that as its value
PROBED_FIELDS = {"relay": "relay_probe", "nat_traversal": "nat_probe", "nat_traversal_matrix": "nat_matrix"}


def fact(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source, "probed": source.startswith("probe:")}


# -- helpers the drivers' records share ---------------------------------------------------------------
def one_source(src: str, **facts: str | tuple[str, str]) -> dict[str, Any]:
    """A record whose facts all come from one page unless a (value, source) pair is given."""
    return {k: fact(*v) if isinstance(v, tuple) else fact(v, src) for k, v in facts.items()}


WG_DOC = "https://www.wireguard.com/protocol/"


def wireguard_record(data_plane: str, src: str, license_: tuple[str, str]) -> dict[str, Any]:
    """WireGuard's protocol facts, with the implementation's data plane and license."""
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


KTUN = "https://developers.redhat.com/blog/2019/05/17/an-introduction-to-linux-virtual-interfaces-tunnels"
IPROUTE_LINK = "https://man7.org/linux/man-pages/man8/ip-link.8.html"
IPROUTE_MACSEC = "https://man7.org/linux/man-pages/man8/ip-macsec.8.html"


def kernel_tunnel_record(protocol: tuple[str, str], ciphers: tuple[str, str] | None = None) -> dict[str, Any]:
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


SWANCTL = "https://docs.strongswan.org/docs/5.9/swanctl/swanctlConf.html"
SS_ROUTE = "https://docs.strongswan.org/docs/5.9/features/routeBasedVpn.html"
# the kernel IPsec family's data plane
XFRM_DATA_PLANE = (
    "kernel XFRM (ESP in the kernel), charon for IKE only",
    "https://docs.strongswan.org/docs/5.9/howtos/introduction.html",
)


def kernel_ipsec_record(protocol: str, data_plane: tuple[str, str], acl: str) -> dict[str, Any]:
    """strongSwan IKEv2 with the kernel's ESP (vpns/ipsec.py, vpns/ipsec_overlay.py): static per-pair SAs."""
    return one_source(
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


def _probes_path() -> Path:
    return Path(os.environ.get("TUNNELBENCH_PROBES", str(cache_root() / "probes.json")))


def load_probes() -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(_probes_path().read_text())
        return data
    except (OSError, json.JSONDecodeError):
        return {}


def save_probe(
    vpn: str, what: str, ok: bool, detail: str, version: str | None = None, value: Any = None
) -> None:
    """Record what the lab observed (what: "relay_probe" | "nat_probe" | "nat_matrix"; value: a structured
    result, the fact's value instead of `ok`)."""
    path = _probes_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # read-modify-write under an exclusive lock (two writers would otherwise drop each other's entry), the new
    # text through a temporary name of this writer's own, renamed over the file (a reader never sees half)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load_probes()
        data.setdefault(vpn, {})[what] = {
            "ok": ok,
            "detail": detail,
            "version": version,
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            **({"value": value} if value is not None else {}),
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)


def record(vpn: str, documented: dict[str, Any]) -> dict[str, Any]:
    """The documented record with the lab's latest probes added as their own facts."""
    out = dict(documented)
    probes = load_probes().get(vpn, {})
    for key in PROBED_FIELDS.values():
        p = probes.get(key)
        if p is not None:
            out[key] = fact(
                p.get("value", p["ok"]), f"probe: {p['detail']} ({p['at']}, version {p.get('version')})"
            )
    return out
