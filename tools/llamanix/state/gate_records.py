"""What a gate concluded, as the store keeps it: the gate kinds, each instance's result, the
bench verdict with its baseline, and the runs a later switch compares with (``bench/NAME.json``).

These are records only: reading and writing them (``state.generations``, ``plan``,
``generations``) needs no HTTP client and runs no bench. Running a gate is ``switch.gate``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import ClassVar, Literal, get_args

from llamanix.bench.interval import MIN_SAMPLES, Decision, RatioInterval
from llamanix.core import json_fields as jf
from llamanix.core.json_codec import (
    JSON_SKIP,
    OMIT_NONE,
    JsonRecord,
    JsonShape,
    json_default,
    json_via,
)
from llamanix.core.json_value import JsonObject
from llamanix.external.clock import now

GateKind = Literal["health", "smoke", "bench"]
GATES: tuple[GateKind, ...] = get_args(GateKind)
# Tokens each bench run decodes (recorded with every verdict).
BENCH_MAX_TOKENS = 64
# The prompt every bench gate used before --gate-prompts; a record without prompts used it.
DEFAULT_GATE_PROMPTS = "builtin:fibonacci"

# What happens to the switched generation: kept, or rolled back.
Action = Literal["keep", "rollback"]
ACTIONS: tuple[Action, ...] = get_args(Action)
# Where a baseline's runs came from: measured just before the switch, or an earlier gate's.
BaselineSource = Literal["fresh", "stored"]
BASELINE_SOURCES: tuple[BaselineSource, ...] = get_args(BaselineSource)


def _numbers(raw: object) -> tuple[float, ...]:
    """Recorded runs: a list that holds anything but numbers is no runs at all (where the
    codec would keep the numbers in it), and an int stays an int, written back as it was."""
    found = jf.numbers(raw)
    if found is None:
        raise ValueError("expected a list of numbers")
    return found


def _runs(raw: object) -> tuple[float, ...]:
    """Recorded runs of a verdict or baseline: none at all is no verdict or baseline."""
    found = _numbers(raw)
    if not found:
        raise ValueError("expected a list of numbers")
    return found


@dataclass(frozen=True)
class Baseline(JsonRecord):
    """The runs a candidate is compared with (decode tok/s, one per run); written with their
    median, which is not read back. Read with ``from_json_or_none``: a record without runs or
    source is none."""

    samples: tuple[float, ...] = field(metadata=json_via(None, _runs))
    source: BaselineSource
    generation: int | None = None
    date: str | None = None

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"median": lambda b: statistics.median(b.samples)},
        order=("source", "samples", "median", "generation", "date"),
    )

    @staticmethod
    def stored(
        record: BaselineRecord | None, prompts: str = DEFAULT_GATE_PROMPTS
    ) -> Baseline | None:
        """An earlier gate's record (``bench/NAME.json``) when it measured ``prompts``. A
        record written before runs were kept holds only a median (``tok_s``): one number has
        no spread, so it is no baseline at all and the next bench starts a new one; runs of
        other prompts are no baseline either."""
        if record is None or record.samples is None:
            return None
        if (record.prompts or DEFAULT_GATE_PROMPTS) != prompts:
            return None
        samples = record.samples
        if len(samples) < MIN_SAMPLES or not all(v > 0 for v in samples):
            return None
        return Baseline(tuple(float(v) for v in samples), "stored", record.generation, record.date)


@dataclass(frozen=True)
class BaselineRecord(JsonRecord):
    """``bench/NAME.json``: the runs of an instance's last passing bench, the baseline of its
    next ``--max-regression`` switch when it does not answer to be measured fresh. Read with
    ``from_json_lenient``.

    ``samples`` is None in a record written before runs were kept (it holds only ``tok_s``,
    their median) or one that does not hold numbers."""

    samples: tuple[float, ...] | None = field(metadata=json_via(None, _numbers, omit_none=True))
    tok_s: float | None
    generation: int | None
    variant: str | None
    date: str | None
    # The prompts measured; None in records before --gate-prompts.
    prompts: str | None = field(default=None, metadata=OMIT_NONE)

    json_shape: ClassVar[JsonShape] = JsonShape(
        order=("date", "tok_s", "generation", "variant", "samples", "prompts")
    )

    @staticmethod
    def of(verdict: BenchVerdict, generation: int, variant: str) -> BaselineRecord:
        return BaselineRecord(
            verdict.samples, verdict.median, generation, variant, now(), verdict.prompts
        )


@dataclass(frozen=True)
class BenchVerdict(JsonRecord):
    """What the bench gate measured and concluded. Read with ``from_json_or_none`` (without
    runs or action it is none); ``note`` is not recorded (the gate's detail carries it), and
    ``runs``, ``median`` and ``max_tokens`` follow from the rest, so they are not read.

    ``decision`` is the comparison with the baseline; None when there was none to make (no
    ``--max-regression``, or no baseline yet). ``action`` is what happens to the generation."""

    samples: tuple[float, ...] = field(metadata=json_via(None, _runs))
    action: Action
    note: str = field(metadata={**JSON_SKIP, **json_default("")})
    decision: Decision | None = None
    interval: RatioInterval | None = None
    threshold: float | None = None
    max_regression_pct: float | None = None
    baseline: Baseline | None = None
    prompts: str | None = None  # the prompts measured (None: recorded before --gate-prompts)
    # A regression is confirmed before it counts (A, B, A): after the rollback the baseline is
    # measured again (``baseline_after``) and the candidate compared with it
    # (``confirmation``). When that second comparison is no regression, the machine moved, not
    # the change: ``decision`` is then inconclusive and ``baseline_moved_pct`` says how far the
    # baseline moved between its two measurements.
    baseline_after: Baseline | None = None
    confirmation: RatioInterval | None = None
    baseline_moved_pct: float | None = None

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def drifted(self) -> bool:
        """The regression was not confirmed: the baseline moved."""
        return self.decision == "inconclusive" and self.baseline_moved_pct is not None

    @property
    def verdict(self) -> str | None:
        """The decision as the switch words it."""
        if self.drifted:
            return f"inconclusive: the baseline moved by {self.baseline_moved_pct:+.1f}%"
        if self.decision == "regression" and self.baseline_after is not None:
            return "regression (confirmed)"
        return self.decision

    # Hand-written: it writes runs, median and max_tokens, which follow from the fields, and
    # leaves the note out (the gate's detail carries it).
    def to_json(self) -> JsonObject:
        return {
            "decision": self.decision,
            "action": self.action,
            "interval": self.interval.to_json() if self.interval else None,
            "threshold": self.threshold,
            "max_regression_pct": self.max_regression_pct,
            "runs": len(self.samples),
            "samples": list(self.samples),
            "median": self.median,
            "max_tokens": BENCH_MAX_TOKENS,
            "baseline": self.baseline.to_json() if self.baseline else None,
            # Written only where --gate-prompts named them: older records read back the same.
            **({"prompts": self.prompts} if self.prompts is not None else {}),
            # Written only where a regression was checked again.
            **(
                {
                    "verdict": self.verdict,
                    "baseline_after": self.baseline_after.to_json(),
                    "confirmation": self.confirmation.to_json() if self.confirmation else None,
                    "baseline_moved_pct": self.baseline_moved_pct,
                }
                if self.baseline_after is not None
                else {}
            ),
        }


@dataclass
class GateResult(JsonRecord):
    """One instance's gate result. Its name is the key the result is kept under, not part of
    its JSON: read with ``from_json_or_none(GateResult, data, name=...)`` (without a gate
    this version knows it is none)."""

    name: str = field(metadata=JSON_SKIP)
    gate: GateKind
    # An entry without a verdict says nothing against the instance.
    passed: bool = field(metadata=json_default(True))
    detail: str = field(metadata=json_default(""))
    tok_s: float | None = None
    bench: BenchVerdict | None = None
    # Accepted / drafted tokens over a bench gate's runs of a speculative instance: what the
    # exporter's acceptance alert compares the serving acceptance with.
    acceptance: float | None = field(default=None, metadata=OMIT_NONE)
