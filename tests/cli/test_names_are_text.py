"""Names from files and stores are text: on the terminal never rich markup (`[/bold] x` raised MarkupError in
compare, doctor, export --out) and never control codes (an OSC or CSI sequence in a stored VPN name reached
the terminal), in Markdown never HTML or a link (report.md carried a stored name's <img onerror=...>)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.table import Table
from rich.text import Text
from synthetic_runs import make_run

# a stored VPN name with markup, an OSC sequence (retitles a terminal), a CSI one (clears it) and a C1 CSI
NAME = "[/bold] \x1b]0;pwned\x07vpn\x1b[2J\x9b"
SEEN = r"[/bold] \x1b]0;pwned\x07vpn\x1b[2J\x9b"  # how the terminal shows it


def terminal_codes(out: str) -> list[str]:
    """Every control sequence in `out` that is not one of rich's own colour codes (ESC [ digits ; m)."""
    return re.findall(r"\x1b(?!\[[0-9;]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]", out)


def test_a_name_is_printed_as_written_and_no_control_code_reaches_the_terminal():
    from tunnelbench.report.fmt import Terminal

    buf = io.StringIO()
    con = Terminal(file=buf, width=300, force_terminal=True, color_system="standard", highlight=False)
    t = Table(title=f"plan: {NAME}")
    t.add_column("VPN")
    t.add_column("detail")
    t.add_row(NAME, Text(f"built from a name: {NAME}", style="red"))
    con.print(t)
    con.print(NAME, ":smile: [link=https://example.com]x[/link]")
    out = buf.getvalue()
    assert terminal_codes(out) == []
    assert out.count(SEEN) == 3  # the title, the cell and the line: shown, escapes visible
    assert "[link=https://example.com]x[/link]" in out and ":smile:" in out  # no markup, no emoji
    assert "built from a name: [/bold] ]0;pwnedvpn[2J" in out  # a Text keeps its measured width: dropped
    assert "\x1b[31m" in out  # style still comes from Text


def test_a_two_line_column_title_keeps_both_lines():
    # the headline's column titles are "tcp\ngoodput Mbit/s": the line break is layout, not a control code
    from tunnelbench.report.fmt import Terminal

    buf = io.StringIO()
    t = Table()
    t.add_column("VPN")
    t.add_column("tcp\ngoodput Mbit/s", justify="right")
    t.add_row("a", "1")
    Terminal(file=buf, width=80).print(t)
    lines = buf.getvalue().splitlines()
    assert any(line.rstrip("┃ ").endswith("tcp") for line in lines)
    assert any("goodput Mbit/s" in line for line in lines)


def test_shown_writes_out_every_control_character():
    from tunnelbench.report.fmt import shown

    assert shown("a\x1bb\x07c\x9bd\u202ee\tf\ng") == "a\\x1bb\\x07c\\x9bd\\u202ee\tf\ng"


def test_markdown_text_holds_no_html_link_emphasis_or_cell_boundary():
    from tunnelbench.report.fmt import code, md

    assert md("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    assert md("[x](javascript:alert(1))") == "[x]\\(javascript:alert(1))"
    assert md("a|b *c* _d_ `e` f\\g\nh") == "a\\|b \\*c\\* \\_d\\_ \\`e\\` f\\\\g h"
    assert md("goodput_mbps 2.0 [dev]") == "goodput_mbps 2.0 [dev]"  # shown as written already
    assert code("r-1") == "`r-1`" and code("a`b") == "a\\`b"


@pytest.fixture
def cli(monkeypatch):
    """The CLI in this process, its consoles wide enough that no line is folded."""
    from tunnelbench.cli import app, common

    for con in (common.console, common.err):
        monkeypatch.setattr(con, "width", 2000)

    def invoke(*argv: str):
        res = CliRunner().invoke(app.main, list(argv))
        assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
        return res

    return invoke


def runs(tmp_path: Path, name: str) -> tuple[str, str]:
    a = make_run(
        tmp_path, "20260101-000000-tbname1", {"internal": (1000, 10), name: (800, 8)}, 4, 1, extra_label=False
    )
    b = make_run(
        tmp_path, "20260101-000001-tbname2", {"internal": (1000, 10), name: (400, 8)}, 4, 2, extra_label=False
    )
    return a.name, b.name


@pytest.mark.slow  # 3-6 s: two stored runs analysed (bootstrap); the lab lane runs it
def test_compare_prints_a_stored_name_as_text(tmp_path, cli):
    a, b = runs(tmp_path, NAME)
    res = cli("compare", a, b, "--results", str(tmp_path))
    assert res.exit_code == 0, res.output  # 4 repetitions: too few to call the halving a regression
    assert "Traceback" not in res.output and terminal_codes(res.output) == []
    assert f"│ {SEEN} │ baseline │ tcp" in res.output and "too few repetitions" in res.output


def test_export_names_an_out_file_with_brackets(tmp_path, cli):
    a, _ = runs(tmp_path, "fastvpn")
    (tmp_path / "a[").mkdir()
    out = tmp_path / "a[" / "]m.csv"  # the path holds "[/]": a closing tag with nothing to close
    res = cli("export", a, "--results", str(tmp_path), "--out", str(out))
    assert res.exit_code == 0, res.output
    assert f"csv: {out}" in res.output and out.read_text().startswith("run_id,")


def test_doctor_prints_a_tool_s_detail_as_text(monkeypatch, cli):
    from tunnelbench import doctor
    from tunnelbench.doctor import Check

    monkeypatch.setattr(doctor, "run_doctor", lambda: [Check("tools", "[/bold] x", False, NAME, "[red]m")])
    res = cli("doctor")
    assert "Traceback" not in res.output and terminal_codes(res.output) == []
    assert "[/bold] x" in res.output and SEEN in res.output and "[red]m" in res.output


@pytest.mark.slow  # 3 s: a stored run analysed (bootstrap); the lab lane runs it
def test_report_md_escapes_stored_names(tmp_path):
    from tunnelbench.report.full import render_markdown
    from tunnelbench.report.reading import read

    img = "<img src=x onerror=alert(1)>"
    run_dir = make_run(
        tmp_path, "20260101-000000-tbmd0001", {"internal": (1000, 10), img: (900, 9), "a|b": (800, 8)}
    )
    rd = read([(run_dir, None)])
    text = render_markdown(rd)
    rd.close()
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    rows = [x for x in text.splitlines() if x.startswith("| ") and ("a\\|b" in x or "&lt;img" in x)]
    header = next(x for x in text.splitlines() if x.startswith("| VPN | workload"))
    cells = lambda line: len(re.findall(r"(?<!\\)\|", line))  # noqa: E731
    assert rows and all(cells(x) == cells(header) for x in rows if "| tcp |" in x), rows
