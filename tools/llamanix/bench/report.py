"""Showing bench results: the summary and agent tables, CSV, side-by-side comparison with the
crossover length, and the plots."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from llamanix.bench.bench_results import BenchResult, FieldStats, Stats, Summary, csv_rows
from llamanix.bench.crossover import Line, PromptCrossover, crossover, fit_line, prompt_crossovers
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject
from llamanix.external.files import atomic_write

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
    title = f"llamanix bench: {result.label}"
    if result.meta.cold_load_s is not None:
        # Not in any TTFT: the warm-up leaves the member loaded.
        title += f" (cold load through the router: {result.meta.cold_load_s:.2f} s)"
    table = Table(title=title, title_justify="left")
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


def agent_table(result: BenchResult) -> Table | None:
    """Agent prompts: cold and warm requests apart, cache reuse and the wall clock split."""
    rows = [s for s in result.summaries if s.phases]
    if not rows:
        return None
    table = Table(
        title=f"agent prompts: {result.label} (medians; cold = new prefix, warm = prefix cached)",
        title_justify="left",
        caption="prefill = time to the first token; reasoning = thinking tokens (0 when the "
        "model does not think); decode = the rest of the wall clock",
        caption_justify="left",
    )
    for heading, justify in (
        ("prompt", "left"),
        ("out", "right"),
        ("phase", "left"),
        ("n", "right"),
        ("cached tok", "right"),
        ("prefilled tok", "right"),
        ("prefill s", "right"),
        ("reasoning s", "right"),
        ("decode s", "right"),
        ("wall s", "right"),
        ("prefill share", "right"),
    ):
        table.add_column(heading, justify=justify)  # type: ignore[arg-type]
    for s in rows:
        assert s.phases is not None
        for phase, stats in s.phases.items():

            def med(name: str, st: FieldStats = stats) -> float | None:
                value = st.get(name)
                return value.median if value is not None else None

            wall, prefill = med("wall_s"), med("prefill_s")
            n = stats.get("wall_s")
            table.add_row(
                s.prompt,
                str(s.max_tokens),
                phase,
                str(n.n if n else 0),
                _fmt(med("cache_n"), 0),
                _fmt(med("prompt_n"), 0),
                _fmt(prefill, 3),
                _fmt(med("reasoning_s"), 3),
                _fmt(med("decode_s"), 3),
                _fmt(wall, 3),
                f"{prefill / wall:.0%}" if prefill is not None and wall else "-",
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


def compare_crossovers(results: Sequence[BenchResult]) -> list[PromptCrossover]:
    """Each later result against the first, per prompt swept over two or more lengths."""
    labels = unique_labels(results)
    return [
        c
        for label, result in zip(labels[1:], results[1:], strict=True)
        for c in prompt_crossovers(results[0], result, (labels[0], label))
    ]


def compare_json(
    results: Sequence[BenchResult],
    rows: Sequence[CompareRow],
    crossovers: Sequence[PromptCrossover] = (),
) -> JsonObject:
    labels = unique_labels(results)
    return {
        "labels": [*labels],
        "baseline": labels[0],
        "crossover": [c.to_json() for c in crossovers],
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


def pyplot() -> Any:
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
    return plt


def wall_series(result: BenchResult, prompt: str | None) -> list[tuple[float, float]]:
    """(output tokens, wall s) medians of one prompt, or the mean over prompts per length."""
    by_length: dict[int, list[tuple[float, float]]] = {}
    for s in result.summaries:
        if prompt is not None and s.prompt != prompt:
            continue
        wall = s.median("wall_s")
        if wall is None:
            continue
        tokens = s.median("predicted_n")
        by_length.setdefault(s.max_tokens, []).append(
            (tokens if tokens is not None else float(s.max_tokens), wall)
        )
    return [
        (sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts))
        for _, pts in sorted(by_length.items())
    ]


def plot_compare(results: Sequence[BenchResult], path: Path, prompt: str | None = None) -> None:
    """Two panels against output length: decode tok/s (medians, min-max) and wall clock with
    each result's least-squares line; where a later result's line crosses the first's, the
    crossover is marked."""
    plt = pyplot()
    labels = unique_labels(results)
    fig, (ax_decode, ax_wall) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    try:
        _decode_lines(ax_decode, results, labels, prompt)
    except UserError:
        plt.close(fig)
        raise
    lines: list[Line | None] = []
    longest = 0.0
    for label, result in zip(labels, results, strict=True):
        series = wall_series(result, prompt)
        line = fit_line(series)
        lines.append(line)
        if not series:
            continue
        xs = [p[0] for p in series]
        longest = max(longest, max(xs))
        dots = ax_wall.plot(xs, [p[1] for p in series], "o", label=label)
        if line is not None:
            ax_wall.plot(
                [0, max(xs)],
                [line.at(0), line.at(max(xs))],
                "-",
                color=dots[0].get_color(),
                alpha=0.6,
            )
    base = lines[0]
    for label, line in zip(labels[1:], lines[1:], strict=True):
        if base is None or line is None:
            continue
        cross = crossover(base, line)
        if cross.tokens is None:
            continue
        ax_wall.axvline(cross.tokens, color="grey", linestyle="--", alpha=0.8)
        ax_wall.annotate(
            f"{label}: {cross.outcome} {cross.tokens:.0f} tok",
            (cross.tokens, base.at(cross.tokens)),
            textcoords="offset points",
            xytext=(5, -12),
            fontsize=8,
        )
        if cross.tokens > longest:
            ax_wall.plot([longest, cross.tokens], [base.at(longest), base.at(cross.tokens)], ":")
            ax_wall.plot([longest, cross.tokens], [line.at(longest), line.at(cross.tokens)], ":")
    suffix = f" ({prompt})" if prompt else ""
    ax_wall.set_xlabel("output length (tokens)")
    ax_wall.set_ylabel("wall clock s (median) and least-squares line")
    ax_wall.set_title("wall clock vs output length" + suffix)
    ax_wall.set_xlim(left=0)
    ax_wall.set_ylim(bottom=0)
    ax_wall.grid(True, alpha=0.3)
    ax_wall.legend()
    _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def _decode_lines(
    ax: Any, results: Sequence[BenchResult], labels: Sequence[str], prompt: str | None
) -> None:
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
    ax.set_title("decode speed vs output length" + (f" ({prompt})" if prompt else ""))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()


def plot_decode(results: Sequence[BenchResult], path: Path, prompt: str | None = None) -> None:
    """Decode tok/s against output length, one line per label (medians, min-max error bars).

    With several prompts and no ``prompt`` chosen, each label's line is the mean over its
    prompts' medians at each length.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        _decode_lines(ax, results, unique_labels(results), prompt)
    except UserError:
        plt.close(fig)
        raise
    _save(plt, fig, path)
