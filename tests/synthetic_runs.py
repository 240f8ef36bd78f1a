"""Build small stored runs from synthetic samples (no lab needed) for the analysis, report and compare tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from tunnelbench.core.results import Outcome, Sample, Series
from tunnelbench.store import DB_NAME, Store
from tunnelbench.workloads.tcp import TcpParams

SCENARIO = 'name = "synthetic"\nvpns = ["internal", "fastvpn", "slowvpn"]\n'


@contextmanager
def hand_store(
    root: Path, vpns: tuple[str, ...] = ("vpnA",), scenario: str = 'name = "hand-made"\n', run_id: str = "r1"
) -> Iterator[tuple[Store, Path]]:
    """A store for a hand-made run `run_id` under root/run_id with `vpns` ok (version "1"); the caller adds
    its cases; the run is ended and the store closed on exit."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(run_id, "tbhand", scenario, "0.1.0")
    for v in vpns:
        st.set_vpn(run_id, v, "1", "ok")
    try:
        yield st, run_dir
    finally:
        st.end_run(run_id, "ok")
        st.close()


def make_run(
    root: Path,
    run_id: str,
    goodput: dict[str, tuple[float, float]],
    n: int = 8,
    seed: int = 1,
    profile: str = "baseline",
    version: str = "1.0",
    fail: str | None = None,
    extra_label: bool = True,
) -> Path:
    """A run folder with tcp (and tcp-p4, ping) cases: goodput per VPN ~ Normal(mean, sd), n repetitions.
    `fail` names a VPN that gets one failed case with an error.txt and a daemon log."""
    rng = np.random.default_rng(seed)
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    st = Store(run_dir / DB_NAME)
    st.begin_run(run_id, run_id[-6:], SCENARIO, "0.1.0")
    st.set_env(
        run_id,
        {
            "kernel": "6.1-test",
            "cpu_count": 2,
            "calibration.base": {"one_way_ms": 0.02},
            "calibration.edge": {
                "profile": "edge",
                "backend": "netem",
                "summary": "rate 100 Mbit/s",
                "ok": True,
                "checks": [
                    {
                        "quantity": "TCP goodput",
                        "unit": "Mbit/s",
                        "configured": 100.0,
                        "measured": 94.0,
                        "detail": "90-100%",
                        "ok": True,
                    }
                ],
            },
        },
    )
    for vpn, (mean, sd) in goodput.items():
        st.set_vpn(run_id, vpn, version if vpn != "internal" else "kernel", "ok")
        # (label, workload, factor, streams): the parameters stored as the runner stores them
        labels = (
            [("tcp", "tcp", 1.0, 1), ("tcp-p4", "tcp", 1.6, 4)] if extra_label else [("tcp", "tcp", 1.0, 1)]
        )
        for rep in range(1, n + 1):
            for label, wl, factor, streams in labels:
                adir = run_dir / "cases" / vpn / profile / label / f"r{rep}a0"
                adir.mkdir(parents=True)
                params = TcpParams(streams=streams).model_dump()
                cid = st.start_case(run_id, vpn, profile, wl, label, params, rep, 0, "h1", "h2", adir)
                g = max(1.0, rng.normal(mean, sd)) * factor
                out = Outcome(
                    samples=[
                        Sample("goodput_mbps", g, "Mbit/s"),
                        Sample("retransmit_rate", abs(rng.normal(0.01, 0.002)), "ratio"),
                    ],
                    series=[
                        Series(
                            "goodput_mbps",
                            "Mbit/s",
                            [(t + 1.0, g * (1 + 0.05 * rng.normal())) for t in range(5)],
                        )
                    ],
                )
                if vpn != "internal":
                    out.samples += [
                        Sample("daemon_cpu_pct", 40 + 10 * rng.random(), "%", "h1"),
                        Sample("daemon_cpu_pct", 35 + 10 * rng.random(), "%", "h2"),
                        Sample("daemon_rss_mb", 20.0, "MiB", "h1"),
                        Sample("daemon_rss_mb", 22.0, "MiB", "h2"),
                    ]
                st.finish_case(cid, "ok", out)
            if extra_label:
                adir = run_dir / "cases" / vpn / profile / "ping" / f"r{rep}a0"
                adir.mkdir(parents=True)
                cid = st.start_case(run_id, vpn, profile, "ping", "ping", {}, rep, 0, "h1", "h2", adir)
                base = 0.1 if vpn == "internal" else 0.3 + 0.1 * len(vpn) / 10
                rtts = base + rng.exponential(0.05, 50)
                out = Outcome(
                    samples=[
                        Sample("rtt_p50_ms", float(np.median(rtts)), "ms"),
                        Sample("rtt_p99_ms", float(np.percentile(rtts, 99)), "ms"),
                        Sample("ping_loss_pct", 0.0, "%"),
                        Sample("added_latency_p50_ms", float(rng.normal(2.0, 0.1)), "ms"),
                    ],
                    series=[Series("rtt_ms", "ms", [(0.01 * i, float(r)) for i, r in enumerate(rtts)])],
                )
                st.finish_case(cid, "ok", out)
        if vpn == fail:
            adir = run_dir / "cases" / vpn / profile / "tcp" / f"r{n}a1"
            (adir / "daemon-logs").mkdir(parents=True)
            (adir / "error.txt").write_text(
                "Traceback (most recent call last):\nWorkloadError: iperf3 timed out\n"
            )
            (adir / "daemon-logs" / "h1-daemon.log").write_text(
                "handshake did not complete after 5 seconds\n"
            )
            cid = st.start_case(run_id, vpn, profile, "tcp", "tcp", {}, n, 1, "h1", "h2", adir)
            st.finish_case(cid, "failed", error="WorkloadError: iperf3 timed out")
    st.end_run(run_id, "ok")
    st.close()
    return run_dir
