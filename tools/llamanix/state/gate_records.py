"""What a gate concluded, as the store keeps it: the gate kinds, each instance's result, the
bench verdict with its baseline, and the runs a later switch compares with (``bench/NAME.json``).

These are records only: reading and writing them (``state.generations``, ``plan``,
``generations``) needs no HTTP client and runs no bench. Running a gate is ``switch.gate``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal, get_args

from llamanix.bench.interval import (
    CONFIDENCE,
    DECISIONS,
    MIN_SAMPLES,
    RESAMPLES,
    SEED,
    Decision,
    RatioInterval,
)
from llamanix.core import json_fields as jf
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


@dataclass(frozen=True)
class Baseline:
    """The runs a candidate is compared with (decode tok/s, one per run)."""

    samples: tuple[float, ...]
    source: BaselineSource
    generation: int | None = None
    date: str | None = None

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

    # Hand-written: it writes its median beside the runs, which no field holds.
    def to_json(self) -> JsonObject:
        return {
            "source": self.source,
            "samples": list(self.samples),
            "median": statistics.median(self.samples),
            "generation": self.generation,
            "date": self.date,
        }

    @staticmethod
    def from_json(data: object) -> Baseline | None:
        """The baseline of a recorded bench verdict (``to_json``); None when unreadable."""
        found = jf.table(data)
        source = jf.choice(found.get("source"), BASELINE_SOURCES)
        samples = jf.numbers(found.get("samples"))
        if source is None or not samples:
            return None
        return Baseline(
            samples, source, jf.integer(found.get("generation")), jf.text(found.get("date"))
        )


@dataclass(frozen=True)
class BaselineRecord:
    """``bench/NAME.json``: the runs of an instance's last passing bench, the baseline of its
    next ``--max-regression`` switch when it does not answer to be measured fresh.

    ``samples`` is None in a record written before runs were kept (it holds only ``tok_s``,
    their median) or one that does not hold numbers."""

    samples: tuple[float, ...] | None
    tok_s: float | None
    generation: int | None
    variant: str | None
    date: str | None
    prompts: str | None = None  # the prompts measured; None in records before --gate-prompts

    @staticmethod
    def of(verdict: BenchVerdict, generation: int, variant: str) -> BaselineRecord:
        return BaselineRecord(
            verdict.samples, verdict.median, generation, variant, now(), verdict.prompts
        )

    # Hand-written: a list that holds anything but numbers reads as no runs at all (None),
    # where the codec would keep the numbers in it.
    def to_json(self) -> JsonObject:
        found: JsonObject = {
            "date": self.date,
            "tok_s": self.tok_s,
            "generation": self.generation,
            "variant": self.variant,
        }
        if self.samples is not None:
            found["samples"] = list(self.samples)
        if self.prompts is not None:
            found["prompts"] = self.prompts
        return found

    @staticmethod
    def from_json(data: object) -> BaselineRecord:
        found = jf.table(data)
        return BaselineRecord(
            samples=jf.numbers(found.get("samples")),
            tok_s=jf.number(found.get("tok_s")),
            generation=jf.integer(found.get("generation")),
            variant=jf.text(found.get("variant")),
            date=jf.text(found.get("date")),
            prompts=jf.text(found.get("prompts")),
        )


@dataclass(frozen=True)
class BenchVerdict:
    """What the bench gate measured and concluded.

    ``decision`` is the comparison with the baseline; None when there was none to make (no
    ``--max-regression``, or no baseline yet). ``action`` is what happens to the generation."""

    samples: tuple[float, ...]
    action: Action
    note: str
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

    @staticmethod
    def from_json(data: object) -> BenchVerdict | None:
        """A verdict as ``to_json`` recorded it (``note`` is not recorded: the gate's detail
        carries it); None when unreadable. ``runs``, ``median`` and ``max_tokens`` follow from
        the rest, so they are not read."""
        found = jf.table(data)
        samples = jf.numbers(found.get("samples"))
        action = jf.choice(found.get("action"), ACTIONS)
        if not samples or action is None:
            return None
        baseline = found.get("baseline")
        after = found.get("baseline_after")
        return BenchVerdict(
            samples=samples,
            action=action,
            note="",
            decision=jf.choice(found.get("decision"), DECISIONS),
            interval=_interval_from_json(found.get("interval")),
            threshold=jf.number(found.get("threshold")),
            max_regression_pct=jf.number(found.get("max_regression_pct")),
            baseline=Baseline.from_json(baseline) if baseline is not None else None,
            prompts=jf.text(found.get("prompts")),
            baseline_after=Baseline.from_json(after) if after is not None else None,
            confirmation=_interval_from_json(found.get("confirmation")),
            baseline_moved_pct=jf.number(found.get("baseline_moved_pct")),
        )


def _interval_from_json(data: object) -> RatioInterval | None:
    """A recorded interval (``RatioInterval.to_json``; its ``method`` is a constant)."""
    found = jf.table(data)
    low, ratio, high = (jf.number(found.get(k)) for k in ("low", "ratio", "high"))
    if low is None or ratio is None or high is None:
        return None
    confidence = jf.number(found.get("confidence"))
    resamples, seed = jf.integer(found.get("resamples")), jf.integer(found.get("seed"))
    return RatioInterval(
        low,
        ratio,
        high,
        CONFIDENCE if confidence is None else confidence,
        RESAMPLES if resamples is None else resamples,
        SEED if seed is None else seed,
    )


@dataclass
class GateResult:
    name: str
    gate: GateKind
    passed: bool
    detail: str
    tok_s: float | None = None
    bench: BenchVerdict | None = None
    # Accepted / drafted tokens over a bench gate's runs of a speculative instance: what the
    # exporter's acceptance alert compares the serving acceptance with.
    acceptance: float | None = None

    # Hand-written: the instance's name is the key its result is kept under, not a field of
    # its JSON.
    def to_json(self) -> JsonObject:
        found: JsonObject = {
            "gate": self.gate,
            "passed": self.passed,
            "detail": self.detail,
            "tok_s": self.tok_s,
            "bench": self.bench.to_json() if self.bench else None,
        }
        if self.acceptance is not None:
            found["acceptance"] = self.acceptance
        return found

    @staticmethod
    def from_json(name: str, data: object) -> GateResult | None:
        """A result as a generation's record holds it (``to_json``); None when unreadable."""
        found = jf.table(data)
        gate = jf.choice(found.get("gate"), GATES)
        if gate is None:
            return None
        return GateResult(
            name,
            gate,
            # An entry without a verdict says nothing against the instance.
            jf.flag(found.get("passed")) is not False,
            jf.text(found.get("detail")) or "",
            jf.number(found.get("tok_s")),
            BenchVerdict.from_json(found.get("bench")) if found.get("bench") else None,
            jf.number(found.get("acceptance")),
        )
