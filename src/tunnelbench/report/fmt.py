"""Number formatting shared by the terminal and HTML views, and how text from files and stores is shown.

Names (a scenario's, a VPN's, a profile's, a stored error) come from files a user wrote or a store anyone
could have written: on a terminal they are text, never rich markup (`[/bold]` would raise, `[link=...]` would
act) and never control codes (an ESC or OSC sequence would drive the terminal: retitle it, hide lines, write
a link); in Markdown they are text, never HTML or a link."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from rich.console import (
    Console,
    ConsoleOptions,
    HighlighterType,
    JustifyMethod,
    OverflowMethod,
    RenderableType,
)
from rich.segment import Segment
from rich.style import Style
from rich.text import Text


def num(v: float | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if unit == "ratio":
        return f"{v:.2e}" if 0 < abs(v) < 0.001 else f"{v:.4f}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def spread(lo: float, hi: float, unit: str = "") -> str:
    return f"{num(lo, unit)}–{num(hi, unit)}"


# C0 controls but newline and tab, DEL, C1 controls (0x9b is CSI, 0x9d OSC on their own), and the
# bidirectional overrides that make a line read other than it is stored
_CONTROL = [
    *range(0x00, 0x09),
    *range(0x0B, 0x20),
    *range(0x7F, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_SHOWN = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _CONTROL}
# a newline stays: rich hands over a multi-line Text (a two-line column title) as one segment
_STRIPPED = dict.fromkeys([*_CONTROL, 0x09])


def shown(text: str) -> str:
    """`text` with every control character written out as an escape (ESC -> \\x1b): what it holds, visibly."""
    return text.translate(_SHOWN)


class Terminal(Console):
    """The console every command prints with: a string is text (no markup, no emoji codes) with its control
    characters shown escaped, and style comes only from Text and Style objects. A Text built from a name
    keeps its width as measured, so control characters left in one are dropped at the last step instead."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, **kwargs)

    def render_str(
        self,
        text: str,
        *,
        style: str | Style = "",
        justify: JustifyMethod | None = None,
        overflow: OverflowMethod | None = None,
        emoji: bool | None = None,
        markup: bool | None = None,
        highlight: bool | None = None,
        highlighter: HighlighterType | None = None,
    ) -> Text:
        return super().render_str(
            shown(text),
            style=style,
            justify=justify,
            overflow=overflow,
            emoji=False,
            markup=False,
            highlight=highlight,
            highlighter=highlighter,
        )

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and not seg.text.replace("\n", "").isprintable():
                seg = Segment(seg.text.translate(_STRIPPED), seg.style)
            yield seg


_MD = {ord(c): f"\\{c}" for c in "\\`*|"} | {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;"}
_MD_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md(text: object) -> str:
    """`text` as Markdown text: no HTML, no link, no emphasis, code span or table cell boundary of its own,
    one line. An underscore inside a word (goodput_mbps) and a bracket that opens no link are left as they
    are: Markdown shows them as written."""
    s = shown(str(text).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")).translate(_MD)
    return _MD_LONE_UNDERSCORE.sub(r"\\_", s).replace("](", "]\\(")


def code(text: object) -> str:
    """`text` as a Markdown code span (shown as written: no escape applies inside one), or as md() text when
    it holds a backtick, which would end the span."""
    s = shown(str(text))
    return f"`{s}`" if s and s.isprintable() and "`" not in s else md(text)
