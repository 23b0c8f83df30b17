"""A rolling switch: one change, host after host, each gated, stopping at the first failure.

The first host is the canary and goes alone; the rest follow in batches (``--batch N``), the
hosts of a batch switched at once. Each host's switch is the one-host switch (local, NixOS or,
over ssh, a remote plain-systemd host), so each is gated as a single switch is and a failing
gate rolls that host back by itself. Then the rollout stops: the hosts not reached stay
untouched, and with ``--on-failure rollback-all`` the hosts this rollout switched are put back
on the generation they ran before, as deploy-rs does for several targets, and the config file
gets back the text it had.

Before any host is touched every remote host is asked, once, how its last run ended (which
also proves that ssh works, that its llamanix speaks our protocol and that no other switch runs
there): a host that cannot be switched now gets its row, and no host is touched. Whatever ends
the rollout (a host refused, unreachable, lost, failed, or a stop signal), every host has a row
with its typed verdict, and the rollout ends with its table. A stop signal between hosts ends
the rollout cleanly; a host whose switch is under way finishes first (a remote one runs in a
unit its own systemd owns, and would finish anyway). A second stop signal ends the batch under
way at once (its ssh connections closed: the remote switches go on there by themselves).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import OMIT_NONE, JsonRecord, json_key
from llamanix.state.gap_records import GapRecord
from llamanix.state.warm_records import CacheMove
from llamanix.switch.switch_records import HostOutcome

OnFailure = Literal["stop", "rollback-all"]
ON_FAILURE: tuple[OnFailure, ...] = get_args(OnFailure)
# What became of one host in a rollout.
Verdict = Literal[
    "passed",  # switched, its gate passed
    "unchanged",  # nothing of it changed
    "rolled back",  # its gate failed: its own switch restored the previous generation
    "failed",  # its switch failed and the previous generation may not serve
    "refused",  # it cannot be switched now (one line says why): nothing ran there
    "unreachable",  # ssh could not reach it: nothing ran there
    "lost",  # ssh lost it during its switch, which goes on there by itself
    "restored",  # switched, then put back by --on-failure rollback-all
    "untouched",  # not reached: the rollout stopped before it
    "interrupted",  # a stop signal ended the rollout before it, or during its switch
    "dry-run",
]
GOOD: tuple[Verdict, ...] = ("passed", "unchanged", "dry-run")
Echo = Callable[[str], None]


class HostOps(Protocol):
    """What a rollout does to one host; fleet.dispatch binds it to the real switches. Each
    raises ``Refused`` (a UserError), ``Unreachable`` or ``Lost`` for a host it could not
    switch, and ExternalCommandError for a command that failed."""

    def last_run(self, host: str) -> None:
        """Ask the host how its last run ended, before any host is touched; raise when it
        cannot be switched now (unreachable, no llamanix, a run that still goes on)."""

    def switch(self, host: str, first: bool) -> HostOutcome:
        """Switch the host to the new config (``first``: the canary, whose failure restores the
        config file too)."""

    def rollback(self, host: str, to: int) -> HostOutcome:
        """Serve generation ``to`` again."""

    def config_back(self) -> None:
        """Every host this rollout switched is back: the config file gets its old text."""


class Unreachable(ExternalCommandError):
    """The host could not be reached (ssh), so nothing ran on it."""


class Lost(ExternalCommandError):
    """ssh lost the host during its switch, which goes on there by itself."""


# How long the preflight follows a run that still goes on on a host before it refuses it.
DEFAULT_PREFLIGHT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RolloutOptions:
    batch: int = 1
    on_failure: OnFailure = "stop"
    preflight_timeout_s: float = DEFAULT_PREFLIGHT_TIMEOUT_S


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
    # Behind a gateway: where each restarted replica's caches moved, or why they went cold.
    caches: dict[str, CacheMove] | None = field(default=None, metadata=OMIT_NONE)

    @property
    def generations(self) -> str:
        def show(n: int | None) -> str:
            return "-" if n is None else str(n)

        if self.verdict in ("untouched", "refused", "unreachable", "dry-run") or (
            self.verdict in ("interrupted", "lost") and self.after is None
        ):
            return show(self.before)
        return f"{show(self.before)} -> {show(self.after)}"


@dataclass
class Rollout:
    """The plan (``batches``) and, as it runs, each host's row."""

    batches: list[list[str]]
    rows: dict[str, HostRow] = field(default_factory=dict)
    # A second stop signal ended it at once (the command exits as interrupted).
    aborted: bool = False

    @property
    def ok(self) -> bool:
        return all(r.verdict in GOOD for r in self.rows.values())

    def ordered(self) -> list[HostRow]:
        return [self.rows[h] for batch in self.batches for h in batch if h in self.rows]

    def rows_not_ok(self) -> list[str]:
        return [r.host for r in self.ordered() if r.verdict not in (*GOOD, "untouched")]


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
    if outcome.result in ("passed", "unchanged", "dry-run"):
        verdict = outcome.result
    elif outcome.restore == "serving again":
        verdict = "rolled back"
    else:
        verdict = "failed"
    before = outcome.generation if verdict == "unchanged" else outcome.previous
    after = outcome.generation if verdict in ("passed", "unchanged") else outcome.previous
    return HostRow(
        outcome.host,
        verdict,
        before,
        after,
        outcome.out_of_service_s,
        outcome.detail,
        dict(outcome.gaps),
        outcome.caches,
    )


def _failure(host: str, err: ExternalCommandError | UserError, echo: Echo) -> HostRow:
    """The row of a host whose switch (or preflight) raised: its verdict by the error's kind."""
    said = str(err).removeprefix(f"{host}: ")  # the row names the host
    echo(f"{host}: {said}")
    verdict: Verdict
    if isinstance(err, UserError):
        verdict = "refused"
    elif isinstance(err, Unreachable):
        verdict = "unreachable"
    elif isinstance(err, Lost):
        verdict = "lost"
    else:
        verdict = "failed"
    return HostRow(host, verdict, detail=said)


def _switch_one(ops: HostOps, host: str, first: bool, echo: Echo) -> HostRow:
    try:
        return _row(ops.switch(host, first))
    except (ExternalCommandError, UserError) as err:
        return _failure(host, err, echo)


def _preflight(rollout: Rollout, hosts: Sequence[str], ops: HostOps, echo: Echo) -> bool:
    """Ask every host how its last run ended; the hosts that cannot be switched now get their
    rows, the others "untouched". Whether every host can be switched."""
    for host in hosts:
        try:
            ops.last_run(host)
        except (ExternalCommandError, UserError) as err:
            rollout.rows[host] = _failure(host, err, echo)
        except KeyboardInterrupt:
            rollout.rows[host] = _interrupted(host)
            rollout.aborted = True
            break
    if not rollout.rows:
        return True
    for host in hosts:
        rollout.rows.setdefault(host, HostRow(host, "untouched", detail="no host was switched"))
    echo(f"rollout: not started: {', '.join(rollout.rows_not_ok())} cannot be switched now")
    return False


def _run_batch(ops: HostOps, batch: list[str], first: bool, echo: Echo) -> list[HostRow]:
    """Switch the hosts of a batch, at once; a second stop signal (KeyboardInterrupt) ends the
    hosts under way as "interrupted" (their ssh connections are closed by then)."""
    if len(batch) == 1:
        try:
            return [_switch_one(ops, batch[0], first, echo)]
        except KeyboardInterrupt:
            return [_interrupted(batch[0])]
    # Loaded here: a rolling switch of one host at a time needs no threads.
    from concurrent.futures import ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=len(batch))
    futures = {}
    try:
        for host in batch:
            futures[host] = pool.submit(_switch_one, ops, host, False, echo)
        wait(futures.values())
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        return [_interrupted(h) for h in batch]
    pool.shutdown(wait=True)
    return [futures[h].result() for h in batch]


def _interrupted(host: str) -> HostRow:
    return HostRow(
        host,
        "interrupted",
        detail="stopped by a second stop signal during its switch (a remote one goes on there "
        "by itself; the next switch reports how it ended)",
    )


def run_rollout(
    hosts: Sequence[str],
    opts: RolloutOptions,
    ops: HostOps,
    echo: Echo,
    stop_requested: Callable[[], bool] = lambda: False,
) -> Rollout:
    """Preflight every host, then switch batch after batch; see the module's docstring."""
    rollout = Rollout(plan_batches(hosts, opts.batch))
    if not _preflight(rollout, hosts, ops, echo):
        return rollout
    ended: str | None = None  # what ended the rollout early
    rest: Verdict | None = None  # the verdict of the hosts after that
    for index, batch in enumerate(rollout.batches):
        if rest is None and stop_requested():
            rest, ended = "interrupted", "a stop signal"
            echo("rollout: stopped by a stop signal")
        if rest is not None:
            for host in batch:
                rollout.rows[host] = HostRow(host, rest)
            continue
        label = "canary" if index == 0 else f"batch {index}"
        echo(f"rollout: {label}: {', '.join(batch)}")
        rows = _run_batch(ops, batch, index == 0, echo)
        for row in rows:
            rollout.rows[row.host] = row
        bad = [r for r in rows if r.verdict not in GOOD]
        if any(r.verdict == "interrupted" for r in rows):
            rollout.aborted = True
            rest, ended = "interrupted", "a second stop signal"
            echo("rollout: stopped at once by a second stop signal")
        elif bad:
            rest, ended = "untouched", f"{bad[0].host} ({bad[0].verdict})"
            echo(f"rollout: stopped at {ended}")
    if ended is not None and opts.on_failure == "rollback-all" and not rollout.aborted:
        _restore_switched(rollout, ops, echo)
    return rollout


def _restore_switched(rollout: Rollout, ops: HostOps, echo: Echo) -> None:
    """--on-failure rollback-all: every host this rollout switched runs its old generation,
    newest first, and the config file gets its old text once none is left switched."""
    left = [r.host for r in rollout.ordered() if r.verdict == "lost"]
    for row in reversed(rollout.ordered()):
        if row.verdict != "passed":
            continue
        if row.before is None:
            row.detail = "no earlier generation to go back to: left switched"
            echo(f"{row.host}: {row.detail}")
            left.append(row.host)
            continue
        try:
            restored = _restore_one(row, ops, echo)
        except KeyboardInterrupt:
            rollout.aborted = True
            echo("rollout: rollback-all stopped by a second stop signal")
            return
        if not restored:
            left.append(row.host)
    if left:
        echo(f"rollout: the config keeps the change: {', '.join(left)} may run it")
        return
    ops.config_back()


def _restore_one(row: HostRow, ops: HostOps, echo: Echo) -> bool:
    """Put one host back on its generation before the rollout; whether it is."""
    assert row.before is not None
    echo(f"rollout: restoring {row.host} to generation {row.before}")
    started = time.monotonic()
    try:
        outcome = ops.rollback(row.host, row.before)
    except (ExternalCommandError, UserError) as err:
        outcome = HostOutcome(row.host, "failed", detail=str(err))
    if not outcome.ok:
        row.detail = f"rollback-all failed: {outcome.detail}"
        echo(f"{row.host}: {row.detail}")
        return False
    row.verdict = "restored"
    row.after = outcome.generation
    took = outcome.out_of_service_s
    extra = took if took is not None else time.monotonic() - started
    row.out_of_service_s = (row.out_of_service_s or 0.0) + extra
    return True


__all__ = [
    "GOOD",
    "ON_FAILURE",
    "HostOps",
    "HostRow",
    "Lost",
    "OnFailure",
    "Rollout",
    "RolloutOptions",
    "Unreachable",
    "Verdict",
    "plan_batches",
    "run_rollout",
]
