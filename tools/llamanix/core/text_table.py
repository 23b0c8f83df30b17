"""A boxed text table, drawn the way rich draws its default one (a heavy head, light body),
for output that must come quickly: ``plan`` prints one per host, and importing and laying out
rich's table took a third of that command's time. No cell wraps: a line longer than the
terminal stays one line, as ``plan``'s command lines already do, so the output can be grepped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO


def styled(out: TextIO) -> bool:
    """Whether to colour ``out``: a terminal, and NO_COLOR not set."""
    return out.isatty() and "NO_COLOR" not in os.environ


def style(text: str, code: str, on: bool) -> str:
    """``text`` in an SGR style (``"1"`` bold, ``"3"`` italic, ``"33"`` yellow) when ``on``."""
    return f"\x1b[{code}m{text}\x1b[0m" if on else text


def box_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], colour: bool = False
) -> list[str]:
    """The table's lines: the title, then the box; each column as wide as its widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def rule(left: str, fill: str, cross: str, right: str) -> str:
        return left + cross.join(fill * (w + 2) for w in widths) + right

    def line(bar: str, cells: Sequence[str], bold: bool = False) -> str:
        padded = (
            style(c.ljust(w), "1", bold and colour) for c, w in zip(cells, widths, strict=True)
        )
        return bar + bar.join(f" {c} " for c in padded) + bar

    return [
        style(title, "3", colour),
        rule("┏", "━", "┳", "┓"),
        line("┃", headers, bold=True),
        rule("┡", "━", "╇", "┩"),
        *(line("│", row) for row in rows),
        rule("└", "─", "┴", "┘"),
    ]


def print_lines(lines: Sequence[str], out: TextIO | None = None) -> None:
    (out or sys.stdout).write("".join(f"{line}\n" for line in lines))
