"""A rolling switch: one change, host after host, each gated, stopping at the first failure.

The first host is the canary and goes alone; the rest follow in batches (``--batch N``), the
hosts of a batch switched at once. Each host's switch is the one-host switch (local, NixOS or,
over ssh, a remote plain-systemd host), so each is gated as a single switch is and a failing
gate rolls that host back by itself. Then the rollout stops: the hosts not reached stay
untouched, and with ``--on-failure rollback-all`` the hosts this rollout switched are put back
on the generation they ran before, as deploy-rs does for several targets.

Before any host is touched every remote host is asked, once, how its last run ended (which
also proves that ssh works, that its llamanix speaks our protocol and that no other switch runs
there): one host that cannot be reached stops the rollout before it starts. A stop signal
between hosts ends the rollout cleanly; a host whose switch is under way finishes first (a
remote one runs in a unit its own systemd owns, and would finish anyway).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import JsonRecord, json_key
from llamanix.deploy.gap_records import GapRecord
from llamanix.deploy.switch_records import HostOutcome

OnFailure = Literal["stop", "rollback-all"]
ON_FAILURE: tuple[OnFailure, ...] = get_args(OnFailure)
# What became of one host in a rollout.
Verdict = Literal[
    "passed",  # switched, its gate passed
    "unchanged",  # nothing of it changed
    "rolled back",  # its gate failed: its own switch restored the previous generation
    "failed",  # its switch failed and the previous generation may not serve
    "unreachable",  # ssh could not reach it: nothing ran there
    "restored",  # switched, then put back by --on-failure rollback-all
    "untouched",  # not reached: the rollout stopped before it
    "interrupted",  # a stop signal ended the rollout before it
    "dry-run",
]
Echo = Callable[[str], None]


class HostOps(Protocol):
    """What a rollout does to one host; fleet.dispatch binds it to the real switches."""

    def preflight(self, host: str) -> None:
        """Raise (one line) when the host cannot be switched now: unreachable, no llamanix."""

    def switch(self, host: str, first: bool) -> HostOutcome:
        """Switch the host to the new config (``first``: the canary, whose failure restores the
        config file too)."""

    def rollback(self, host: str, to: int) -> HostOutcome:
        """Serve generation ``to`` again."""


class Unreachable(ExternalCommandError):
    """The host could not be reached (ssh), so nothing ran on it."""


@dataclass(frozen=True)
class RolloutOptions:
    batch: int = 1
    on_failure: OnFailure = "stop"


@dataclass
class HostRow(JsonRecord):
    """One line of the rollout's table (``--json``: one object)."""

    host: str
    verdict: Verdict
    before: int | None = field(default=None, metadata=json_key("generation_before"))
    after: int | None = field(default=None, metadata=json_key("generation_after"))
    out_of_service_s: float | None = None
    detail: str = ""
    # Each restarted instance's gap on this host (docs/switching.md).
    gaps: dict[str, GapRecord] = field(default_factory=dict)

    @property
    def generations(self) -> str:
        def show(n: int | None) -> str:
            return "-" if n is None else str(n)

        if self.verdict in ("untouched", "interrupted", "unreachable", "dry-run"):
            return show(self.before)
        return f"{show(self.before)} -> {show(self.after)}"


@dataclass
class Rollout:
    """The plan (``batches``) and, as it runs, each host's row."""

    batches: list[list[str]]
    rows: dict[str, HostRow] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.verdict in ("passed", "unchanged", "dry-run") for r in self.rows.values())

    def ordered(self) -> list[HostRow]:
        return [self.rows[h] for batch in self.batches for h in batch if h in self.rows]


def plan_batches(hosts: Sequence[str], batch: int) -> list[list[str]]:
    """The canary alone, then batches of ``batch``."""
    if batch < 1:
        raise UserError(
            Problem("llamanix switch", "--batch", f"must be 1 or more, got {batch}", "--batch 1")
        )
    if not hosts:
        return []
    rest = list(hosts[1:])
    return [[hosts[0]], *[rest[i : i + batch] for i in range(0, len(rest), batch)]]


def _row(outcome: HostOutcome) -> HostRow:
    verdict: Verdict
    if outcome.result == "passed":
        verdict = "passed"
    elif outcome.result == "unchanged":
        verdict = "unchanged"
    elif outcome.result == "dry-run":
        verdict = "dry-run"
    elif "serving again" in outcome.detail:
        verdict = "rolled back"
    else:
        verdict = "failed"
    after = outcome.generation if verdict == "passed" else outcome.previous
    if verdict == "unchanged":
        after = outcome.generation
    return HostRow(
        outcome.host,
        verdict,
        outcome.previous if verdict != "unchanged" else outcome.generation,
        after,
        outcome.out_of_service_s,
        outcome.detail,
        dict(outcome.gaps),
    )


def _switch_one(ops: HostOps, host: str, first: bool, echo: Echo) -> HostRow:
    try:
        return _row(ops.switch(host, first))
    except Unreachable as err:
        echo(f"{host}: {err}")
        return HostRow(host, "unreachable", detail=str(err))
    except ExternalCommandError as err:
        echo(f"{host}: {err}")
        return HostRow(host, "failed", detail=str(err))


def run_rollout(
    hosts: Sequence[str],
    opts: RolloutOptions,
    ops: HostOps,
    echo: Echo,
    stop_requested: Callable[[], bool] = lambda: False,
) -> Rollout:
    """Preflight every host, then switch batch after batch; see the module's docstring."""
    rollout = Rollout(plan_batches(hosts, opts.batch))
    for host in hosts:
        ops.preflight(host)  # one line and nothing touched when any host cannot be switched
    failed = False
    for index, batch in enumerate(rollout.batches):
        if failed or stop_requested():
            verdict: Verdict = "untouched" if failed else "interrupted"
            for host in batch:
                rollout.rows[host] = HostRow(host, verdict)
            continue
        label = "canary" if index == 0 else f"batch {index}"
        echo(f"rollout: {label}: {', '.join(batch)}")
        if len(batch) == 1:
            rows = [_switch_one(ops, batch[0], index == 0, echo)]
        else:
            # Loaded here: a rolling switch of one host at a time needs no threads.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                rows = list(pool.map(lambda h: _switch_one(ops, h, False, echo), batch))
        for row in rows:
            rollout.rows[row.host] = row
        failed = any(r.verdict not in ("passed", "unchanged", "dry-run") for r in rows)
        if failed:
            bad = next(r for r in rows if r.verdict not in ("passed", "unchanged", "dry-run"))
            echo(f"rollout: stopped at {bad.host} ({bad.verdict})")
    if failed and opts.on_failure == "rollback-all":
        _restore_switched(rollout, ops, echo)
    return rollout


def _restore_switched(rollout: Rollout, ops: HostOps, echo: Echo) -> None:
    """--on-failure rollback-all: every host this rollout switched runs its old generation."""
    for row in reversed(rollout.ordered()):
        if row.verdict != "passed":
            continue
        if row.before is None:
            row.detail = "no earlier generation to go back to: left switched"
            echo(f"{row.host}: {row.detail}")
            continue
        echo(f"rollout: restoring {row.host} to generation {row.before}")
        started = time.monotonic()
        try:
            outcome = ops.rollback(row.host, row.before)
        except ExternalCommandError as err:
            row.detail = f"rollback-all failed: {err}"
            echo(f"{row.host}: {row.detail}")
            continue
        row.verdict = "restored"
        row.after = outcome.generation
        took = outcome.out_of_service_s
        extra = took if took is not None else time.monotonic() - started
        row.out_of_service_s = (row.out_of_service_s or 0.0) + extra


__all__ = [
    "ON_FAILURE",
    "HostOps",
    "HostRow",
    "OnFailure",
    "Rollout",
    "RolloutOptions",
    "Unreachable",
    "Verdict",
    "plan_batches",
    "run_rollout",
]
