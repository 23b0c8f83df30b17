"""What a switch takes and what it gives back: its options, and each host's outcome.

Their own module so that the one-host paths (switch.transaction for this machine and NixOS,
fleet.remote for a plain-systemd host over ssh) and the rolling switch share them
without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from llamanix.config.model import suggest
from llamanix.core import json_fields as jf
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import OMIT_NONE, JsonRecord, from_json_or_none, json_via
from llamanix.core.json_value import JsonObject
from llamanix.state.gap_records import GapRecord
from llamanix.state.gate_records import ACTIONS, GATES, Action, Baseline, GateKind, GateResult
from llamanix.state.generations import ManagerKind
from llamanix.state.warm_records import DEFAULT_LIMIT_GIB, CacheMove, WarmRecord
from llamanix.switch.gate import BENCH_RUNS, DEFAULT_MAX_RUNS, GatePrompts, Thresholds

DEFAULT_DRAIN_TIMEOUT_S = 30.0
# How long each instance may take to become healthy after a switch or rollback.
DEFAULT_TIMEOUT_S = 120.0
# How long a remote host's switch or rollback may run there (its unit is stopped after), and
# how much longer than that its agent follows it by default.
DEFAULT_RUN_TIMEOUT_S = 900.0
FOLLOW_GRACE_S = 60.0

# What a switch did on one host.
Outcome = Literal["passed", "failed", "unchanged", "dry-run"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
Echo = Callable[[str], None]
# What a switch whose gate failed left on its host.
Restore = Literal[
    "serving again",  # the previous generation was restored, and answers
    "not answering",  # the previous generation was restored, and does not answer
    "nothing before",  # nothing was installed before, so nothing serves
    "never stopped",  # activation did not finish (a nixos-rebuild build): nothing to restore
]


@dataclass(frozen=True)
class SwitchOptions(JsonRecord):
    """What a switch was asked for; a remote host's agent gets it as this record's JSON."""

    sets: tuple[str, ...] = ()
    gate: GateKind | None = None
    min_tok_s: float | None = None
    max_regression: float | None = None
    # bench gate with --max-regression: most candidate runs, and what an inconclusive ends as.
    max_runs: int = DEFAULT_MAX_RUNS
    inconclusive: str = "keep"
    # A regression the baseline measured again after the rollback does not confirm (the
    # machine drifted): the switch stands (keep) or stays rolled back.
    on_drift: str = "keep"
    timeout_s: float = DEFAULT_TIMEOUT_S
    # Most seconds to wait for a server to finish the requests in flight before its restart.
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    # Seconds to wait for another switch, rollback or pin of the same host to finish.
    wait_s: float = 0.0
    manager: ManagerKind | None = None
    units_dir: Path | None = None
    # bench gate: the prompts measured, in turn (bench's --prompts spelling).
    gate_prompts: str | None = None
    # A remote host's switch: how long it may run there, and how long its agent follows it
    # (None: the run's limit and a minute).
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    follow_timeout_s: float | None = None
    # A warm switch saves at most this much of an instance's caches (GiB).
    warm_limit_gib: float = DEFAULT_LIMIT_GIB
    # Systemd hosts: start each changed server's new render beside the old one and hand its
    # port over (hosts.blue_green), where the host has room for both.
    blue_green: bool = False

    @property
    def follow_s(self) -> float:
        return follow_deadline(self.run_timeout_s, self.follow_timeout_s)

    def gate_kind(self, source: str) -> GateKind:
        """The gate these options ask for, every option checked (bad ones: one line)."""
        return self.gate_of(source)[0]

    def gate_of(self, source: str) -> tuple[GateKind, GatePrompts | None]:
        """The gate these options ask for and its prompts (--gate-prompts, loaded once; None:
        the default), every option checked first (bad ones: one line)."""
        wants_bench = self.min_tok_s is not None or self.max_regression is not None
        if self.min_tok_s is not None and self.max_regression is not None:
            raise UserError(
                Problem(source, "--min-tok-s", "and --max-regression both given", "use one of them")
            )
        gate = self.gate or ("bench" if wants_bench else "health")
        if gate not in GATES:
            raise UserError(
                Problem(source, "--gate", f"unknown gate '{gate}'", suggest(gate, GATES))
            )
        if wants_bench and gate != "bench":
            raise UserError(
                Problem(
                    source,
                    "--gate",
                    f"--min-tok-s/--max-regression need a measurement, not '{gate}'",
                    "use --gate bench",
                )
            )
        if self.max_regression is not None and not 0 <= self.max_regression < 100:
            raise UserError(
                Problem(
                    "llamanix switch",
                    "--max-regression",
                    f"must be a percentage from 0 to below 100, got {self.max_regression:g}",
                    "pass e.g. --max-regression 5",
                )
            )
        if self.max_runs < BENCH_RUNS:
            raise UserError(
                Problem(
                    "llamanix switch",
                    "--max-runs",
                    f"must be at least {BENCH_RUNS} (the first batch of runs), got {self.max_runs}",
                    f"pass --max-runs {BENCH_RUNS} or more",
                )
            )
        self.inconclusive_action()
        self.drift_action()
        if self.gate_prompts is not None:
            if gate != "bench":
                raise UserError(
                    Problem(
                        "llamanix switch",
                        "--gate-prompts",
                        f"are what the bench gate measures, not '{gate}'",
                        "use --gate bench (or leave --gate-prompts out)",
                    )
                )
            return gate, GatePrompts.load(self.gate_prompts)
        return gate, None

    def inconclusive_action(self) -> Action:
        return _action("--inconclusive", self.inconclusive)

    def drift_action(self) -> Action:
        return _action("--on-drift", self.on_drift)

    def thresholds(self, baseline: Baseline | None, prompts: GatePrompts | None) -> Thresholds:
        """The bench gate's limits; ``prompts``: the --gate-prompts' (from ``gate_of``),
        loaded once for the whole switch."""
        return Thresholds(
            self.min_tok_s,
            self.max_regression,
            baseline,
            self.max_runs,
            self.inconclusive_action(),
            prompts,
        )


def _action(option: str, value: str) -> Action:
    for action in ACTIONS:
        if value == action:
            return action
    raise UserError(
        Problem("llamanix switch", option, f"unknown outcome '{value}'", suggest(value, ACTIONS))
    )


@dataclass(frozen=True)
class RollbackOptions(JsonRecord):
    """What a rollback was asked for: the generation (None: the newest good one before the
    current), how long its instances may take to serve, how long to wait for another command
    of the same host, and the manager overrides of a host switched from this machine."""

    to: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    wait_s: float = 0.0
    manager: ManagerKind | None = None
    units_dir: Path | None = None
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    follow_timeout_s: float | None = None

    @property
    def follow_s(self) -> float:
        return follow_deadline(self.run_timeout_s, self.follow_timeout_s)


def follow_deadline(run_timeout_s: float, follow_timeout_s: float | None) -> float:
    """How long an agent follows a run: as asked, else the run's own limit and a minute (so a
    run that ends at its limit is still seen to end)."""
    return run_timeout_s + FOLLOW_GRACE_S if follow_timeout_s is None else follow_timeout_s


def _gates_json(gates: list[GateResult]) -> JsonObject:
    return {r.name: r.to_json() for r in gates}


def _gates_from_json(data: object) -> list[GateResult]:
    """The results keyed by instance, as ``_gates_json`` wrote them; those this version cannot
    read are left out."""
    found = [from_json_or_none(GateResult, r, name=str(n)) for n, r in jf.table(data).items()]
    return [g for g in found if g is not None]


@dataclass
class HostOutcome(JsonRecord):
    """What a switch did on one host: its JSON is ``switch --json``'s row and what a remote
    host's agent sends back."""

    host: str
    result: Outcome
    generation: int | None = None
    detail: str = ""
    changed: list[str] = field(default_factory=list)
    # Written as an object by instance name (the key a GateResult's JSON leaves out).
    gates: list[GateResult] = field(
        default_factory=list, metadata=json_via(_gates_json, _gates_from_json, key="gate")
    )
    # The generation that was current before (what a failed gate restores).
    previous: int | None = None
    # Seconds from the start of activation until the new generation answered or, after a
    # failed gate, until the restored one did; None where nothing was activated, or where
    # the restored generation did not answer (it is out of service still).
    out_of_service_s: float | None = None
    # Each restarted instance's gap (systemd hosts): what its own clients saw.
    gaps: dict[str, GapRecord] = field(default_factory=dict)
    # A failed switch: what it left (None: it failed before anything was activated).
    restore: Restore | None = None
    # What each warm_switch instance kept of its caches (hosts.warm).
    warm: dict[str, WarmRecord] = field(default_factory=dict)
    # A rolling switch behind a gateway: where each restarted replica's caches moved, or why
    # they went cold (fleet/cache_move.py; the controller's record, not the host's).
    caches: dict[str, CacheMove] | None = field(default=None, metadata=OMIT_NONE)

    @property
    def ok(self) -> bool:
        return self.result != "failed"
