"""From which output length a faster-decoding configuration wins on wall clock.

A request's wall clock is close to a line in its output length n: ``wall(n) = a + b * n``, where
``a`` is the fixed cost (prefill, drafting set-up, the first token) and ``b = 1 / r`` the time
per decoded token. Speculation (a draft, MTP, n-grams) typically lowers ``b`` and raises ``a``:
it pays only once enough tokens are generated to earn back its extra fixed cost,

    crossover = prefill_tax / (1 / r_base - 1 / r_fast) = (a_fast - a_base) / (b_base - b_fast).

The lines are least-squares fits of the median wall clock against the median output length of
each bench row (one prompt, several ``--max-tokens``), so ``r`` here is the wall-clock decode
rate the fit implies, which includes everything a client waits for per token.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from llamanix.bench.bench_results import BenchResult
from llamanix.core.json_codec import JSON_INLINE, JsonRecord, JsonShape, json_key

# always: the candidate wins at every length; never: at none; above/below: from/up to ``tokens``;
# same: the two lines coincide.
Outcome = Literal["always", "never", "above", "below", "same"]


@dataclass(frozen=True)
class Line(JsonRecord):
    """``wall_s = intercept_s + slope_s_per_token * output_tokens``; written with the decode
    rate that follows from the slope."""

    intercept_s: float
    slope_s_per_token: float
    points: int

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"decode_tok_s": lambda line: line.decode_tok_s},
        order=("intercept_s", "slope_s_per_token", "decode_tok_s", "points"),
    )

    @property
    def decode_tok_s(self) -> float | None:
        return 1.0 / self.slope_s_per_token if self.slope_s_per_token > 0 else None

    def at(self, tokens: float) -> float:
        return self.intercept_s + self.slope_s_per_token * tokens


def fit_line(points: Sequence[tuple[float, float]]) -> Line | None:
    """Least squares of y on x; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return Line(intercept_s=mean_y - slope * mean_x, slope_s_per_token=slope, points=len(points))


@dataclass(frozen=True)
class Crossover(JsonRecord):
    """The candidate's line against the baseline's."""

    outcome: Outcome
    tokens: float | None  # the output length where the lines cross (above/below only)
    prefill_tax_s: float  # candidate's fixed cost minus the baseline's
    baseline: Line
    candidate: Line

    def sentence(self, candidate: str, baseline: str) -> str:
        rates = _rates(self)
        if self.outcome == "above":
            return (
                f"{candidate} pays only above {self.tokens:.0f} output tokens against "
                f"{baseline} (fixed cost {self.prefill_tax_s:+.3f} s, {rates})"
            )
        if self.outcome == "below":
            return (
                f"{candidate} wins only below {self.tokens:.0f} output tokens against "
                f"{baseline} (fixed cost {self.prefill_tax_s:+.3f} s, {rates})"
            )
        if self.outcome == "always":
            return f"{candidate} wins against {baseline} at every output length ({rates})"
        if self.outcome == "never":
            return (
                f"{candidate} never pays against {baseline}: higher fixed cost "
                f"({self.prefill_tax_s:+.3f} s) and slower decode ({rates})"
            )
        return f"{candidate} and {baseline} take the same time at every output length"


def _rates(c: Crossover) -> str:
    def rate(line: Line) -> str:
        r = line.decode_tok_s
        return f"{r:.1f}" if r is not None else "-"

    return f"decode {rate(c.candidate)} vs {rate(c.baseline)} tok/s on the wall-clock fit"


def crossover(baseline: Line, candidate: Line) -> Crossover:
    """Where ``candidate`` starts (or stops) beating ``baseline``."""
    tax = candidate.intercept_s - baseline.intercept_s
    saved_per_token = baseline.slope_s_per_token - candidate.slope_s_per_token
    outcome: Outcome
    tokens: float | None = None
    if saved_per_token > 0:
        if tax <= 0:
            outcome = "always"
        else:
            outcome, tokens = "above", tax / saved_per_token
    elif saved_per_token < 0:
        if tax >= 0:
            outcome = "never"
        else:
            outcome, tokens = "below", tax / saved_per_token
    else:
        outcome = "always" if tax < 0 else "never" if tax > 0 else "same"
    return Crossover(outcome, tokens, tax, baseline, candidate)


# --- from bench results ---------------------------------------------------------------------


def wall_points(result: BenchResult, prompt: str) -> list[tuple[float, float]]:
    """(output tokens, wall s) per row of ``prompt``: medians; the requested length stands in
    for the output length when the server reported none."""
    points: list[tuple[float, float]] = []
    for s in result.summaries:
        if s.prompt != prompt:
            continue
        wall = s.median("wall_s")
        if wall is None:
            continue
        tokens = s.median("predicted_n")
        points.append((tokens if tokens is not None else float(s.max_tokens), wall))
    return sorted(points)


@dataclass(frozen=True)
class PromptCrossover(JsonRecord):
    prompt: str
    baseline: str = field(metadata=json_key("baseline_label"))
    candidate: str = field(metadata=json_key("candidate_label"))
    # Its keys sit beside the labels, not under a key.
    crossover: Crossover = field(metadata=JSON_INLINE)

    def sentence(self) -> str:
        return f"{self.prompt}: " + self.crossover.sentence(self.candidate, self.baseline)


def prompt_crossovers(
    baseline: BenchResult,
    candidate: BenchResult,
    labels: tuple[str, str] | None = None,
) -> list[PromptCrossover]:
    """One crossover per prompt both results measured at two or more output lengths."""
    base_label, cand_label = labels or (baseline.label, candidate.label)
    prompts: list[str] = []
    for s in baseline.summaries:
        if s.prompt not in prompts:
            prompts.append(s.prompt)
    out: list[PromptCrossover] = []
    for prompt in prompts:
        base_line = fit_line(wall_points(baseline, prompt))
        cand_line = fit_line(wall_points(candidate, prompt))
        if base_line is None or cand_line is None:
            continue
        out.append(PromptCrossover(prompt, base_label, cand_label, crossover(base_line, cand_line)))
    return out


__all__ = [
    "Crossover",
    "Line",
    "Outcome",
    "PromptCrossover",
    "crossover",
    "fit_line",
    "prompt_crossovers",
    "wall_points",
]
