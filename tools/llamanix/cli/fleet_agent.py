"""llamanix CLI: ``fleet-agent``, hidden: the remote side of a fleet switch, which llamanix on
another machine runs over ssh (fleet/remote.py); fleet/agent.py does the work.

A controller's commands (``switch``, ``rollback``, ``status``, ``generations``, ``top``) take no
argument: each reads its request on stdin (fleet/protocol.py ``AgentRequest``), so that the
host's sudoers line names each exactly as it runs. Each prints the protocol it speaks first,
before it reads the request, so a controller of another protocol can name both; an argument
(what an older controller sends) is refused after that. ``unit-switch`` and ``unit-rollback``
are what the transient unit runs: no argument either, and nowhere but in that unit.

A rolling switch behind a gateway moves a drained replica's caches in steps
(fleet/cache_move.py): each is a request to ``switch`` that carries a ``cache`` step
instead of a config, so the sudoers line allows no command for them of its own. A step names an
instance of the host's own copy of the config, a file name ``save`` chose (checked against its
fixed pattern) or the gateway's routes: never a path.
"""

from __future__ import annotations

import json
from typing import Literal

import click

from llamanix.cli.options import Hosts, exit_with
from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject, JsonValue
from llamanix.external.process import Runner
from llamanix.fleet import agent
from llamanix.fleet.protocol import (
    ANSWER,
    DATA,
    EXIT_FAILED,
    EXIT_INCOMPATIBLE,
    GENERATIONS,
    PROTOCOL,
    AgentCommand,
    AgentRequest,
    CacheStep,
    RunReport,
    started_line,
)
from llamanix.fleet.rollout import DEFAULT_PREFLIGHT_TIMEOUT_S

# An older controller's options reach the callback, which says its protocol first.
_LENIENT = {"ignore_unknown_options": True, "allow_extra_args": True}


def _echo(line: str) -> None:
    click.echo(line)


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


@click.group("fleet-agent", hidden=True)
def fleet_agent() -> None:
    """The remote side of a fleet switch over ssh: llamanix runs it, not a person.

    The request arrives on stdin; the switch runs as the transient unit llamanix-fleet.service,
    and the last line of output is its outcome as JSON.
    """


def _begin(ctx: click.Context, command: AgentCommand) -> tuple[agent.FleetDir, AgentRequest]:
    """Say the protocol, read the request, and check the agent's directory."""
    click.echo(agent.hello().line())
    source = f"llamanix fleet-agent {command}"
    if ctx.args:
        _echo_err(
            f"{source}: {ctx.args[0]}: takes no argument: fleet protocol {PROTOCOL} reads its "
            "request on stdin (install the same llamanix on both sides)"
        )
        exit_with(EXIT_INCOMPATIBLE)
    stdin = click.get_text_stream("stdin")
    # A person at a terminal sends no request: never wait for one. A request is read as every
    # file is: bounded, and parsed by the one JSON reader (nesting, duplicate keys, NaN).
    text = "" if stdin.isatty() else stdin.read(file_reader.LIMIT + 1)
    if len(text) > file_reader.LIMIT:
        raise UserError(
            Problem(
                source,
                "stdin",
                f"the request is larger than {file_reader.LIMIT} bytes",
                "send the config and its options, nothing else",
            )
        )
    if text.strip():
        file_reader.parse_json(text, f"{source}: stdin")
        try:
            json.loads(text, parse_constant=_not_a_number)
        except ValueError as err:
            raise UserError(
                Problem(source, "stdin", str(err), "send numbers JSON allows")
            ) from None
    d = agent.FleetDir.here()
    if not text.strip():
        if command != "status":
            raise UserError(
                Problem(
                    source,
                    "",
                    "no request on stdin: a controller sends one",
                    f"run llamanix {command} from the controller",
                )
            )
        # Someone on the host asks how the last run ended: no host, the default follow.
        d.check_if_there()
        return d, AgentRequest(PROTOCOL, "")
    protocol = AgentRequest.protocol_of(text)
    if protocol != PROTOCOL:
        said = (
            "names no fleet protocol" if protocol is None else f"speaks fleet protocol {protocol}"
        )
        _echo_err(f"{source}: the request on stdin {said}, this agent {PROTOCOL}")
        exit_with(EXIT_INCOMPATIBLE)
    try:
        request = AgentRequest.parse(text, "stdin")
    except ValueError as err:
        raise UserError(Problem(source, "", str(err))) from None
    agent.check_name(request.host, f"{source}: stdin")
    d.check_if_there()
    return d, request


def _not_a_number(name: str) -> None:
    raise ValueError(f"the request holds {name}, which is no JSON number")


def _finish(d: agent.FleetDir, report: RunReport) -> None:
    click.echo(report.line())
    agent.mark_reported(d, report)
    exit_with(EXIT_FAILED if report.op is not None and not report.ok else 0)


def _missing(command: AgentCommand, what: Literal["order", "rollback"]) -> UserError:
    return UserError(
        Problem(f"llamanix fleet-agent {command}: stdin", what, "is missing from the request")
    )


@fleet_agent.command("switch", context_settings=_LENIENT)
@click.pass_context
def switch(ctx: click.Context, /) -> None:
    """Switch this host to the config in the request, with its options, gated, in a unit of
    its own systemd."""
    d, request = _begin(ctx, "switch")
    if request.cache is not None:
        if request.order is not None:
            raise UserError(
                Problem(
                    "llamanix fleet-agent switch: stdin",
                    "cache",
                    "comes with an order: a request is a switch or a step of a cache move",
                )
            )
        _cache_step(d, request.host, request.cache)
        return
    if request.order is None:
        raise _missing("switch", "order")
    order = request.order
    record = agent.start_switch(d, request.host, order, Runner(echo=_echo), _echo)
    click.echo(started_line(record.run))
    _finish(d, agent.follow(d, record, _echo, order.options.follow_s))


# --- a rolling switch's cache move (switch/cache_moves.py) ---------------------------------------


def _answer(value: object) -> None:
    click.echo(ANSWER + json.dumps(value))


def _step_order(step: CacheStep, source: str) -> JsonObject:
    try:
        order: JsonValue = json.loads(step.order)
    except ValueError as err:
        raise UserError(Problem(source, "cache.order", f"not JSON: {err}")) from None
    if not isinstance(order, dict):
        raise UserError(Problem(source, "cache.order", "not a JSON object"))
    return order


def _field(order: JsonObject, name: str, source: str) -> str:
    """A name the step's order must carry: missing or not a string is refused, never read as
    the name "None"."""
    value = order.get(name)
    if not isinstance(value, str):
        raise UserError(Problem(source, f"cache.order.{name}", "is missing or not a string"))
    return value


def _cache_step(d: agent.FleetDir, host: str, step: CacheStep) -> None:
    """Run one step of a cache move with the host's own copy of the config; its answer."""
    from llamanix.switch import cache_moves

    source = f"llamanix fleet-agent switch: stdin: cache step {step.step}"
    order = _step_order(step, source)
    found = agent.local_config(d, host)
    if found is None:
        raise UserError(
            Problem(
                str(d.root),
                "",
                f"no fleet copy of a config that names host '{host}' on this host",
                "switch this host once from the controller with llamanix switch",
            )
        )
    config = found[1]
    if step.step == "save":
        _answer(cache_moves.save(config, host, _field(order, "instance", source), source))
    elif step.step == "send":
        lines = cache_moves.send(
            config,
            host,
            _field(order, "instance", source),
            _field(order, "file", source),
            source,
            order.get("offset", 0),
            order.get("discard") is True,
        )
        last = None
        for line in lines:
            if last is not None:
                click.echo(DATA + last)
            last = line
        _answer(json.loads(last) if last is not None else {})
    elif step.step == "take":
        chunks = (line.strip() for line in step.data if line.strip())
        _answer(cache_moves.take(config, host, order, chunks, source))
    else:
        if config.gateway is None or config.gateway.host != host:
            raise UserError(Problem(str(d.root), "", f"host '{host}' runs no gateway"))
        _answer(cache_moves.route(order))


@fleet_agent.command("rollback", context_settings=_LENIENT)
@click.pass_context
def rollback(ctx: click.Context) -> None:
    """Serve an earlier generation of this host again, with the request's options, in a unit
    of its own systemd."""
    d, request = _begin(ctx, "rollback")
    if request.rollback is None:
        raise _missing("rollback", "rollback")
    opts = request.rollback
    record = agent.start_rollback(d, request.host, opts, Runner(echo=_echo), _echo)
    click.echo(started_line(record.run))
    _finish(d, agent.follow(d, record, _echo, opts.follow_s))


@fleet_agent.command("status", context_settings=_LENIENT)
@click.pass_context
def status(ctx: click.Context) -> None:
    """How the last fleet switch or rollback here ended (following one that still runs, for
    the request's follow_timeout_s at most)."""
    d, request = _begin(ctx, "status")
    follow_s = request.follow_timeout_s
    if follow_s is None:
        follow_s = DEFAULT_PREFLIGHT_TIMEOUT_S
    _finish(d, agent.status(d, _echo, follow_s))


@fleet_agent.command("generations", context_settings=_LENIENT)
@click.pass_context
def generations(ctx: click.Context) -> None:
    """This host's generations, as `llamanix generations --json` lists them."""
    d, request = _begin(ctx, "generations")
    click.echo(GENERATIONS + json.dumps(agent.generations(d, request.host)))


@fleet_agent.command("top", context_settings=_LENIENT)
@click.pass_context
def top(ctx: click.Context) -> None:
    """This host's `llamanix top --once --json`, read with the fleet's copy of the config
    (what `llamanix top` on the controller shows of this host)."""
    from llamanix.cli.top_view import run_top

    d, request = _begin(ctx, "top")
    found = agent.local_config(d, request.host)
    if found is None:
        raise UserError(
            Problem(
                str(d.root),
                "",
                "no fleet copy of the config on this host",
                "switch this host once from the controller with llamanix switch",
            )
        )
    window = request.window_s or 0.0
    code = run_top(
        found[0], Hosts(name=request.host), once=True, as_json=True, interval=0.0, window=window
    )
    if code:
        exit_with(code)


@fleet_agent.command("unit-switch")
def unit_switch() -> None:
    """The switch as its transient unit runs it, with what its agent kept (progress on
    stderr: the journal)."""
    outcome = agent.unit_switch(agent.FleetDir.here(), _echo_err)
    exit_with(0 if outcome.ok else EXIT_FAILED)


@fleet_agent.command("unit-rollback")
def unit_rollback() -> None:
    """The rollback as its transient unit runs it (progress on stderr: the journal)."""
    outcome = agent.unit_rollback(agent.FleetDir.here(), _echo_err)
    exit_with(0 if outcome.ok else EXIT_FAILED)


def register(group: click.Group) -> None:
    """Add this module's commands to the main group."""
    group.add_command(fleet_agent)
