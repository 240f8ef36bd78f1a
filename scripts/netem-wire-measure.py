"""What a TCP bulk flow loses per wire packet under netem, GSO super-packets whole (the old root netem) or per
wire packet (NetemBackend: TBF segmentation in front of netem). Needs a kernel with netem: run it in the
full-kernel lane's VM, e.g.
  vng --run /boot/vmlinuz-6.1.*-amd64 --disable-kvm --cpus 2 --memory 3G --user root -- \
    'modprobe -q tun; cd /work/wt-netem && PYTHONPATH=src .venv/bin/python scripts/netem-wire-measure.py'
Emulated CPU: counts and ratios only, never speed.

For each VPN (the raw path `internal`, `wireguard-go`), profile (`loss-1`, `low`) and mode (old, new), one
iperf3 TCP flow h1 -> h2 of SECONDS s, and:
  W  wire packets the sender put on the data direction: h1's TCP OutSegs (every TSO/GSO segment counted; over
     wireguard-go the inner TCP segments, one UDP datagram each on the underlay)
  E  netem's loss decisions on the data direction: the drops of the netem qdisc on the router's egress toward
     h2 (old: per skb = per super-packet; new: per wire packet)
  L  wire packets TCP had to resend: h1's TCP RetransSegs (lost segments, plus any spurious retransmission)
  spurious  h1's TcpExt TCPDSACKRecv: retransmissions the receiver reported as duplicates (reordering)
  skbs  skbs the router forwarded h1 -> h2 (an nftables counter: one per skb, GSO or not)
  skb/W  mean wire packets per skb netem saw (old mode: the super-packet size)
  E/W  loss events per wire packet (configured: the profile's loss), L/W lost fraction, L/E mean burst."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tunnelbench.catalog import DRIVERS
from tunnelbench.impair.backend import Backend, EgressNetemBackend, NetemBackend, netem_args
from tunnelbench.impair.profiles import PROFILES, Profile
from tunnelbench.lab.host import Host
from tunnelbench.lab.journal import Journal
from tunnelbench.lab.netns import NetnsLab
from tunnelbench.lab.tags import new_run_id, new_tag
from tunnelbench.vpns.base import MeshSpec
from tunnelbench.vpns.mesh import Mesh

SECONDS = int(os.environ.get("TB_WIRE_SECONDS", "4"))


def snmp(h: Host) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in ("/proc/net/snmp", "/proc/net/netstat"):
        lines = h.run(["cat", f]).stdout.splitlines()
        for a, b in zip(lines[::2], lines[1::2], strict=True):
            keys, vals = a.split()[1:], b.split()[1:]
            proto = a.split(":")[0]
            out.update({f"{proto}.{k}": int(v) for k, v in zip(keys, vals, strict=True)})
    return out


def netem_stats(router: Host, dev: str) -> dict[str, int]:
    qs = json.loads(router.run(["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout)
    (q,) = [q for q in qs if q["kind"] == "netem"]
    return {"pkts": q["packets"], "bytes": q["bytes"], "drops": q["drops"]}


def skb_counter(lab: NetnsLab) -> int:
    """skbs the router forwarded h1 -> h2 (an nftables counter counts an skb once, GSO or not)."""
    h1, h2 = lab.hosts
    nft = ["nft"]
    name = f"{lab.tag}skb"
    if lab.router.run([*nft, "list", "table", "inet", name], check=False).returncode != 0:
        rule = f"ip saddr {h1.underlay_ip} ip daddr {h2.underlay_ip} counter"
        lab.router.run(
            [*nft, "-f", "-"],
            input=f"table inet {name} {{\n chain c {{\n  type filter hook forward priority -10; policy accept;\n"
            f"  {rule}\n }}\n}}\n",
        )
    out = lab.router.run([*nft, "list", "table", "inet", name]).stdout
    return int(out.split("counter packets ")[1].split()[0])


def one(lab: NetnsLab, mesh: Mesh, p: Profile, mode: str) -> dict[str, object]:
    h1, h2 = lab.hosts
    r = lab.router
    be: Backend = NetemBackend(r, lab.hosts, lab.run_dir / "impair")
    # where netem's drops toward h2 are counted: the router's egress toward h2, or (egress) h1's own underlay
    # interface, where EgressNetemBackend (the SSH placement) puts its prio root, TBF and netem
    at, dev = r, h2.name
    if mode == "old":  # what NetemBackend did before: netem at the root, GSO skbs whole
        for h in lab.hosts:
            r.run(["tc", "qdisc", "replace", "dev", h.name, "root", "netem", *netem_args(p)])
    elif mode == "egress":
        be = EgressNetemBackend(list(lab.hosts), lab.run_dir / "impair")
        be.apply(p)
        at, dev = h1, h1.underlay_if
    else:
        be.apply(p)
    srv = h2.spawn(["iperf3", "-s", "-p", "5299"], label="iperf3-s", log_path=lab.run_dir / "iperf3-s.log")
    try:
        time.sleep(1)
        a0, n0, k0 = snmp(h1), netem_stats(at, dev), skb_counter(lab)
        res = h1.run(
            ["iperf3", "-c", mesh.tunnel_ip(h2), "-p", "5299", "-t", str(SECONDS), "-J"], timeout=SECONDS + 60
        )
        a1, n1, k1 = snmp(h1), netem_stats(at, dev), skb_counter(lab)
    finally:
        srv.stop()
        be.clear()
    mbit = json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6
    w = a1["Tcp.OutSegs"] - a0["Tcp.OutSegs"]
    e = n1["drops"] - n0["drops"]
    skbs = k1 - k0  # (netem's own packet counter counts GSO segments, its drops count skbs)
    dsack = a1["TcpExt.TCPDSACKRecv"] - a0["TcpExt.TCPDSACKRecv"]
    lost = a1["Tcp.RetransSegs"] - a0["Tcp.RetransSegs"]
    return {
        "vpn": mesh.driver.name,
        "profile": p.name,
        "mode": mode,
        "configured": p.expected_loss(),
        "W": w,
        "skbs": skbs,
        "E": e,
        "L": lost,
        "spurious": dsack,
        "wire_per_skb": round(w / skbs, 2) if skbs else None,
        "E/W": e / w if w else None,
        "L/W": lost / w if w else None,
        "L/E": round(lost / e, 2) if e else None,
        "mbit_emulated": round(mbit, 1),
    }


def main() -> None:
    vpns = sys.argv[1:] or ["internal", "wireguard-go"]
    # a rate limit composed with loss: the segmenting TBF is also the rate limit (TB_WIRE_PROFILES=rate20-loss1)
    extra = {"rate20-loss1": Profile(name="rate20-loss1", rate_mbit=20, delay_ms=5, loss_pct=1)}
    names = os.environ.get("TB_WIRE_PROFILES", "loss-1,low").split(",")
    profiles = [extra[n] if n in extra else PROFILES[n] for n in names]
    rows = []
    for vpn in vpns:
        cls = DRIVERS[vpn]
        a = cls.availability()
        if not a.ok:
            print(f"{vpn}: {a.reason}", flush=True)
            continue
        tag = new_tag()
        run_dir = Path(tempfile.mkdtemp(prefix="tb-wire-")) / new_run_id(tag)
        journal = Journal(run_dir, run_dir.name)
        lab = NetnsLab(tag, 2, run_dir, journal)
        mesh = None
        try:
            lab.build()
            lab.wait_links()
            driver = cls(MeshSpec(hosts=list(lab.hosts), tag=lab.tag, workdir=lab.run_dir))
            driver.configure()
            mesh = Mesh(driver)
            mesh.start()
            mesh.wait_ready(60)
            for p in profiles:
                for mode in os.environ.get("TB_WIRE_MODES", "old,new").split(","):
                    row = one(lab, mesh, p, mode)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            if mesh is not None:
                mesh.stop()
            lab.destroy()
            journal.end()
    print("RESULTS " + json.dumps(rows))


if __name__ == "__main__":
    main()
