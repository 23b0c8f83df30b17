"""What ``switch`` and ``rollback`` do, for one host or several: read the config once, lock the
hosts, and switch or roll back each where it lives (fleet.dispatch). The rolling switch's
order, batches and stopping rules are fleet.rollout's."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.deploy.fleet import remote
from llamanix.deploy.fleet.dispatch import FleetOps, rollback_one, switch_one
from llamanix.deploy.fleet.rollout import Rollout, RolloutOptions, run_rollout
from llamanix.deploy.request import HostChoice, RollbackRequest, SwitchRequest, read_locked
from llamanix.deploy.rollback import rollback_host
from llamanix.deploy.switch_records import Echo, HostOutcome, RollbackOptions, SwitchOptions
from llamanix.external.process import Runner


def switch(
    path: Path,
    host: str | None,
    opts: SwitchOptions,
    runner: Runner,
    echo: Echo,
    new_text: str | None = None,
) -> list[HostOutcome]:
    """Switch one host (None: the config's only one), or every host in order (``all``),
    stopping at the first failure. ``new_text``: switch to this text instead of the file's
    with --set applied.

    Each host's lock is held for the whole switch (--wait: how long to wait for another
    switch, rollback or pin to finish), the config read under it (see ``read_locked``); a dry
    run changes nothing and locks nothing."""
    opts.gate_kind(str(path))  # bad options: one line before anything is read or locked

    def read() -> SwitchRequest:
        return SwitchRequest.read(path, HostChoice(host), opts, new_text)

    if runner.dry_run:
        return _switch_hosts(read(), runner, echo)
    with ExitStack() as locks:
        request = read_locked(read, locks, opts.wait_s, "switch", echo)
        return _switch_hosts(request, runner, echo)


def _switch_hosts(request: SwitchRequest, runner: Runner, echo: Echo) -> list[HostOutcome]:
    outcomes: list[HostOutcome] = []
    for name in request.order:
        first = not any(o.result == "passed" for o in outcomes)
        # The file holds the text read until a host's switch passes with the new one.
        file_text = request.old_text if first else request.new_text
        outcome = switch_one(request, name, file_text, runner, echo, restore_config=first)
        outcomes.append(outcome)
        if not outcome.ok:
            if not first:
                echo(
                    f"note: {request.path} keeps the change: hosts "
                    f"{', '.join(o.host for o in outcomes if o.result == 'passed')} run it; "
                    f"fix it and switch {name} again"
                )
            break
    return outcomes


def rollback(
    path: Path, host: str | None, opts: RollbackOptions, runner: Runner, echo: Echo
) -> int | None:
    """Serve an earlier generation again (``opts.to``; None: the newest good one before the
    current) and put its config back: the generation now serving (None after a dry run of a
    remote host's)."""

    def read() -> RollbackRequest:
        return RollbackRequest.read(path, HostChoice(host), opts)

    if runner.dry_run:
        return rollback_one(read(), runner, echo)
    with ExitStack() as locks:
        return rollback_one(read_locked(read, locks, opts.wait_s, "rollback", echo), runner, echo)


@contextmanager
def _stop_between_hosts(echo: Echo) -> Iterator[list[bool]]:
    """The first SIGINT or SIGTERM asks the rollout to stop once the hosts under way are
    done; a second one interrupts at once."""
    asked = [False]

    def handler(signum: int, frame: FrameType | None) -> None:
        if asked[0]:
            raise KeyboardInterrupt
        asked[0] = True
        echo(f"rollout: {signal.Signals(signum).name}: stopping after the hosts under way")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield asked
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def rolling_switch(
    path: Path,
    hosts: str | None,
    opts: SwitchOptions,
    rollout_opts: RolloutOptions,
    runner: Runner,
    echo: Echo,
) -> Rollout:
    """``switch --hosts a,b,c`` (or ``--all-hosts``, hosts None): see fleet.rollout."""
    opts.gate_kind(str(path))

    def read() -> SwitchRequest:
        return SwitchRequest.read(path, HostChoice(hosts=hosts, several=True), opts)

    def run(request: SwitchRequest) -> Rollout:
        ops = FleetOps(request, runner, echo)
        with _stop_between_hosts(echo) as asked:
            return run_rollout(request.order, rollout_opts, ops, echo, lambda: asked[0])

    if runner.dry_run:
        return run(read())
    with ExitStack() as locks:
        return run(read_locked(read, locks, opts.wait_s, "switch", echo))


def fleet_rollback(
    path: Path, hosts: str | None, opts: RollbackOptions, runner: Runner, echo: Echo
) -> list[HostOutcome]:
    """``rollback --hosts a,b``: each host back to ``opts.to`` (or its previous good
    generation), in the order given, stopping at the first that fails."""

    def read() -> RollbackRequest:
        return RollbackRequest.read(path, HostChoice(hosts=hosts, several=True), opts)

    def run(request: RollbackRequest) -> list[HostOutcome]:
        outcomes: list[HostOutcome] = []
        for host in request.order:
            rh = remote.remote_host(request.config, host)
            try:
                if rh is not None:
                    outcomes.append(
                        remote.remote_rollback(rh, opts.to, opts.timeout_s, runner, echo)
                    )
                    continue
                gen = rollback_host(request.of(host), runner, echo)
                outcomes.append(HostOutcome(host, "passed", gen.number))
            except (ExternalCommandError, UserError) as err:
                echo(f"{host}: {err}")
                outcomes.append(HostOutcome(host, "failed", None, str(err)))
                break
        return outcomes

    if runner.dry_run:
        return run(read())
    with ExitStack() as locks:
        return run(read_locked(read, locks, opts.wait_s, "rollback", echo))


__all__ = ["fleet_rollback", "rollback", "rolling_switch", "switch"]
