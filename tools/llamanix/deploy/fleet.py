"""The rolling switch bound to real hosts: read the config once, lock the hosts, and switch,
roll back or list each through the one-host paths (local, NixOS, or a remote plain-systemd host
over ssh). The order, batches and stopping rules are deploy.rollout's."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.deploy import remote
from llamanix.deploy.rollout import (
    Echo,
    HostOps,
    Rollout,
    RolloutOptions,
    Unreachable,
    parse_hosts,
    run_rollout,
)
from llamanix.deploy.switch import (
    ALL_HOSTS,
    HostOutcome,
    RollbackRequest,
    SwitchOptions,
    SwitchRequest,
    read_locked,
    rollback_locked,
    switch_any_host,
)
from llamanix.external.process import Runner


def choose_hosts(config_hosts: tuple[str, ...], hosts: str | None, source: str) -> tuple[str, ...]:
    """``--hosts a,b`` in the order given, or every host in config order (None)."""
    return config_hosts if hosts is None else parse_hosts(hosts, config_hosts, source)


@dataclass
class _FleetOps(HostOps):
    request: SwitchRequest
    runner: Runner
    echo: Echo

    def _remote(self, host: str) -> remote.RemoteHost | None:
        return remote.remote_host(self.request.config, host)

    def preflight(self, host: str) -> None:
        rh = self._remote(host)
        if rh is None:
            return
        if self.runner.dry_run:
            self.runner.echo(shlex.join(remote.remote_argv(rh, "status", ())))
            return
        try:
            # How its last run ended: the report of a switch whose ssh was lost comes here.
            self.echo(f"{host}: {remote.remote_status(rh, self.runner, self.echo)}")
        except remote.RemoteUnreachable as err:
            raise UserError(
                Problem(
                    str(self.request.path),
                    f"hosts.{host}.target",
                    f"{err}; no host was switched",
                    f"bring {rh.target} back, or leave {host} out of --hosts",
                )
            ) from err

    def switch(self, host: str, first: bool) -> HostOutcome:
        # The file holds the text read until the canary passes with the new one.
        file_text = self.request.old_text if first else self.request.new_text
        try:
            return switch_any_host(
                self.request, host, file_text, self.runner, self.echo, restore_config=first
            )
        except remote.RemoteUnreachable as err:
            raise Unreachable(str(err)) from err

    def rollback(self, host: str, to: int) -> HostOutcome:
        rh = self._remote(host)
        if rh is not None:
            return remote.remote_rollback(
                rh, to, self.request.opts.timeout_s, self.runner, self.echo
            )
        req = self.request
        gen = rollback_locked(
            RollbackRequest(
                req.source,
                req.config,
                host,
                to,
                req.opts.manager,
                req.opts.units_dir,
                req.opts.timeout_s,
            ),
            self.runner,
            self.echo,
        )
        return HostOutcome(host, "passed", gen.number)


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
    """``switch --hosts a,b,c`` (or ``--all-hosts``, hosts None): see deploy.rollout."""
    opts.gate_kind(str(path))

    def read() -> SwitchRequest:
        request = SwitchRequest.read(path, ALL_HOSTS, opts)
        chosen = choose_hosts(request.hosts, hosts, str(path))
        # Locked in config order (two callers never deadlock); switched in the order given.
        return replace(request, hosts=tuple(h for h in request.hosts if h in chosen))

    def run(request: SwitchRequest) -> Rollout:
        order = choose_hosts(tuple(request.config.hosts), hosts, str(path))
        ops = _FleetOps(request, runner, echo)
        with _stop_between_hosts(echo) as asked:
            return run_rollout(order, rollout_opts, ops, echo, lambda: asked[0])

    if runner.dry_run:
        return run(read())
    with ExitStack() as locks:
        return run(read_locked(read, locks, opts.wait_s, "switch", echo))


def fleet_rollback(
    path: Path,
    hosts: str | None,
    to: int | None,
    opts: SwitchOptions,
    runner: Runner,
    echo: Echo,
) -> list[HostOutcome]:
    """``rollback --hosts a,b``: each host back to ``to`` (or its previous good generation), in
    the order given, stopping at the first that fails."""

    def read() -> SwitchRequest:
        request = SwitchRequest.read(path, ALL_HOSTS, opts)
        chosen = choose_hosts(request.hosts, hosts, str(path))
        return replace(request, hosts=tuple(h for h in request.hosts if h in chosen))

    def run(request: SwitchRequest) -> list[HostOutcome]:
        outcomes: list[HostOutcome] = []
        for host in choose_hosts(tuple(request.config.hosts), hosts, str(path)):
            rh = remote.remote_host(request.config, host)
            try:
                if rh is not None:
                    outcomes.append(remote.remote_rollback(rh, to, opts.timeout_s, runner, echo))
                    continue
                gen = rollback_locked(
                    RollbackRequest(
                        request.source,
                        request.config,
                        host,
                        to,
                        opts.manager,
                        opts.units_dir,
                        opts.timeout_s,
                    ),
                    runner,
                    echo,
                )
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


__all__ = ["choose_hosts", "fleet_rollback", "rolling_switch"]
