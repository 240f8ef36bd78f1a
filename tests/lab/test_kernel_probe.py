"""The kernel feature probe's parsing, and availability decided by the kernel of the host that runs the VPN
(an SSH host's answer, not this machine's), against hand-made probe outputs."""

from __future__ import annotations

from types import SimpleNamespace

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab import kernel


def _out(missing: dict[str, str]) -> str:
    return "".join(f"{f}\t{missing.get(f, 'ok')}\n" for f in kernel.FEATURES)


def test_parse_reads_each_feature_and_the_kernels_words():
    got = kernel.parse(
        _out({"gre": "Error: Unknown device type.", "esp": "Error: Requested AEAD algorithm not found."})
    )
    assert got["gre"] == "Error: Unknown device type."
    assert got["esp"] == "Error: Requested AEAD algorithm not found."
    assert got["geneve"] is None and got["netem"] is None
    # a probe cut short says so for what it never reached, instead of claiming the feature
    short = kernel.parse("veth\tok\ntun\tok\n")
    assert short["veth"] is None and short["gre"] == "not probed (the probe stopped early)"
    assert set(kernel.parse("netns\tip netns add failed\n").values()) == {"cannot probe: ip netns add failed"}


class _Remote:
    """An SSH host whose kernel answers with a fixed probe output; counts the probes it was asked for."""

    remote = True

    def __init__(self, name: str, out: str):
        self.name, self.out, self.calls = name, out, 0

    def run(self, argv, check=True, **kw):
        self.calls += 1
        assert argv[:2] == ["sh", "-c"] and "ip netns add" in argv[2]
        return SimpleNamespace(stdout=self.out, stderr="", returncode=0)


def test_availability_follows_the_target_hosts_kernel():
    full = _Remote("full-kernel", _out({}))
    no_gre = _Remote(
        "no-gre", _out({"gre": "Error: Unknown device type.", "gretap": "Error: Unknown device type."})
    )
    assert DRIVERS["gre"].impossible_on([full]) is None
    why = DRIVERS["gre"].impossible_on([full, no_gre])
    assert why == "no-gre's kernel has no GRE (module ip_gre): Error: Unknown device type."
    assert DRIVERS["geneve"].impossible_on([no_gre]) is None
    assert "GREtap" in DRIVERS["macsec"].impossible_on([no_gre])
    # probed once per host and process, not once per driver
    DRIVERS["ipip"].impossible_on([full])
    assert full.calls == 1
    # a driver that needs no kernel feature never asks
    assert DRIVERS["internal"].impossible_on([no_gre]) is None and no_gre.calls == 1
