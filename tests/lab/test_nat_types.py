"""NAT types of the `nat` path (issue 19 item 1): each behaves as its RFC 4787 definition says, proved with
hand-written UDP probes that know nothing of any VPN; and a small sample of the NAT-traversal matrix
(`tunnelbench nat-matrix` runs the whole one).

The probes use sockets opened inside the lab's namespaces from this process: a fresh thread joins the
namespace (setns), opens and binds the socket and exits; the socket stays in that namespace, so one thread
can then send and receive on every side without helper processes or timing races between them."""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import threading
from pathlib import Path

import pytest
from tree import ARTIFACTS

from tunnelbench.lab.addressing import router_ip
from tunnelbench.lab.netns import NAT_TYPES, NetnsLab, nat_rules

CLONE_NEWNET = 0x40000000
INSIDE_PORT, CLOSED_PORT = 40000, 40001  # the host's probing socket; a socket that never sends
A_PORT, A_OTHER_PORT, B_PORT = 5000, 5001, 7000
WAIT_S = 0.6  # how long a probe that should not arrive is waited for

# the definitions (RFC 4787 / RFC 3489): after the host sent from INSIDE_PORT to A,
#   reply       A answers from the port the host sent to             (every NAT)
#   other_port  A sends from another port to the mapped public port  (endpoint-independent or address filtering)
#   stranger    B, never contacted, sends to the mapped public port   (endpoint-independent filtering only)
#   unmapped    A sends to a public port the host never sent from     (no NAT type here: not a 1:1 NAT)
#   same_mapping  the host then sends to B from the same socket: B sees the public port A saw
#                 (endpoint-independent mapping; symmetric NATs map per destination)
EXPECTED = {
    "full-cone": {
        "reply": True,
        "other_port": True,
        "stranger": True,
        "unmapped": False,
        "same_mapping": True,
    },
    "address-restricted": {
        "reply": True,
        "other_port": True,
        "stranger": False,
        "unmapped": False,
        "same_mapping": True,
    },  # fmt: skip
    "port-restricted": {
        "reply": True,
        "other_port": False,
        "stranger": False,
        "unmapped": False,
        "same_mapping": True,
    },  # fmt: skip
    "symmetric": {
        "reply": True,
        "other_port": False,
        "stranger": False,
        "unmapped": False,
        "same_mapping": False,
    },
}


def udp_socket_in(netns: str, port: int) -> socket.socket:
    """A UDP socket bound to 0.0.0.0:port inside namespace `netns` (setns in a throw-away thread)."""
    out: dict = {}

    def enter() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
            finally:
                os.close(fd)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", port))
            out["sock"] = s
        except BaseException as e:  # handed to the caller
            out["error"] = e

    t = threading.Thread(target=enter)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


def recv(s: socket.socket, timeout: float = WAIT_S) -> tuple[bytes, tuple[str, int]] | None:
    if not select.select([s], [], [], timeout)[0]:
        return None
    return s.recvfrom(2048)


def probe_nat(lab: NetnsLab, host, a, b_netns: str, b_ip: str) -> dict:
    """Run the five probes against the NAT in front of `host` with outside hosts A (`a`, a lab host) and B
    (namespace `b_netns`, address `b_ip`); returns the observations."""
    pub = host.public_ip
    inside = udp_socket_in(host.netns, INSIDE_PORT)
    closed = udp_socket_in(host.netns, CLOSED_PORT)
    a_main, a_other = udp_socket_in(a.netns, A_PORT), udp_socket_in(a.netns, A_OTHER_PORT)
    b = udp_socket_in(b_netns, B_PORT)
    try:
        inside.sendto(b"out", (a.public_ip, A_PORT))
        got = recv(a_main, 5.0)
        assert got is not None, f"{host.name}: A never heard from the host through its NAT"
        seen_ip, port_a = got[1]
        assert seen_ip == pub, f"A saw {seen_ip}, not the NAT's public address {pub}"

        def arrives(sock_from: socket.socket, msg: bytes, to_port: int, at: socket.socket) -> bool:
            sock_from.sendto(msg, (pub, to_port))
            while (r := recv(at)) is not None:
                if r[0] == msg:
                    return True
            return False

        obs = {
            "reply": arrives(a_main, b"reply", port_a, inside),
            "other_port": arrives(a_other, b"other-port", port_a, inside),
            "stranger": arrives(b, b"stranger", port_a, inside),
            "unmapped": arrives(a_main, b"unmapped", CLOSED_PORT, closed),
        }
        inside.sendto(b"out-b", (b_ip, B_PORT))
        got_b = None
        while (r := recv(b, 5.0)) is not None:
            if r[0] == b"out-b":
                got_b = r
                break
        assert got_b is not None, f"{host.name}: B never heard from the host through its NAT"
        obs["same_mapping"] = got_b[1][1] == port_a
        obs["ports"] = {"inside": INSIDE_PORT, "seen_by_A": port_a, "seen_by_B": got_b[1][1]}
        return obs
    finally:
        for s in (inside, closed, a_main, a_other, b):
            s.close()


def test_nat_rules_per_type():
    """The nft tables differ exactly where the definitions do (no lab needed)."""
    r = {t: nat_rules("xnat", t, "172.16.1.2") for t in NAT_TYPES}
    assert "fully-random" in r["symmetric"] and all("fully-random" not in r[t] for t in NAT_TYPES[:3])
    assert "@cone" in r["full-cone"] and "@seen" in r["address-restricted"]
    assert "dnat" not in r["port-restricted"].replace("ct status dnat", "")
    with pytest.raises(ValueError, match="NAT type"):
        nat_rules("xnat", "cone", "172.16.1.2")
    with pytest.raises(ValueError, match="not behind a NAT"):
        NetnsLab("x", 3, Path("/nonexistent"), None, "nat", nat_types={"h3": "symmetric"})  # type: ignore[arg-type]


@pytest.mark.lab
def test_each_nat_type_filters_and_maps_as_defined(lab_factory):
    """h1..h4 behind a full-cone, address-restricted, port-restricted and symmetric NAT; A = the public relay
    host h5, B = the router (an outside address the hosts never sent to before the `stranger` probe)."""
    types = dict(zip(("h1", "h2", "h3", "h4"), NAT_TYPES, strict=True))
    lab = lab_factory(5, path="nat", nat_types=types)
    a = lab.relay
    assert a is lab.hosts[4] and not a.behind_nat
    measured = {}
    for i, h in enumerate(lab.hosts[:4], start=1):
        assert h.nat_type == types[h.name]
        measured[h.nat_type] = probe_nat(lab, h, a, lab.router.netns, router_ip(i))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "nat-types.json").write_text(json.dumps(measured, indent=2) + "\n")
    cols = list(EXPECTED["full-cone"])
    print("\n" + f"{'NAT type':20}" + "".join(f"{c:>14}" for c in cols) + "   public ports (inside, A, B)")
    for t, obs in measured.items():
        p = obs["ports"]
        print(
            f"{t:20}"
            + "".join(f"{'yes' if obs[c] else 'no':>14}" for c in cols)
            + f"   {p['inside']}, {p['seen_by_A']}, {p['seen_by_B']}"
        )
    for t in NAT_TYPES:
        assert {c: measured[t][c] for c in cols} == EXPECTED[t], t
        if t != "symmetric":  # endpoint-independent mapping here also preserves the port
            assert measured[t]["ports"]["seen_by_A"] == INSIDE_PORT, t


@pytest.mark.slow  # 4-8 s (the CLI or a report in a subprocess): out of the fast lane
def test_matrix_row_is_a_probed_fact_and_a_report_table(tmp_path, monkeypatch):
    """A VPN's matrix row, stored as the `nat_matrix` probe, becomes the value of its feature record's fact and
    a row of the report's NAT-traversal table (cells coloured by result)."""
    from synthetic_runs import make_run

    from tunnelbench.analysis.analyze import analyze, load_run
    from tunnelbench.report.full import _nat_matrix, render_report
    from tunnelbench.report.reading import Reading
    from tunnelbench.store import DB_NAME, Store
    from tunnelbench.vpns.features import record, save_probe

    monkeypatch.setenv("TUNNELBENCH_PROBES", str(tmp_path / "probes.json"))
    row = {"full-cone x full-cone": "direct (98% direct)", "symmetric x symmetric": "relayed (0% direct)"}
    save_probe("fastvpn", "nat_matrix", True, "h1 x h2 NAT types", "1.0", value=row)
    feats = record("fastvpn", {})
    assert feats["nat_matrix"]["value"] == row and feats["nat_matrix"]["probed"]
    assert feats["nat_matrix"]["source"].startswith("probe: h1 x h2 NAT types")
    d = make_run(tmp_path, "20260101-000000-tbnatm", {"internal": (2000, 40), "fastvpn": (900, 20)}, n=3)
    Store(d / DB_NAME).set_vpn(d.name, "fastvpn", "1.0", "ok", settings={"features": feats})
    a = analyze([load_run(d)])
    m = _nat_matrix(a)
    assert m is not None and m["pairs"] == list(row)
    assert [r["variant"] for r in m["rows"]] == ["fastvpn"]
    assert m["rows"][0]["cells"] == [("direct (98% direct)", "direct"), ("relayed (0% direct)", "relayed")]
    html = render_report(Reading.of(a))
    table = html[html.index('id="nat-matrix"') :]
    table = table[: table.index("</table>")]
    assert "<th>symmetric x symmetric</th>" in table and '<td class="ok">direct (98% direct)</td>' in table


def test_matrix_classification():
    from tunnelbench.sweeps.natmatrix import classify

    assert (
        classify(80.0, 1.0) == "direct"
        and classify(20.0, 1.0) == "relayed"
        and classify(50.0, 1.0) == "mixed"
    )
    assert classify(None, 1.0) == "failed" and classify(99.0, 0.4) == "failed"


SAMPLE_VPN = "n2n"  # ~8 s a cell; `tunnelbench nat-matrix` runs every NAT-capable VPN and pair
SAMPLE = {("full-cone", "full-cone"): "direct", ("symmetric", "port-restricted"): "relayed"}


@pytest.mark.lab
@pytest.mark.long  # 15 s; the matrix's rows and classification: the unit tests above, each NAT type: the lab test
def test_traversal_matrix_sample(tmp_path):
    """A sample of the matrix in the default suite: n2n punches straight through two full-cone NATs, and has to
    go through its supernode (the relay host) when a symmetric NAT meets a port-restricted one: the symmetric
    side's port towards its peer is new (unknown to the supernode), and the port-restricted side drops it."""
    from conftest import lab_missing

    from tunnelbench.catalog import DRIVERS
    from tunnelbench.sweeps.natmatrix import run_matrix, table_rows

    why = lab_missing()
    if why:
        pytest.skip(why)
    a = DRIVERS[SAMPLE_VPN].availability()
    if not a.ok:
        pytest.skip(f"{SAMPLE_VPN}: {a.reason}")
    out = ARTIFACTS / "nat-matrix-sample.json"
    result = run_matrix([SAMPLE_VPN], list(SAMPLE), tmp_path, out, record=False)
    head, rows = table_rows(result)
    print("\n" + " | ".join(head) + "\n" + "\n".join(" | ".join(r) for r in rows))
    cells = result["vpns"][SAMPLE_VPN]["cells"]
    for (t1, t2), want in SAMPLE.items():
        c = cells[f"{t1} x {t2}"]
        assert c["result"] == want, c
        assert not c.get("teardown"), c


def test_scenario_nat_type_fields():
    from pydantic import ValidationError

    from tunnelbench.lab.spec import LabCfg

    c = LabCfg(hosts=3, path="nat", nat_type="symmetric", nat_types={"h2": "full-cone"})
    assert (c.nat_type, c.nat_types) == ("symmetric", {"h2": "full-cone"})
    assert LabCfg(hosts=3, path="nat").nat_type == "port-restricted"  # the lab's NAT before NAT types
    with pytest.raises(ValidationError, match="only used with path"):
        LabCfg(hosts=3, nat_type="symmetric")
    with pytest.raises(ValidationError, match="not a host behind a NAT"):
        LabCfg(hosts=3, path="nat", nat_types={"h3": "symmetric"})  # h3 is the (public) relay host
    with pytest.raises(ValidationError):
        LabCfg(hosts=3, path="nat", nat_type="cone")


def test_concurrent_probe_writers_lose_no_entry(tmp_path, monkeypatch):
    """Eight processes recording probes at once: every entry is in the file afterwards (without the lock, a
    read-modify-write drops the others'), and no temporary file is left beside it."""
    import json
    import subprocess
    import sys

    path = tmp_path / "probes.json"
    code = (
        "import sys; from tunnelbench.vpns.features import save_probe\n"
        "for i in range(20): save_probe(f'vpn{sys.argv[1]}', f'p{i}', True, 'x')\n"
    )
    env = {**os.environ, "TUNNELBENCH_PROBES": str(path)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], env=env) for n in range(8)]
    assert [p.wait(60) for p in procs] == [0] * 8
    data = json.loads(path.read_text())
    assert {v: len(e) for v, e in data.items()} == {f"vpn{n}": 20 for n in range(8)}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["probes.json", "probes.json.lock"]
