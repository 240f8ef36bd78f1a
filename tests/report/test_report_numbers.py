"""The report's numbers against references it did not compute, on a hand-made interleaved run (repetition =
round) with known samples: every p, Holm p, Cliff's delta, median, CI and tier the HTML report, the Markdown
summary and the terminal headline show. References: statsmodels' OLS (`y ~ C(vpn) + C(round)` on log values,
pairwise contrasts by t_test) and multipletests(method="holm") for the within-round model, scikit-posthocs'
Conover test after Friedman for the rank method, scipy's Mann-Whitney U for a block-order run, scipy's
bootstrap (BCa for a cell's median and mean, percentile for the ratio to the baseline) drawn from the same
random stream as the report (its fixed seed, its resample count), numpy for the descriptive statistics.

And one tiering everywhere (issue 44): a VPN's tier is the same in the terminal headline, the HTML headline,
the Markdown headline, the Markdown per-metric table, the HTML card and the colour of the card's plot."""

from __future__ import annotations

import html as htmllib
import io
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs as sp
import statsmodels.formula.api as smf
from rich.console import Console
from scipy import stats as sst
from stat_refs import ratio_ref
from statsmodels.stats.multitest import multipletests
from synthetic_runs import hand_store
from test_report import assert_shown

from tunnelbench.analysis.analyze import analyze, load_run
from tunnelbench.analysis.stats import N_RESAMPLES, SEED
from tunnelbench.core.results import Outcome, Sample
from tunnelbench.report import plots
from tunnelbench.report.full import render_markdown, render_report
from tunnelbench.report.reading import Reading
from tunnelbench.report.terminal import print_summary
from tunnelbench.store import DB_NAME

RUN = "20261128-000000-tbnums"
BASE = "internal"
VPNS = (BASE, "alpha", "bravo", "charlie", "delta")
ROUNDS = 8
ALPHA = 0.05
CEILING = (
    0.9  # docs/results.md: a rate whose ratio to the no-VPN baseline reaches 0.9 (CI) is the lab's ceiling
)
# every round slows every VPN alike (a load in rounds 5-7): within rounds it cancels
DRIFT = np.array([1.0, 1.02, 0.97, 1.0, 0.62, 0.6, 0.65, 0.98])


@dataclass(frozen=True)
class Col:
    workload: str
    metric: str
    unit: str
    better: str
    values: dict[str, list[float]]  # vpn -> value per round (round r at index r - 1)

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.metric}"  # the workload label is the workload's name here


def _column(
    base: dict[str, float], sd: float, rate: bool, rng: np.random.Generator
) -> dict[str, list[float]]:
    """Lognormal noise around each VPN's level, times the round's drift (a rate falls, a time rises)."""
    f = DRIFT if rate else 1 / DRIFT
    return {
        v: [float(b * f[r] * math.exp(rng.normal(0, sd))) for r in range(ROUNDS)] for v, b in base.items()
    }


def columns() -> list[Col]:
    rng = np.random.default_rng(20261128)
    # delta is the baseline's rate (the lab's ceiling: not ranked); alpha and bravo 0.5% apart (one tier)
    tcp = _column({BASE: 2000, "alpha": 900, "bravo": 896, "charlie": 520, "delta": 1990}, 0.02, True, rng)
    ping = _column(
        {BASE: 0.05, "alpha": 0.30, "bravo": 0.42, "charlie": 0.60, "delta": 0.33}, 0.03, False, rng
    )
    # one wild reading per VPN, each in another round: residuals that are not normal (the rank method)
    for v, r, k in (("alpha", 1, 6), ("bravo", 3, 6), ("charlie", 5, 5), ("delta", 7, 7)):
        ping[v][r] *= k
    connect = _column(
        {BASE: 0.004, "alpha": 0.10, "bravo": 0.21, "charlie": 0.104, "delta": 0.40},
        0.04,
        False,
        np.random.default_rng(1),
    )
    return [
        Col("tcp", "goodput_mbps", "Mbit/s", "higher", tcp),
        Col("ping", "rtt_p50_ms", "ms", "lower", ping),
        Col("connect", "connect_s", "s", "lower", connect),
    ]


def make_run(root: Path, order: str = "interleaved") -> Path:
    with hand_store(root, VPNS, run_id=RUN) as (st, run_dir):
        if order != "interleaved":
            st.set_env(RUN, {"run.order": order})
        for r in range(ROUNDS):
            for v in VPNS:
                for c in columns():
                    adir = run_dir / "cases" / v / c.workload / f"r{r + 1}"
                    adir.mkdir(parents=True)
                    cid = st.start_case(
                        RUN, v, "baseline", c.workload, c.workload, {}, r + 1, 0, "h1", "h2", adir
                    )
                    st.finish_case(cid, "ok", Outcome(samples=[Sample(c.metric, c.values[v][r], c.unit)]))
    return run_dir


# -- the references ------------------------------------------------------------------------------------------
def bca(x: list[float], stat: Any) -> tuple[float, float]:
    """scipy's BCa interval, drawn as the report draws (its seed and resample count: the same resamples)."""
    r = sst.bootstrap(
        (np.asarray(x),), stat, method="BCa", n_resamples=N_RESAMPLES, rng=np.random.default_rng(SEED)
    )
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


def cliffs(x: list[float], y: list[float]) -> float:
    """Cliff's delta as the rank-biserial correlation: 2 U / (nx ny) - 1, U from scipy."""
    u = sst.mannwhitneyu(x, y, alternative="two-sided").statistic
    return float(2 * u / (len(x) * len(y)) - 1)


@dataclass
class Ref:
    """What one metric's report must show, worked out here."""

    col: Col
    ranked: list[str]  # the VPNs that take a tier (measured), in the report's order of variants
    limited: list[str]
    method: str  # "two-way" | "ranks" | "unpaired"
    p: dict[frozenset[str], float] = field(default_factory=dict)
    p_holm: dict[frozenset[str], float] = field(default_factory=dict)
    tier: dict[str, int] = field(default_factory=dict)


def two_way(vals: dict[str, list[float]]) -> tuple[dict[frozenset[str], float], float]:
    """Pairwise contrasts of `log y ~ C(vpn) + C(round)` (statsmodels OLS, t_test), and Shapiro-Wilk on its
    residuals."""
    rows = [(v, r, math.log(x)) for v, xs in vals.items() for r, x in enumerate(xs)]
    fit = smf.ols("y ~ 0 + C(v) + C(r)", pd.DataFrame(rows, columns=["v", "r", "y"])).fit()
    names = list(fit.params.index)
    p = {}
    for a, b in combinations(vals, 2):
        c = np.zeros(len(names))
        c[names.index(f"C(v)[{a}]")], c[names.index(f"C(v)[{b}]")] = 1.0, -1.0
        p[frozenset((a, b))] = float(fit.t_test(c).pvalue)
    return p, float(sst.shapiro(fit.resid).pvalue)


def ranks(vals: dict[str, list[float]]) -> dict[frozenset[str], float]:
    """Conover's test after Friedman (scikit-posthocs), rounds as blocks."""
    names = list(vals)
    m = sp.posthoc_conover_friedman(np.array([vals[v] for v in names]).T, p_adjust=None)
    return {
        frozenset((names[i], names[j])): float(m.iloc[i, j]) for i, j in combinations(range(len(names)), 2)
    }


def tiers_of(med: dict[str, float], better: str, sig: set[frozenset[str]]) -> dict[str, int]:
    """The tiers' definition (docs/results.md): the ranking by median, cut only where every VPN above the cut
    differs significantly from every VPN below it."""
    order = sorted(med, key=lambda v: -med[v] if better == "higher" else med[v])
    tier, t = {}, 1
    for k, v in enumerate(order):
        if k and all(frozenset((a, b)) in sig for a in order[:k] for b in order[k:]):
            t += 1
        tier[v] = t
    return tier


def reference(col: Col, paired: bool = True) -> Ref:
    vals = col.values
    limited = []
    if col.unit == "Mbit/s" and col.better == "higher":  # a rate: the baseline must be clearly above it
        limited = [v for v in VPNS if v != BASE and ratio_ref(vals[v], vals[BASE])[2] >= CEILING]
    ranked = [v for v in VPNS if v != BASE and v not in limited]
    sub = {v: vals[v] for v in ranked}
    if paired:
        p, shapiro_p = two_way(sub)
        method = "two-way"
        if shapiro_p < ALPHA:  # every round holds every VPN: the rank method applies
            p, method = ranks(sub), "ranks"
    else:
        p = {
            frozenset((a, b)): float(sst.mannwhitneyu(sub[a], sub[b]).pvalue) for a, b in combinations(sub, 2)
        }
        method = "unpaired"
    keys = list(p)
    holm = dict(zip(keys, multipletests([p[k] for k in keys], method="holm")[1], strict=True))
    sig = {k for k, ph in holm.items() if ph < ALPHA}
    tier = tiers_of({v: float(np.median(sub[v])) for v in ranked}, col.better, sig)
    return Ref(col, ranked, limited, method, p, {k: float(v) for k, v in holm.items()}, tier)


def assert_sig(text: str, want: float, sig: int, what: str) -> None:
    """text is want shown with `sig` significant digits (format .{sig}g or .{sig-1}e): within half a unit of
    the sig-th digit of the reference."""
    tol = 0.5 * 10 ** (math.floor(math.log10(abs(want))) - sig + 1) if want else 0.0
    assert abs(float(text) - want) <= tol * (1 + 1e-9), (
        f"{what}: the report shows {text}, the reference {want!r}"
    )


# -- the rendered views, read back ---------------------------------------------------------------------------
def cells(fragment: str) -> list[list[str]]:
    """The rows of an HTML table fragment as the text of their cells (tags stripped, entities decoded)."""
    return [
        [
            " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", c)).split())
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)
        ]
        for row in re.findall(r"<tr>(.*?)</tr>", fragment, re.S)
    ]


def card(page: str, key: str) -> tuple[list[list[str]], list[list[str]], str]:
    """An overview card: its ranking table's rows, its pairwise table's rows, its method line."""
    m = re.search(rf'<div class="card" data-family="{re.escape(key)}">(.*?)</div>', page, re.S)
    assert m, f"no card for {key}"
    body = m.group(1)
    ranking, _, rest = body.partition("</table>")
    pairs = rest.partition("<details>")[2]
    method = re.search(r"Compared by (.*?); smallest", rest, re.S)
    return cells(ranking)[1:], cells(pairs)[1:], method.group(1) if method else ""


HEAD_CELL = re.compile(r"^(?P<median>\S+)(?: \((?P<extra>[^)]*)\))?$")


def head_tier(text: str) -> str:
    """A headline cell's tier: "T2" -> "2", a limited cell's verdict ("instr."), "" for none."""
    m = HEAD_CELL.match(text)
    assert m, text
    extra = (m.group("extra") or "").split(", ")
    return next(
        (x[1:] for x in extra if re.fullmatch(r"T\d+", x)), next((x for x in extra if x.endswith(".")), "")
    )


def markdown_rows(md: str, header: str) -> Iterator[list[str]]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            return
        yield [c.strip() for c in line.strip().strip("|").split("|")]


@dataclass
class Views:
    page: str
    md: str
    terminal: str
    plot_tiers: dict[str, dict[str, str]]  # metric -> vpn -> the tier its plot's colour says


def render(run_dir: Path) -> Views:
    rd = Reading.of(analyze([load_run(run_dir)]))
    plot_tiers: dict[str, dict[str, str]] = {}
    real_to_svg = plots.to_svg

    def to_svg(fig: Any) -> str:  # the ranking plots' colours, read off the figure; no SVG drawn (seconds)
        for ax in fig.axes:
            if "colour = tier" in ax.get_title(loc="left"):
                labels = [t.get_text() for t in ax.get_yticklabels()]
                metric = ax.get_xlabel().split(" [")[0]
                for line in ax.lines:
                    if line.get_marker() == "o":
                        c = str(line.get_color()).lower()
                        tier = str(plots.TIER_COLORS.index(c) + 1) if c in plots.TIER_COLORS else ""
                        plot_tiers.setdefault(metric, {})[labels[int(line.get_ydata()[0])]] = tier
        plots.plt.close(fig)
        return "<svg></svg>"

    plots.to_svg = to_svg
    try:
        page = render_report(rd)
    finally:
        plots.to_svg = real_to_svg
    buf = io.StringIO()
    try:
        print_summary(rd, Console(file=buf, width=250, color_system=None))
        md = render_markdown(rd)
    finally:
        rd.close()
    return Views(page, md, buf.getvalue(), plot_tiers)


@pytest.fixture(scope="module")
def refs() -> dict[str, Ref]:
    """The references (no product code: the render is done by the test that checks it, so a mutation tool
    that maps product functions to the tests calling them maps them to that test)."""
    return {c.key: reference(c) for c in columns()}


def test_the_hand_made_run_exercises_every_case(refs):
    """The data holds what the checks below need: both within-round methods, a shared tier and a split, and a
    cell the baseline's ceiling keeps out of the ranking."""
    assert {r.method for r in refs.values()} == {"two-way", "ranks"}, {k: r.method for k, r in refs.items()}
    assert refs["tcp/goodput_mbps"].limited == ["delta"]
    tiers = [sorted(r.tier.values()) for r in refs.values()]
    assert any(len(set(t)) < len(t) for t in tiers) and any(len(set(t)) > 1 for t in tiers), tiers


def check_pairwise_tables(views: Views, refs: dict[str, Ref]) -> None:
    """Each card's pairwise table: p, p (Holm), significant, Cliff's delta, median A vs B."""
    for key, ref in refs.items():
        _, pairs, method = card(views.page, key)
        want_method = {"two-way": "two-way model", "ranks": "ranks within rounds"}[ref.method]
        assert method.startswith(want_method), (key, method)
        assert {frozenset(row[:2]) for row in pairs} == set(ref.p), (key, pairs)
        vals = ref.col.values
        for a, b, rel, delta_mag, p, p_holm, significant in pairs:
            delta = delta_mag.split()[0]
            k = frozenset((a, b))
            assert_sig(p, ref.p[k], 2, f"{key} {a} vs {b}: p")
            assert_sig(p_holm, ref.p_holm[k], 2, f"{key} {a} vs {b}: p (Holm)")
            assert significant == ("yes" if ref.p_holm[k] < ALPHA else "no"), (key, a, b, significant)
            assert_shown(
                delta.lstrip("+"), cliffs(vals[a], vals[b]), f"{key} {a} vs {b}: Cliff's delta", decimals=2
            )
            want_rel = 100 * (np.median(vals[a]) / np.median(vals[b]) - 1)
            assert_shown(
                rel.rstrip("%").lstrip("+"), want_rel, f"{key} {a} vs {b}: median A vs B", decimals=1
            )


def check_medians_cis_and_ratios(views: Views, refs: dict[str, Ref]) -> None:
    """Each card's and the Markdown table's median, its BCa CI, n and the ratio to the baseline with its CI."""
    md = {
        (r[0], f"{r[1]}/{r[2].split(' [')[0]}"): r
        for r in markdown_rows(views.md, "| VPN | workload | metric |")
    }
    for key, ref in refs.items():
        vals = ref.col.values
        rows, _, _ = card(views.page, key)
        assert {r[1] for r in rows} == set(VPNS), rows
        for _rank, vpn, _tier, median, ci, n, _cv, ratio in rows:
            x = vals[vpn]
            lo, hi = bca(x, np.median)
            assert n == str(ROUNDS)
            assert_shown(median, float(np.median(x)), f"{key} {vpn}: median")
            got_lo, got_hi = ci.strip("[]").split(", ")
            assert_shown(got_lo, lo, f"{key} {vpn}: median CI low")
            assert_shown(got_hi, hi, f"{key} {vpn}: median CI high")
            m_median, m_n, m_ratio = md[(vpn, key)][3], md[(vpn, key)][4], md[(vpn, key)][5]
            assert m_median == f"{median} {ci}" and m_n == n, (key, vpn, md[(vpn, key)])
            if vpn == BASE:
                assert ratio == "" and m_ratio == ""
                continue
            want = ratio_ref(x, vals[BASE])
            m = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", ratio)
            assert m and m_ratio == ratio, (key, vpn, ratio, m_ratio)
            for got, w, what in zip(
                m.groups(), want, ("ratio", "ratio CI low", "ratio CI high"), strict=True
            ):
                assert_sig(got, w, 3, f"{key} {vpn}: {what}")


def check_statistics_table(views: Views, refs: dict[str, Ref]) -> None:
    """The "All statistics" table: mean, median, sd, percentiles by numpy, both CIs by scipy."""
    section = views.page[views.page.index('id="stats"') :]
    section = section[: section.index("</table>")]
    rows = {(r[0], f"{r[2]}/{r[3].split(' [')[0]}"): r for r in cells(section)[1:]}
    for key, ref in refs.items():
        for vpn, x in ref.col.values.items():
            _v, _p, _lb, _m, _better, n, mean, median, sd, _cv, p5, p25, p75, p95, ci, mean_ci, *_ = rows[
                (vpn, key)
            ]
            a = np.asarray(x)
            assert n == str(ROUNDS)
            for got, want, what in (
                (mean, a.mean(), "mean"),
                (median, np.median(a), "median"),
                (sd, a.std(ddof=1), "sd"),
                (p5, np.percentile(a, 5), "p5"),
                (p25, np.percentile(a, 25), "p25"),
                (p75, np.percentile(a, 75), "p75"),
                (p95, np.percentile(a, 95), "p95"),
            ):
                assert_shown(got, float(want), f"{key} {vpn}: {what}")
            for text, stat, what in ((ci, np.median, "median CI"), (mean_ci, np.mean, "mean CI")):
                lo, hi = bca(x, stat)
                got_lo, got_hi = text.strip("[]").split(", ")
                assert_shown(got_lo, lo, f"{key} {vpn}: {what} low")
                assert_shown(got_hi, hi, f"{key} {vpn}: {what} high")


def view_tiers(views: Views, refs: dict[str, Ref]) -> dict[str, dict[tuple[str, str], str]]:
    """Every view's tier of every (metric, VPN): "1", "2", ... for a ranked VPN, the verdict for a limited one
    ("instr."), "" for the baseline."""
    by_label = {r.col.workload: key for key, r in refs.items()}
    out: dict[str, dict[tuple[str, str], str]] = {}
    # the terminal headline: box-drawn, the labels on the header's first line, a row per VPN (its version on
    # the next line)
    term = out.setdefault("terminal headline", {})
    lines = views.terminal.splitlines()
    labels = [c.strip() for c in next(x for x in lines if x.startswith("┃")).strip("┃").split("┃")[1:]]
    for line in lines:
        parts = [c.strip() for c in line.strip("│").split("│")] if line.startswith("│") else []
        if parts and parts[0].removesuffix(" (no VPN)") in VPNS:
            for lb, text in zip(labels, parts[1:], strict=True):
                term[(by_label[lb], parts[0].removesuffix(" (no VPN)"))] = head_tier(text)
    # the HTML headline: one row per VPN, a column per label
    table = re.search(r'<table class="headline"[^>]*>(.*?)</table>', views.page, re.S)
    assert table
    rows = cells(table.group(1))
    labels = [c.split()[0] for c in rows[0][1:]]
    page_head = out.setdefault("HTML headline", {})
    for row in rows[1:]:
        name = row[0].split()[0]
        for lb, text in zip(labels, row[1:], strict=True):
            page_head[(by_label[lb], name)] = head_tier(text)
    # the Markdown headline and per-metric table
    md_head = out.setdefault("Markdown headline", {})
    hdr = next(line for line in views.md.splitlines() if line.startswith("| VPN | tcp"))
    labels = [c.strip().split()[0] for c in hdr.strip("| ").split("|")[1:]]
    for row in markdown_rows(views.md, "| VPN | tcp"):
        for lb, text in zip(labels, row[1:], strict=True):
            md_head[(by_label[lb], row[0].split()[0])] = head_tier(text)
    md_full = out.setdefault("Markdown per-metric table", {})
    for row in markdown_rows(views.md, "| VPN | workload | metric |"):
        md_full[(f"{row[1]}/{row[2].split(' [')[0]}", row[0])] = row[6]
    # the HTML card's tier column ("ref" for the baseline) and its plot's colour
    html_card = out.setdefault("HTML card", {})
    plot = out.setdefault("HTML card plot", {})
    for key, ref in refs.items():
        for row in card(views.page, key)[0]:
            html_card[(key, row[1])] = "" if row[2] == "ref" else row[2]
        for vpn, tier in views.plot_tiers[ref.col.metric].items():
            plot[(key, vpn)] = tier  # a colour says a tier or none: no verdict
    return out


def check_every_view_shows_each_vpn_in_the_same_tier(views: Views, refs: dict[str, Ref]) -> None:
    """Issue 44: two views of one run that disagree on a VPN's tier leave the reader without a verdict. Every
    view against every other, then against the tiers worked out here from the references' Holm p; a cell kept
    out of the ranking says why (its verdict) wherever it is written."""
    got = view_tiers(views, refs)
    want = {}
    for key, ref in refs.items():
        for vpn in VPNS:
            want[(key, vpn)] = (
                str(ref.tier[vpn]) if vpn in ref.tier else ("instr." if vpn in ref.limited else "")
            )
    for name, tiers in got.items():
        assert set(tiers) == set(want), (name, sorted(set(want) ^ set(tiers)))

    def tier(t: str) -> str:
        return t if t.isdigit() else "none"

    disagree = [
        f"{key} {vpn}: " + ", ".join(f"{name} {tiers[(key, vpn)] or 'none'}" for name, tiers in got.items())
        for key, vpn in sorted(want)
        if len({tier(tiers[(key, vpn)]) for tiers in got.values()}) > 1
    ]
    assert disagree == [], "views disagree on a VPN's tier:\n" + "\n".join(disagree)
    wrong = {kv: (got["HTML card"][kv], t) for kv, t in want.items() if tier(got["HTML card"][kv]) != tier(t)}
    assert wrong == {}, f"(shown, reference) tiers: {wrong}"
    for name, tiers in got.items():
        if name != "HTML card plot":
            verdicts = {kv: t for kv, t in tiers.items() if not t.isdigit()}
            assert verdicts == {kv: t for kv, t in want.items() if not t.isdigit()}, (name, verdicts)


def check_leader_lines(views: Views, refs: dict[str, Ref]) -> None:
    """The headline's leader line per column quotes the Holm p of the leader against the runner-up."""
    for key, ref in refs.items():
        med = {v: float(np.median(ref.col.values[v])) for v in ref.ranked}
        best, second = sorted(med, key=lambda v: -med[v] if ref.col.better == "higher" else med[v])[:2]
        label = key.split("/")[0]
        line = next(x for x in views.md.splitlines() if re.match(rf"- {label}[ :]", x) and " Holm" in x)
        got = re.search(r"p = (\S+), Holm", line)
        assert got and best in line and second in line, line
        assert_sig(got.group(1), ref.p_holm[frozenset((best, second))], 2, f"{key}: leader line p")


def test_every_number_and_tier_the_report_shows_matches_its_reference(tmp_path, refs):
    """One render of the interleaved run (the HTML page, the Markdown summary, the terminal headline), every
    check on it in turn."""
    views = render(make_run(tmp_path))
    check_pairwise_tables(views, refs)
    check_medians_cis_and_ratios(views, refs)
    check_statistics_table(views, refs)
    check_every_view_shows_each_vpn_in_the_same_tier(views, refs)
    check_leader_lines(views, refs)


def test_a_block_order_run_is_compared_by_mann_whitney(tmp_path):
    """Without rounds (block order) the pairs are unpaired: scipy's Mann-Whitney U (exact for 8 vs 8 without
    ties), Holm, and the tiers that follow, in the card."""
    views = render(make_run(tmp_path, order="block"))
    for col in columns():
        ref = reference(col, paired=False)
        rows, pairs, method = card(views.page, col.key)
        assert method.startswith("Mann-Whitney U (unpaired)"), method
        for a, b, _rel, delta_mag, p, p_holm, _sig in pairs:
            delta = delta_mag.split()[0]
            k = frozenset((a, b))
            assert_sig(p, ref.p[k], 2, f"{col.key} {a} vs {b}: p")
            assert_sig(p_holm, ref.p_holm[k], 2, f"{col.key} {a} vs {b}: p (Holm)")
            assert_shown(delta.lstrip("+"), cliffs(col.values[a], col.values[b]), "Cliff's delta", decimals=2)
        shown = {r[1]: r[2] for r in rows if r[1] in ref.tier}
        assert shown == {v: str(t) for v, t in ref.tier.items()}, (col.key, shown, ref.tier)


def test_the_store_holds_what_the_references_read(tmp_path):
    """The references read the hand-made values, not the store: the store must hold exactly them."""
    import sqlite3

    run_dir = make_run(tmp_path)
    con = sqlite3.connect(f"file:{run_dir / DB_NAME}?mode=ro", uri=True)
    rows = con.execute(
        'SELECT c.vpn, c.label, c.repetition, m.value FROM metric m JOIN "case" c ON c.id = m.case_id'
    ).fetchall()
    con.close()
    want = {(v, c.workload, r + 1): c.values[v][r] for c in columns() for v in VPNS for r in range(ROUNDS)}
    assert {(v, lb, r): x for v, lb, r, x in rows} == want


def test_the_markdown_summarys_scaling_efficiency_and_failed_cases(tmp_path):
    """The summary's derived lines against numpy and scipy on the stored samples (read with sqlite3), and its
    list of failed cases against the store."""
    import sqlite3

    from synthetic_runs import make_run as synthetic_run

    d = synthetic_run(
        tmp_path,
        "20260101-000000-tbmdsu",
        {"internal": (2000, 40), "fastvpn": (900, 20)},
        n=4,
        fail="fastvpn",
    )
    con = sqlite3.connect(f"file:{d / DB_NAME}?mode=ro", uri=True)
    rows = con.execute(
        'SELECT c.id, c.vpn, c.label, m.name, m.host, m.value FROM metric m JOIN "case" c ON c.id = m.case_id '
        "WHERE c.status = 'ok'"
    ).fetchall()
    failed = con.execute(
        "SELECT vpn, profile, label, repetition, status, error FROM \"case\" WHERE status != 'ok'"
    ).fetchall()
    con.close()
    per_case: dict[int, dict] = {}
    for cid, vpn, label, name, host, value in rows:
        per_case.setdefault(cid, {"vpn": vpn, "label": label})[(name, host)] = value

    def goodput(vpn: str, label: str) -> list[float]:
        return [
            c[("goodput_mbps", None)] for c in per_case.values() if (c["vpn"], c["label"]) == (vpn, label)
        ]

    md = render_markdown(Reading.of(analyze([load_run(d)])))
    line = next(x for x in md.splitlines() if x.startswith("Parallel scaling"))
    for vpn in ("internal", "fastvpn"):
        p4, one = goodput(vpn, "tcp-p4"), goodput(vpn, "tcp")
        r, lo, hi = ratio_ref(p4, one)
        assert f"{vpn} tcp-p4 @ baseline: {r:.2f} [{lo:.2f}, {hi:.2f}]" in line, line
    line = next(x for x in md.splitlines() if x.startswith("CPU efficiency"))
    for label in ("tcp", "tcp-p4"):
        eff = [
            c[("goodput_mbps", None)] / ((c[("daemon_cpu_pct", "h1")] + c[("daemon_cpu_pct", "h2")]) / 100)
            for c in per_case.values()
            if (c["vpn"], c["label"]) == ("fastvpn", label)
        ]
        m = re.search(rf"fastvpn {label} @ baseline: (\S+) \[(\S+), (\S+)\]", line)
        assert m, line
        for got, want, what in zip(
            m.groups(), (np.median(eff), *bca(eff, np.median)), ("median", "lo", "hi"), strict=True
        ):
            assert_shown(got, float(want), f"efficiency {label} {what}")
    assert "internal" not in line  # no daemon: no efficiency
    (vpn, profile, label, rep, status, error) = failed[0]
    assert len(failed) == 1 and f"{len(failed)} case(s) failed or were skipped:" in md
    assert f"- {vpn} · {profile} · {label} rep {rep}: {status}: {error}" in md.splitlines()
