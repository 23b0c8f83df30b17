"""Is a change slower, or only noisy? An interval for the ratio of two medians, and a verdict.

One median against one stored median says nothing about spread: a 4% drop is a regression on
a quiet machine and noise on a busy one. Here both sides keep their per-run samples and the
change is judged by a bootstrap interval of ``median(candidate) / median(baseline)``:

- each of ``resamples`` rounds draws, with replacement, as many values from each side as it
  has, and takes the ratio of the two medians;
- the interval is the percentile interval of those ratios (for 95%: the 2.5th and 97.5th
  percentiles), the point estimate is the ratio of the observed medians.

The generator is seeded, so the same samples always give the same interval (a verdict that
changed on a re-read of the record would be worth nothing). The percentile bootstrap of a
median is coarse with five runs a side (a resampled median can only be one of the observed
values), which makes the interval wide rather than falsely narrow: with few runs, the gate
asks for more instead of guessing.

The verdict against a tolerated drop of ``max_regression_pct`` (threshold ``t = 1 - pct/100``):
``regression`` when the whole interval lies below ``t``, ``pass`` when its lower end is at or
above ``t``, ``inconclusive`` otherwise (the interval straddles ``t``: more runs may settle it).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from llamanix.core.json_codec import JsonRecord

Decision = Literal["pass", "regression", "inconclusive"]
DECISIONS: tuple[Decision, ...] = ("pass", "regression", "inconclusive")
METHOD = "bootstrap percentile interval of median(candidate) / median(baseline)"
PAIRED_METHOD = "bootstrap percentile interval of the geometric mean of paired ratios"
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 13
# Fewer runs than this on a side give no honest spread (one run has none at all).
MIN_SAMPLES = 3


@dataclass(frozen=True)
class RatioInterval(JsonRecord):
    """``low <= ratio <= high``: candidate/baseline, above 1 means the candidate is faster."""

    low: float
    ratio: float
    high: float
    confidence: float = CONFIDENCE
    resamples: int = RESAMPLES
    seed: int = SEED
    method: str = METHOD

    def text(self) -> str:
        """``1.93x [1.61, 2.30]``."""
        return f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def _clean(samples: Sequence[float], side: str) -> list[float]:
    values = [float(v) for v in samples]
    if len(values) < MIN_SAMPLES:
        raise ValueError(f"{side}: {len(values)} sample(s), need at least {MIN_SAMPLES}")
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{side}: every sample must be a positive finite rate")
    return values


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _bootstrap(
    statistic: Callable[[random.Random], float], confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """The percentile interval of ``statistic`` over ``resamples`` draws of a seeded
    generator (each call resamples with it)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    rng = random.Random(seed)
    values = sorted(statistic(rng) for _ in range(resamples))
    tail = (1 - confidence) / 2
    # Nearest-rank percentiles, clamped to the array: low rounds down, high rounds up, so the
    # interval is never narrower than the percentiles it names.
    low = values[max(0, math.floor(tail * resamples))]
    high = values[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return low, high


def ratio_interval(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> RatioInterval:
    """The bootstrap interval of median(candidate)/median(baseline); deterministic per seed."""
    base = _clean(baseline, "baseline")
    cand = _clean(candidate, "candidate")
    low, high = _bootstrap(
        lambda rng: (
            _median(rng.choices(cand, k=len(cand))) / _median(rng.choices(base, k=len(base)))
        ),
        confidence,
        resamples,
        seed,
    )
    return RatioInterval(
        low=low,
        ratio=_median(cand) / _median(base),
        high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def median_interval(
    samples: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """(low, median, high): the bootstrap percentile interval of one side's median."""
    values = _clean(samples, "samples")
    low, high = _bootstrap(
        lambda rng: _median(rng.choices(values, k=len(values))), confidence, resamples, seed
    )
    return low, _median(values), high


def threshold_of(max_regression_pct: float) -> float:
    """The lowest candidate/baseline ratio that is still acceptable."""
    return 1 - max_regression_pct / 100


def decide(interval: RatioInterval, threshold: float) -> Decision:
    if interval.high < threshold:
        return "regression"
    if interval.low >= threshold:
        return "pass"
    return "inconclusive"


def paired_ratio_interval(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> RatioInterval:
    """candidate[i]/baseline[i] are one prompt each, measured on both sides: the speed-up over
    a set of prompts is the geometric mean of those ratios (prompts of different lengths weigh
    alike), and its interval comes from resampling the prompts (the pairs), so the spread
    between prompts does not widen it the way two unpaired medians would."""
    if len(baseline) != len(candidate):
        raise ValueError(f"{len(baseline)} baseline values for {len(candidate)} candidates")
    base = _clean(baseline, "baseline")
    cand = _clean(candidate, "candidate")
    logs = [math.log(c / b) for b, c in zip(base, cand, strict=True)]
    low, high = _bootstrap(
        lambda rng: math.exp(statistics.fmean(rng.choices(logs, k=len(logs)))),
        confidence,
        resamples,
        seed,
    )
    return RatioInterval(
        low=low,
        ratio=math.exp(statistics.fmean(logs)),
        high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        method=PAIRED_METHOD,
    )


def paired_speedup(
    baseline: Sequence[float | None], candidate: Sequence[float | None]
) -> RatioInterval | None:
    """``paired_ratio_interval`` over the pairs where both sides measured a rate; None with
    fewer than MIN_SAMPLES such pairs."""
    pairs = [(b, c) for b, c in zip(baseline, candidate, strict=True) if b and c]
    if len(pairs) < MIN_SAMPLES:
        return None
    return paired_ratio_interval([b for b, _ in pairs], [c for _, c in pairs])
