"""Showing bench results: the summary table, CSV, side-by-side comparison and the plot."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from llamanix.core.errors import Problem, UserError
from llamanix.external.files import atomic_write
from llamanix.measure.bench import BenchResult, Stats, Summary, csv_rows

# Metrics compared side by side: (field, heading, higher is better).
COMPARED: tuple[tuple[str, str, bool], ...] = (
    ("server_decode_tok_s", "decode tok/s", True),
    ("server_prefill_tok_s", "prefill tok/s", True),
    ("ttft_s", "TTFT s", False),
    ("wall_s", "wall s", False),
    ("acceptance", "acceptance", True),
)
NOISE_MARK = "~"


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _median(summary: Summary, name: str) -> float | None:
    return summary.median(name)


def _range(st: Stats | None, digits: int = 1) -> str:
    if st is None:
        return "-"
    if st.n == 1:
        return _fmt(st.median, digits)
    return f"{_fmt(st.median, digits)} ({_fmt(st.min, digits)}-{_fmt(st.max, digits)})"


def summary_table(result: BenchResult) -> Table:
    """Medians (min-max) per prompt x output length."""
    table = Table(title=f"llamanix bench: {result.label}", title_justify="left")
    for heading, justify in (
        ("prompt", "left"),
        ("out", "right"),
        ("n", "right"),
        ("TTFT ms", "right"),
        ("prefill tok/s", "right"),
        ("decode tok/s (min-max)", "right"),
        ("client decode", "right"),
        ("wall s", "right"),
        ("accept", "right"),
        ("ceiling", "right"),
    ):
        table.add_column(heading, justify=justify)  # type: ignore[arg-type]
    for s in result.summaries:
        ttft = s.stats.get("ttft_s")
        accept = _median(s, "acceptance")
        wall = s.stats.get("wall_s")
        table.add_row(
            s.prompt,
            str(s.max_tokens),
            str(wall.n if wall else 0),
            _fmt(ttft.median * 1000 if ttft else None, 0),
            _fmt(_median(s, "server_prefill_tok_s"), 0),
            _range(s.stats.get("server_decode_tok_s")),
            _fmt(_median(s, "client_decode_tok_s")),
            _fmt(wall.median if wall else None, 2),
            _fmt(accept, 2) if accept is not None else "-",
            f"{s.ceiling_share:.0%}" if s.ceiling_share is not None else "-",
        )
    return table


def write_csv(result: BenchResult, path: Path) -> None:
    rows = csv_rows(result)
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    atomic_write(path, buf.getvalue())


# --- compare -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    median: float | None
    ratio: float | None  # this result's median over the first result's
    noise: bool  # min-max ranges overlap with the first result's


@dataclass(frozen=True)
class CompareRow:
    prompt: str
    max_tokens: int
    metric: str
    heading: str
    cells: tuple[Cell, ...]


def unique_labels(results: Sequence[BenchResult]) -> list[str]:
    labels: list[str] = []
    for r in results:
        label = r.label
        n = 2
        while label in labels:
            label = f"{r.label}#{n}"
            n += 1
        labels.append(label)
    return labels


def compare(results: Sequence[BenchResult]) -> list[CompareRow]:
    """Medians side by side, each relative to the first result, per prompt x length x metric."""
    if len(results) < 2:
        raise UserError(
            Problem(
                "bench compare",
                "FILES",
                "needs at least two results",
                "give two or more files written by bench --json",
            )
        )
    keys: list[tuple[str, int]] = []
    for r in results:
        for s in r.summaries:
            if (s.prompt, s.max_tokens) not in keys:
                keys.append((s.prompt, s.max_tokens))
    rows: list[CompareRow] = []
    for prompt, length in keys:
        found = [
            next((s for s in r.summaries if (s.prompt, s.max_tokens) == (prompt, length)), None)
            for r in results
        ]
        for name, heading, _higher in COMPARED:
            stats = [s.stats.get(name) if s is not None else None for s in found]
            if all(st is None for st in stats):
                continue
            base = stats[0]
            cells = []
            for st in stats:
                ratio = (
                    st.median / base.median
                    if st is not None and base is not None and base.median
                    else None
                )
                noise = st is not None and base is not None and st.overlaps(base)
                cells.append(Cell(median=st.median if st else None, ratio=ratio, noise=noise))
            rows.append(CompareRow(prompt, length, name, heading, tuple(cells)))
    return rows


def compare_table(results: Sequence[BenchResult], rows: Sequence[CompareRow]) -> Table:
    labels = unique_labels(results)
    table = Table(
        title="llamanix bench compare (ratios against " + labels[0] + ")",
        title_justify="left",
        caption=f"{NOISE_MARK} = min-max ranges overlap: inside the noise",
        caption_justify="left",
    )
    table.add_column("prompt")
    table.add_column("out", justify="right")
    table.add_column("metric")
    table.add_column(labels[0], justify="right")
    for label in labels[1:]:
        table.add_column(label, justify="right")
        table.add_column("ratio", justify="right")
    for row in rows:
        digits = 3 if row.metric in ("ttft_s", "wall_s", "acceptance") else 1
        cells: list[str] = [
            row.prompt,
            str(row.max_tokens),
            row.heading,
            _fmt(row.cells[0].median, digits),
        ]
        for cell in row.cells[1:]:
            cells.append(_fmt(cell.median, digits))
            if cell.ratio is None:
                cells.append("-")
            else:
                mark = f" {NOISE_MARK}" if cell.noise else ""
                cells.append(f"{cell.ratio:.2f}x{mark}")
        table.add_row(*cells)
    return table


def compare_json(results: Sequence[BenchResult], rows: Sequence[CompareRow]) -> dict[str, Any]:
    labels = unique_labels(results)
    return {
        "labels": labels,
        "baseline": labels[0],
        "rows": [
            {
                "prompt": r.prompt,
                "max_tokens": r.max_tokens,
                "metric": r.metric,
                "values": {
                    label: {"median": c.median, "ratio": c.ratio, "inside_noise": c.noise}
                    for label, c in zip(labels, r.cells, strict=True)
                },
            }
            for r in rows
        ],
    }


# --- plot ----------------------------------------------------------------------------------


def decode_series(result: BenchResult) -> dict[str, list[tuple[int, float, float, float]]]:
    """Per prompt: (output length, median, min, max) of decode tok/s, lengths ascending."""
    out: dict[str, list[tuple[int, float, float, float]]] = {}
    for s in result.summaries:
        st = s.stats.get("server_decode_tok_s") or s.stats.get("client_decode_tok_s")
        if st is None or s.max_tokens < 2:
            continue
        out.setdefault(s.prompt, []).append((s.max_tokens, st.median, st.min, st.max))
    for points in out.values():
        points.sort()
    return out


def plot_decode(results: Sequence[BenchResult], path: Path, prompt: str | None = None) -> None:
    """Decode tok/s against output length, one line per label (medians, min-max error bars).

    With several prompts and no ``prompt`` chosen, each label's line is the mean over its
    prompts' medians at each length.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            Problem(
                "llamanix bench",
                "--plot",
                "matplotlib is not installed",
                "pip install 'llamanix[plot]' (or matplotlib)",
            )
        ) from None
    labels = unique_labels(results)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    plotted = 0
    for label, result in zip(labels, results, strict=True):
        series = decode_series(result)
        if prompt is not None:
            series = {k: v for k, v in series.items() if k == prompt}
        if not series:
            continue
        lengths = sorted({p[0] for pts in series.values() for p in pts})
        med, lo, hi = [], [], []
        for n in lengths:
            at = [p for pts in series.values() for p in pts if p[0] == n]
            med.append(sum(p[1] for p in at) / len(at))
            lo.append(min(p[2] for p in at))
            hi.append(max(p[3] for p in at))
        yerr = [
            [m - low for m, low in zip(med, lo, strict=True)],
            [high - m for m, high in zip(med, hi, strict=True)],
        ]
        ax.errorbar(lengths, med, yerr=yerr, marker="o", capsize=3, label=label)
        plotted += 1
    if plotted == 0:
        plt.close(fig)
        raise UserError(
            Problem(
                "llamanix bench",
                "--plot",
                "no decode figures to plot",
                "bench with output lengths of 2 tokens or more",
            )
        )
    ax.set_xlabel("output length (tokens)")
    ax.set_ylabel("decode tok/s (median, min-max)")
    title = "decode speed vs output length" + (f" ({prompt})" if prompt else "")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write(path, buf.getvalue())
