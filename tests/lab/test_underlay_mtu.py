"""Underlay MTU (issue 15 item 6, seeds 000 and 002): `lab.underlay_mtu` sets every lab link, and
`internal@mtuNNNN` is a second no-VPN baseline at another MTU in the same run, its own row, never a
contender. The reference is the MSS the kernel chose for iperf3's connection (MTU - 40 - 12 bytes of TCP
timestamps), which the product does not compute."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import lab_missing, tb

from tunnelbench.catalog import resolve
from tunnelbench.lab.host import THIS_MACHINE
from tunnelbench.lab.make import make_lab
from tunnelbench.lab.spec import LabCfg
from tunnelbench.vpns.internal import Internal


def test_internal_mtu_variants_resolve_and_refuse_what_is_not_an_mtu():
    c = resolve("internal@mtu1450")
    assert issubclass(c, Internal) and c.key == "internal@mtu1450" and c.underlay_mtu == 1450
    assert c is resolve("internal@mtu1450")  # the same spec, the same class
    assert c.version(THIS_MACHINE).endswith("(underlay MTU 1450)") and Internal.underlay_mtu is None
    for bad in ("internal@mtu100", "internal@mtu9001", "internal@debian", "internal@1.0.0"):
        with pytest.raises(ValueError, match="mtuNNNN"):
            resolve(bad)


def test_underlay_mtu_is_refused_over_ssh(tmp_path):
    cfg = LabCfg(backend="ssh", inventory=str(tmp_path / "inv.yml"), underlay_mtu=9000)
    (tmp_path / "inv.yml").write_text("all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n")
    with pytest.raises(ValueError, match="lab.underlay_mtu needs the namespace lab"):
        make_lab(cfg, "tbx", tmp_path, None)  # type: ignore[arg-type]


SCENARIO = """
name = "mtu"
vpns = ["internal@mtu1450", "internal", "internal@mtu1230"]
[run]
repetitions = 1
retries = 0
drift_check_s = 0
order = "block"
[lab]
hosts = 2
underlay_mtu = 9000
[[workloads]]
name = "tcp"
duration_s = 1
omit_s = 0
"""


@pytest.mark.lab
def test_each_baseline_runs_at_its_mtu_and_the_lab_mtu_comes_back(tmp_path):
    why = lab_missing()
    if why:
        pytest.skip(why)
    scen = tmp_path / "s.toml"
    scen.write_text(SCENARIO)
    env = {"TUNNELBENCH_REGISTRY": str(tmp_path / "registry")}
    res = tb("run", str(scen), "--results", str(tmp_path / "r"), "--no-html", columns=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "r").iterdir()
    db = sqlite3.connect(run_dir / "results.sqlite")
    mss = {}
    for vpn, adir in db.execute("SELECT vpn, artifact_dir FROM \"case\" WHERE status = 'ok'"):
        mss[vpn] = json.loads((Path(adir) / "tcp-client.json").read_text())["start"]["tcp_mss_default"]
    # 40 bytes of IPv4 + TCP headers and 12 of timestamps; plain internal ran after internal@mtu1450 (block
    # order as listed) and still saw the lab's 9000: the variant's MTU was put back
    assert mss == {"internal@mtu1450": 1450 - 52, "internal": 9000 - 52, "internal@mtu1230": 1230 - 52}
    env_rows = dict(db.execute("SELECT key, value FROM environment"))
    assert env_rows["lab.underlay_mtu"] == "9000"
    # every baseline is a row, none a contender: no tiers in the headline
    head = res.stdout[: res.stdout.index("median over repetitions")]
    for v in ("internal@mtu1450 (no VPN)", "internal (no VPN)", "internal@mtu1230 (no VPN)"):
        assert v in head
    assert "T1" not in head and head.index("internal (no VPN)") < head.index("internal@mtu1450 (no VPN)")
