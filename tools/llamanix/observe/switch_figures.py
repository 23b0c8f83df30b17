"""What a host's generations say about its switches, as the exporter and ``top`` show them: the
newest switch's verdict and date, each instance's last restart gap, the acceptance the gate kept
the serving generation at, and how many switches and rollbacks there were.

Read from the records ``state.generations`` keeps (``.llamanix-state/HOST`` beside the config)
through its public reader; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from llamanix.state.gap_records import GapRecord
from llamanix.state.generations import GateOutcome, GenerationRecord, HostState


@dataclass(frozen=True)
class InstanceSwitch:
    """One instance's last restart by a switch: its generation and what it cost."""

    generation: int
    gap: GapRecord


@dataclass(frozen=True)
class SwitchFigures:
    serving: int | None = None  # the generation serving now
    newest: int | None = None  # the newest generation, kept or not
    newest_verdict: GateOutcome | None = None
    newest_time: float | None = None  # Unix time the newest generation was made
    switches: int = 0
    rollbacks: int = 0
    restarts: Mapping[str, InstanceSwitch] = field(default_factory=dict)
    gate_acceptance: Mapping[str, float] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return self.newest is not None


def _unix(date: str | None) -> float | None:
    if date is None:
        return None
    try:
        return datetime.fromisoformat(date.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _is_switch(record: GenerationRecord) -> bool:
    """A generation a switch made: the one recorded from units found installed before the
    first switch ("unverified") is not."""
    return record.outcome != "unverified"


def _rollbacks(record: GenerationRecord) -> int:
    # A gate that failed and restored the previous generation, and a generation that
    # `llamanix rollback` served again, each count once.
    return int(record.rollback is not None) + int(record.activated_again is not None)


def switch_figures(state: HostState) -> SwitchFigures:
    """The figures of a host's generations; empty when it has none."""
    generations = state.generations()
    if not generations:
        return SwitchFigures()
    records = [(gen.number, gen.record) for gen in generations]
    restarts: dict[str, InstanceSwitch] = {}
    for number, record in records:
        for name, gap in (record.gaps or {}).items():
            if gap.gap_s is not None or gap.load_s is not None:
                restarts[name] = InstanceSwitch(number, gap)
    serving = state.current()
    acceptance: dict[str, float] = {}
    if serving is not None:
        gate = serving.record.gate
        for name, result in ((gate.instances or {}) if gate else {}).items():
            if result.passed and result.acceptance is not None:
                acceptance[name] = result.acceptance
    newest_number, newest = records[-1]
    return SwitchFigures(
        serving=serving.number if serving is not None else None,
        newest=newest_number,
        newest_verdict=newest.outcome,
        newest_time=_unix(newest.date),
        switches=sum(1 for _, r in records if _is_switch(r)),
        rollbacks=sum(_rollbacks(r) for _, r in records),
        restarts=restarts,
        gate_acceptance=acceptance,
    )
