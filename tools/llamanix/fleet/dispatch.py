"""Each host switched or rolled back where it lives: here (switch.transaction, switch.rollback; a
NixOS host through nixos-rebuild --target-host) or, for a remote plain-systemd host, by its own
llamanix over ssh (fleet.remote). The rollout's ``HostOps`` bound to them."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from llamanix.core import file_reader
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external.process import Runner
from llamanix.fleet import remote
from llamanix.fleet.cache_move import CacheMoves
from llamanix.fleet.rollout import HostOps, Lost, Unreachable
from llamanix.state.config_edit import write_config
from llamanix.switch.request import HostChoice, RollbackRequest, SwitchRequest
from llamanix.switch.rollback import rollback_host
from llamanix.switch.switch_records import Echo, HostOutcome, RollbackOptions
from llamanix.switch.transaction import switch_host


def switch_one(
    request: SwitchRequest,
    name: str,
    file_text: str,
    runner: Runner,
    echo: Echo,
    restore_config: bool = True,
) -> HostOutcome:
    """Switch one host, here (``switch_host``) or, for a remote plain-systemd host, by its own
    llamanix over ssh (``remote_switch``: it keeps its generations and restores itself when
    its gate fails). Once a remote host passes, the config file gets the new text, as a local
    host's switch writes it; one that fails leaves the file alone, so ``restore_config`` has
    nothing to put back. ``RemoteUnreachable`` when ssh cannot reach the host."""
    rh = remote.remote_host(request.config, name)
    if rh is None:
        return switch_host(request, name, file_text, runner, echo, restore_config)
    outcome = remote.remote_switch(rh, request.new_text, request.opts, runner, echo)
    if file_text != request.new_text:
        if runner.dry_run:
            runner.note(f"write {request.path} once {name} passes")
        elif outcome.result == "passed":
            write_config(request.path, request.new_text)
    return outcome


def rollback_one(request: RollbackRequest, runner: Runner, echo: Echo) -> int | None:
    """The generation now serving (None: a dry run of a remote host's rollback). A remote
    plain-systemd host rolls back by its own llamanix over ssh, from its own generations; the
    config file here is left as it is (it names every host, the generation's copy there
    names that one as local)."""
    rh = remote.remote_host(request.config, request.host)
    if rh is None:
        return rollback_host(request, runner, echo).number
    outcome = remote.remote_rollback(rh, request.opts, runner, echo)
    if runner.dry_run:
        return None
    if not outcome.ok:
        raise ExternalCommandError(f"{rh.name}: {outcome.detail}")
    return outcome.generation


@dataclass
class FleetOps(HostOps):
    """The rollout's hosts, switched and rolled back through the one-host paths."""

    request: SwitchRequest
    runner: Runner
    echo: Echo
    # How long the preflight follows a run that still goes on on a host.
    preflight_s: float
    # Behind a gateway: each replica's caches move before its host's switch.
    moves: CacheMoves | None = None

    def _remote(self, host: str) -> remote.RemoteHost | None:
        return remote.remote_host(self.request.config, host)

    def last_run(self, host: str) -> None:
        rh = self._remote(host)
        if rh is None:
            return
        if self.runner.dry_run:
            self.runner.echo(shlex.join(remote.remote_argv(rh, "status")))
            request = remote.agent_request(rh, follow_timeout_s=self.preflight_s)
            self.runner.note(f"on ssh's stdin: {request}")
            return
        try:
            # How its last run ended: the report of a switch whose ssh was lost comes here.
            report = remote.remote_status(rh, self.preflight_s, self.runner, self.echo)
        except remote.RemoteUnreachable as err:
            raise Unreachable(str(err)) from err
        if report.running:
            raise UserError(
                Problem(
                    host,
                    "",
                    f"the {report.summary()} there after {self.preflight_s:g} s "
                    "(--preflight-timeout)",
                    f"let it end (`llamanix fleet-agent status` on {rh.target} follows it), or "
                    "raise --preflight-timeout",
                )
            )
        self.echo(f"{host}: {report.summary()}")

    def switch(self, host: str, first: bool) -> HostOutcome:
        # The file holds the text read until the canary passes with the new one.
        file_text = self.request.old_text if first else self.request.new_text
        caches = self.moves.before(host) if self.moves is not None else {}
        try:
            outcome = switch_one(
                self.request, host, file_text, self.runner, self.echo, restore_config=first
            )
        except remote.RemoteLost as err:
            raise Lost(str(err)) from err
        except remote.RemoteUnreachable as err:
            raise Unreachable(str(err)) from err
        finally:
            if self.moves is not None:
                self.moves.after(host)
        return replace(outcome, caches=caches) if caches else outcome

    def rollback(self, host: str, to: int) -> HostOutcome:
        request = rollback_request(self.request, host, to)
        rh = self._remote(host)
        if rh is not None:
            return remote.remote_rollback(rh, request.opts, self.runner, self.echo)
        gen = rollback_host(request, self.runner, self.echo)
        return HostOutcome(host, "passed", gen.number)

    def config_back(self) -> None:
        req = self.request
        if req.old_text == req.new_text:
            return
        if file_reader.read_text(req.path, source=str(req.path)) != req.new_text:
            return
        write_config(req.path, req.old_text)
        self.echo(f"rollout: {req.path} has its text from before the rollout again")


def rollback_request(request: SwitchRequest, host: str, to: int | None) -> RollbackRequest:
    """A rollback of ``host`` from a switch's request: the same file, parse and options."""
    o = request.opts
    opts = RollbackOptions(
        to, o.timeout_s, o.wait_s, o.manager, o.units_dir, o.run_timeout_s, o.follow_timeout_s
    )
    return RollbackRequest(request.source, request.config, (host,), (host,), opts, HostChoice(host))
