"""What ``switch`` and ``rollback`` do, for one host or several: read the config once, lock the
hosts, and switch or roll back each where it lives (fleet.dispatch). The rolling switch's
order, batches and stopping rules are fleet.rollout's."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.external import ssh
from llamanix.external.process import Runner
from llamanix.fleet import remote
from llamanix.fleet.cache_move import CacheMoves
from llamanix.fleet.dispatch import FleetOps, rollback_one, switch_one
from llamanix.fleet.rollout import Rollout, RolloutOptions, plan_batches, run_rollout
from llamanix.switch.request import HostChoice, RollbackRequest, SwitchRequest, locked
from llamanix.switch.rollback import rollback_host
from llamanix.switch.switch_records import Echo, HostOutcome, RollbackOptions, SwitchOptions


def switch_one_host(
    path: Path,
    host: str | None,
    opts: SwitchOptions,
    runner: Runner,
    echo: Echo,
    new_text: str | None = None,
) -> HostOutcome:
    """Switch one host (None: the config's only one); several are a rollout
    (``rolling_switch``). ``new_text``: switch to this text instead of the file's with --set
    applied.

    The host's lock is held for the whole switch (--wait: how long to wait for another
    switch, rollback or pin to finish); the config is read before it, and again under it only
    when another command wrote it meanwhile (see ``locked``). A dry run changes nothing and
    locks nothing."""
    request = SwitchRequest.read(path, HostChoice(host), opts, new_text)
    with locked(
        request, dry_run=runner.dry_run, wait_s=opts.wait_s, command="switch", echo=echo
    ) as request:
        return switch_one(request, request.hosts[0], request.old_text, runner, echo)


def rollback_one_host(
    path: Path, host: str | None, opts: RollbackOptions, runner: Runner, echo: Echo
) -> int | None:
    """Serve an earlier generation again (``opts.to``; None: the newest good one before the
    current) and put its config back: the generation now serving (None after a dry run of a
    remote host's)."""
    request = RollbackRequest.read(path, HostChoice(host), opts)
    with locked(
        request, dry_run=runner.dry_run, wait_s=opts.wait_s, command="rollback", echo=echo
    ) as request:
        return rollback_one(request, runner, echo)


@contextmanager
def _stop_between_hosts(echo: Echo) -> Iterator[list[bool]]:
    """The first SIGINT or SIGTERM asks the rollout to stop once the hosts under way are
    done; a second one interrupts at once."""
    asked = [False]

    def handler(signum: int, frame: FrameType | None) -> None:
        if asked[0]:
            # The hosts under way talk to ssh in sessions of their own, which the signal
            # did not reach: end them, so that the batch ends now, not when they do.
            ssh.stop_all()
            raise KeyboardInterrupt
        asked[0] = True
        echo(f"rollout: {signal.Signals(signum).name}: stopping after the hosts under way")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield asked
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        ssh.allow_again()


def rolling_switch(
    path: Path,
    hosts: str | None,
    opts: SwitchOptions,
    rollout_opts: RolloutOptions,
    runner: Runner,
    echo: Echo,
) -> Rollout:
    """``switch --hosts a,b,c`` (or ``--all-hosts``, hosts None): see fleet.rollout."""
    request = SwitchRequest.read(path, HostChoice(hosts=hosts, several=True), opts)
    with locked(
        request, dry_run=runner.dry_run, wait_s=opts.wait_s, command="switch", echo=echo
    ) as request:
        return _roll_out(request, rollout_opts, runner, echo)


def _roll_out(
    request: SwitchRequest, rollout_opts: RolloutOptions, runner: Runner, echo: Echo
) -> Rollout:
    moves = None
    if request.config.gateway is not None:
        batches = plan_batches(request.order, rollout_opts.batch)
        old = request.old_config or request.config
        moves = CacheMoves(old, request.config, batches, runner, echo)
    ops = FleetOps(request, runner, echo, rollout_opts.preflight_timeout_s, moves)
    with _stop_between_hosts(echo) as asked:
        return run_rollout(request.order, rollout_opts, ops, echo, lambda: asked[0])


def fleet_rollback(
    path: Path, hosts: str | None, opts: RollbackOptions, runner: Runner, echo: Echo
) -> list[HostOutcome]:
    """``rollback --hosts a,b``: each host back to ``opts.to`` (or its previous good
    generation), in the order given, stopping at the first that fails."""
    request = RollbackRequest.read(path, HostChoice(hosts=hosts, several=True), opts)
    with locked(
        request, dry_run=runner.dry_run, wait_s=opts.wait_s, command="rollback", echo=echo
    ) as request:
        return _roll_back_in_order(request, runner, echo)


def _roll_back_in_order(request: RollbackRequest, runner: Runner, echo: Echo) -> list[HostOutcome]:
    outcomes: list[HostOutcome] = []
    for host in request.order:
        rh = remote.remote_host(request.config, host)
        try:
            if rh is not None:
                outcomes.append(remote.remote_rollback(rh, request.opts, runner, echo))
                continue
            gen = rollback_host(request.of(host), runner, echo)
            outcomes.append(HostOutcome(host, "passed", gen.number))
        except (ExternalCommandError, UserError) as err:
            echo(f"{host}: {err}")
            outcomes.append(HostOutcome(host, "failed", None, str(err)))
            break
    return outcomes


__all__ = ["fleet_rollback", "rollback_one_host", "rolling_switch", "switch_one_host"]
