"""Which kernel data paths a machine has: each feature is tried for real in a scratch network namespace on
the machine that will run it (this one, or an SSH host), never guessed from a version or a module list.

One shell script does every probe in one round trip (it matters over SSH) and prints a line per feature:
`feature<TAB>ok` or `feature<TAB>the kernel's error`. The scratch namespace carries the run prefix, so
`tunnelbench clean` removes it if the probe is killed half-way.

The probe changes the machine (a namespace, tunnel devices, modules loaded: GRE's brings gre0 into every
namespace), so on this machine it runs only where no other process's lab can be disturbed: a command that does
not hold the lab lock (`plan`) says so with `hold_probes`, and then gets this boot's last probe record (each
local probe is kept beside the lab lock), or "not probed"."""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from tunnelbench.lab import journal
from tunnelbench.lab.tags import TAG_PREFIX

# addresses inside the scratch namespace only: tunnels are created, never brought up (two tunnels of one
# type with the same endpoints are refused: "File exists")
_A, _B = "192.0.2.1", "192.0.2.2"
_KEY16 = "0123456789abcdef0123456789abcdef"

# devices the kernel makes by itself in every namespace when the GRE, IPIP, VTI or SIT module loads (unless
# net.core.fb_tunnels_only_for_init_net): down, no address, not the run's; teardown checks ignore them
FALLBACK_LINKS = frozenset(
    {"gre0", "gretap0", "erspan0", "tunl0", "ip_vti0", "sit0", "ip6tnl0", "ip6gre0", "ip6_vti0", "ip6erspan0"}
)

# feature -> (what it enables, its kernel module, commands that must all succeed in the scratch namespace);
# v0/v1 is a veth pair
FEATURES: dict[str, tuple[str, str, list[str]]] = {
    "veth": ("the namespace lab's links", "veth", ["ip link add v0 type veth peer name v1"]),
    "tun": ("userspace VPNs' interfaces", "tun", ["ip tuntap add t0 mode tun"]),
    "dummy": ("dummy interfaces", "dummy", ["ip link add d0 type dummy"]),
    "netem": ("the netem impairment backend", "sch_netem", ["tc qdisc add dev v0 root netem delay 1ms"]),
    "wireguard": ("kernel WireGuard", "wireguard", ["ip link add wg0 type wireguard"]),
    "vxlan": ("VXLAN", "vxlan", [f"ip link add vx0 type vxlan id 1 dstport 4789 local {_A}"]),
    "gre": ("GRE", "ip_gre", [f"ip link add g0 type gre local {_A} remote {_B}"]),
    "gretap": ("GREtap", "ip_gre", [f"ip link add gt0 type gretap local {_A} remote {_B}"]),
    "ipip": ("IP in IP", "ipip", [f"ip link add ii0 type ipip local {_A} remote {_B}"]),
    "fou": (
        "FOU (IPIP over UDP)",
        "fou",
        [
            "ip fou add port 5555 ipproto 4",
            f"ip link add f0 type ipip local {_A} remote 192.0.2.3 encap fou encap-sport auto encap-dport 5555",
        ],
    ),
    "gue": (
        "GUE (IPIP over UDP with a GUE header)",
        "fou",
        [
            "ip fou add port 5556 gue",
            f"ip link add gu0 type ipip local {_A} remote 192.0.2.4 encap gue encap-sport auto encap-dport 5556",
        ],
    ),
    "geneve": ("GENEVE", "geneve", [f"ip link add ge0 type geneve id 1 remote {_B}"]),
    "macsec": (
        "MACsec (AES-GCM)",
        "macsec",
        [
            "ip link add link v0 ms0 type macsec encrypt on",
            f"ip macsec add ms0 tx sa 0 pn 1 on key 01 {_KEY16}",
        ],
    ),
    "esp": (
        "kernel ESP (IPsec, AES-GCM)",
        "esp4",
        [
            f"ip xfrm state add src {_A} dst {_B} proto esp spi 0x100 mode "
            f"tunnel aead 'rfc4106(gcm(aes))' 0x{_KEY16}01234567 128"
        ],
    ),
    "vti": (
        "route-based IPsec with VTI",
        "ip_vti",
        [f"ip link add vt0 type vti local {_A} remote {_B} key 5"],
    ),
    "xfrmi": (
        "route-based IPsec with XFRM interfaces",
        "xfrm_interface",
        ["ip link add xi0 type xfrm dev v0 if_id 5"],
    ),
    # OpenVPN 2.6's data-channel offload: the out-of-tree ovpn-dco-v2 module (Debian 12's openvpn-dco-dkms),
    # not mainline's `ovpn` (6.16+), which only OpenVPN 2.7 drives. No attributes: a p2p device
    "ovpn-dco": ("OpenVPN data-channel offload", "ovpn_dco_v2", ["ip link add o0 type ovpn-dco"]),
}


def probe_script(ns: str) -> str:
    lines = [
        "set +e",
        f"ip netns add {ns} || {{ printf 'netns\\tip netns add failed\\n'; exit 0; }}",
        # FOU/GUE are configured over generic netlink, which does not load the module on demand
        "modprobe -q fou 2>/dev/null",
    ]
    for name, (_, _, cmds) in FEATURES.items():
        chain = shlex.quote(" && ".join(cmds))
        # the exit status decides; the kernel's message (first 200 characters, one line) says why
        lines.append(
            f"e=$(ip netns exec {ns} sh -c {chain} 2>&1) && r=ok || "
            f"r=$(printf '%s' \"${{e:-exit $?}}\" | tr '\\n\\t' '  ' | cut -c1-200)"
        )
        lines.append(f"printf '%s\\t%s\\n' {name} \"$r\"")
    lines.append(f"ip netns del {ns}")
    return "\n".join(lines) + "\n"


def parse(out: str) -> dict[str, str | None]:
    """{feature: None when present, else the kernel's error}."""
    got: dict[str, str | None] = {}
    for line in out.splitlines():
        name, _, why = line.partition("\t")
        if name == "netns":
            return {f: f"cannot probe: {why}" for f in FEATURES}
        if name in FEATURES:
            got[name] = None if why.strip() == "ok" else why.strip() or "failed"
    for f in FEATURES:
        got.setdefault(f, "not probed (the probe stopped early)")
    return got


Runner = Callable[[list[str]], str]


def _local(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


_CACHE: dict[str, dict[str, str | None]] = {}
NOT_PROBED = "not probed"
_held: list[str] = []  # why this process may not probe this machine now (hold_probes)


def hold_probes(why: str) -> None:
    """This process must not probe this machine (another process holds the lab: `why`)."""
    _held[:] = [why]


def probes_held() -> str | None:
    """Why this process may not probe this machine now, or None."""
    return _held[0] if _held else None


def _record_path() -> Path:
    """Beside the lab lock (/run/tunnelbench.kernel.json): gone at reboot, as the record is."""
    return journal.REGISTRY.with_name(journal.REGISTRY.name + ".kernel.json")


def _boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _recorded() -> dict[str, str | None] | None:
    """This boot's last local probe, if one was kept."""
    try:
        data = json.loads(_record_path().read_text())
        got = data["features"] if data.get("boot") == _boot() else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return got if isinstance(got, dict) and set(got) == set(FEATURES) else None


def _keep(found: dict[str, str | None]) -> None:
    try:
        path = _record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"boot": _boot(), "features": found}) + "\n")
    except OSError:
        pass  # not root (the probe then said "cannot probe" anyway): nothing to keep


def features(where: str = "local", run: Runner = _local) -> dict[str, str | None]:
    """Every feature of the machine `where` names ("local", or an SSH host's name, whose commands `run`
    executes there): None when present, else why not. Probed once per machine and process; this machine not
    at all while `hold_probes` says so (this boot's last probe, else NOT_PROBED with the reason)."""
    if where not in _CACHE:
        if where == "local" and _held:
            return _recorded() or {f: f"{NOT_PROBED}: {_held[0]}" for f in FEATURES}
        ns = f"{TAG_PREFIX}kp{secrets.token_hex(2)}"
        _CACHE[where] = parse(run(["sh", "-c", probe_script(ns)]))
        if where == "local" and run is _local:
            _keep(_CACHE[where])
    return _CACHE[where]


def missing(needed: tuple[str, ...], where: str = "local", run: Runner = _local) -> str | None:
    """Why the machine lacks one of `needed` (the first missing, with the kernel's words), else None."""
    have = features(where, run)
    for f in needed:
        if have.get(f) is not None:
            return f"{FEATURES[f][0]} (module {FEATURES[f][1]}): {have[f]}"
    return None


# what the full-kernel test lane (scripts/kernel-lane) needs: if this kernel has all of them, the lane's
# tests run here; otherwise in a VM with Debian's stock kernel
LANE_FEATURES = (
    "netem",
    "wireguard",
    "gre",
    "gretap",
    "ipip",
    "fou",
    "gue",
    "geneve",
    "macsec",
    "esp",
    "vti",
    "xfrmi",
    "dummy",
    "ovpn-dco",  # built for the lane's kernel by scripts/kernel-lane, loaded in its VM
)


def main() -> int:
    """`python -m tunnelbench.lab.kernel`: one line per feature; exit 1 if any the lane needs is missing."""
    have = features()
    for f, why in have.items():
        print(f"{f:10} {'yes' if why is None else 'no: ' + why}")
    return int(any(have[f] is not None for f in LANE_FEATURES))


if __name__ == "__main__":
    raise SystemExit(main())
