"""llamanix CLI: ``fleet-agent``, hidden: the remote side of a fleet switch, which llamanix on
another machine runs over ssh (deploy/fleet/remote.py); deploy/fleet/agent.py does the work.

Each command prints the protocol it speaks first, before it checks ``--protocol``, so a
controller of another protocol can name both; options it does not know are refused only after
that check (a newer controller's would otherwise read as a usage error). ``unit-switch`` and
``unit-rollback`` are what the transient unit runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from llamanix.cli.options import OneOf, exit_with
from llamanix.core.errors import Problem, UserError
from llamanix.deploy.fleet import agent
from llamanix.deploy.fleet.protocol import (
    ANSWER,
    DATA,
    EXIT_FAILED,
    EXIT_INCOMPATIBLE,
    FORMATS,
    GENERATIONS,
    PROTOCOL,
    ConfigFormat,
    RunReport,
    SwitchOrder,
    started_line,
)
from llamanix.deploy.fleet.rollout import DEFAULT_PREFLIGHT_TIMEOUT_S
from llamanix.deploy.switch_records import DEFAULT_TIMEOUT_S, RollbackOptions
from llamanix.external.process import Runner

F = TypeVar("F", bound=Callable[..., Any])
# Options of a newer controller reach the callback, which checks the protocol first.
_LENIENT = {"ignore_unknown_options": True, "allow_extra_args": True}


def _echo(line: str) -> None:
    click.echo(line)


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


@click.group("fleet-agent", hidden=True)
def fleet_agent() -> None:
    """The remote side of a fleet switch over ssh: llamanix runs it, not a person.

    The config arrives on stdin; the switch runs as the transient unit llamanix-fleet.service,
    and the last line of output is its outcome as JSON.
    """


def _agent_options(f: F) -> F:
    f = click.option("--host", required=True, help="The host this machine is.")(f)
    return click.option("--protocol", type=int, required=True, help="The controller's protocol.")(f)


def _begin(ctx: click.Context, protocol: int) -> agent.FleetDir:
    click.echo(agent.hello().line())
    if protocol != PROTOCOL:
        exit_with(EXIT_INCOMPATIBLE)
    if ctx.args:
        raise UserError(
            Problem(
                f"llamanix fleet-agent {ctx.info_name}",
                ctx.args[0],
                "not an option of this fleet agent",
                "check that both sides run the same llamanix",
            )
        )
    return agent.FleetDir.here()


def _finish(d: agent.FleetDir, report: RunReport) -> None:
    click.echo(report.line())
    agent.mark_reported(d, report)
    exit_with(EXIT_FAILED if report.op is not None and not report.ok else 0)


_FORMAT = click.option("--format", "fmt", type=OneOf(FORMATS), default="toml")


@fleet_agent.command("switch", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def switch(ctx: click.Context, /, protocol: int, host: str) -> None:
    """Switch this host to the config on stdin with the options there (a SwitchOrder as
    JSON), gated, in a unit of its own systemd."""
    d = _begin(ctx, protocol)
    source = "llamanix fleet-agent switch: stdin"
    try:
        order = SwitchOrder.parse(click.get_text_stream("stdin").read(), source)
    except ValueError as err:
        raise UserError(Problem(source, "", str(err).removeprefix(f"{source}: "))) from None
    record = agent.start_switch(d, host, order, Runner(echo=_echo), _echo)
    click.echo(started_line(record.run))
    _finish(d, agent.follow(d, record, _echo, order.options.follow_s))


@fleet_agent.command("rollback", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def rollback(ctx: click.Context, protocol: int, host: str) -> None:
    """Serve an earlier generation of this host again, with the options on stdin (a
    RollbackOptions as JSON), in a unit of its own systemd."""
    d = _begin(ctx, protocol)
    source = "llamanix fleet-agent rollback: stdin"
    try:
        opts = RollbackOptions.from_json(json.loads(click.get_text_stream("stdin").read()), "")
    except ValueError as err:
        raise UserError(Problem(source, "", str(err))) from None
    record = agent.start_rollback(d, host, opts, Runner(echo=_echo), _echo)
    click.echo(started_line(record.run))
    _finish(d, agent.follow(d, record, _echo, opts.follow_s))


@fleet_agent.command("status", context_settings=_LENIENT)
@click.pass_context
@_agent_options
@click.option(
    "--follow-timeout",
    "follow_s",
    type=click.FloatRange(min=0),
    default=DEFAULT_PREFLIGHT_TIMEOUT_S,
    help="Follow a run that still goes on this long at most.",
)
def status(ctx: click.Context, protocol: int, host: str, follow_s: float) -> None:
    """How the last fleet switch or rollback here ended (following one that still runs)."""
    d = _begin(ctx, protocol)
    _finish(d, agent.status(d, _echo, follow_s))


@fleet_agent.command("generations", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def generations(ctx: click.Context, protocol: int, host: str) -> None:
    """This host's generations, as `llamanix generations --json` lists them."""
    d = _begin(ctx, protocol)
    click.echo(GENERATIONS + json.dumps(agent.generations(d, host)))


@fleet_agent.command("top", context_settings=_LENIENT)
@click.pass_context
@_agent_options
@click.option(
    "--window",
    type=click.FloatRange(min=0.0),
    default=0.0,
    help="Read twice this many seconds apart and take the rates over that window.",
)
def top(ctx: click.Context, protocol: int, host: str, window: float) -> None:
    """This host's `llamanix top --once --json`, read with the fleet's copy of the config
    (what `llamanix top` on the controller shows of this host)."""
    from llamanix.cli.top_view import run_top

    d = _begin(ctx, protocol)
    config = d.existing_config()
    if config is None:
        raise UserError(
            Problem(
                str(d.root),
                "",
                "no fleet copy of the config on this host",
                "switch this host once from the controller with llamanix switch",
            )
        )
    code = run_top(config, host, once=True, as_json=True, interval=0.0, window=window)
    if code:
        exit_with(code)


# --- a rolling switch's cache move (deploy/cache_moves.py) ---------------------------------------


def _answer(value: object) -> None:
    click.echo(ANSWER + json.dumps(value))


def _order(command: str, stdin: Any = None) -> dict[str, Any]:
    """The first line of stdin, a JSON object (``stdin``: the stream the rest is read from,
    too: another wrapper of the same file would start after what this one read ahead)."""
    source = f"llamanix fleet-agent {command}: stdin"
    stream = stdin if stdin is not None else click.get_text_stream("stdin")
    try:
        order = json.loads(stream.readline())
    except ValueError as err:
        raise UserError(Problem(source, "", f"not JSON: {err}")) from None
    if not isinstance(order, dict):
        raise UserError(Problem(source, "", "not a JSON object"))
    return order


def _host_config(d: agent.FleetDir, host: str) -> Any:
    from llamanix.deploy.config_edit import lenient_parse

    path = d.existing_config()
    config = lenient_parse(path, path.read_text()) if path is not None else None
    if config is None or host not in config.hosts:
        raise UserError(
            Problem(
                str(d.root),
                "",
                f"no fleet copy of a config that names host '{host}' on this host",
                "switch this host once from the controller with llamanix switch",
            )
        )
    return config


@fleet_agent.command("caches-save", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def caches_save(ctx: click.Context, protocol: int, host: str) -> None:
    """Save the caches of the instance on stdin ({"instance": NAME}), stamped, for a move."""
    from llamanix.deploy import cache_moves

    d = _begin(ctx, protocol)
    order = _order("caches-save")
    config = _host_config(d, host)
    source = "llamanix fleet-agent caches-save: stdin"
    _answer(cache_moves.save(config, host, str(order.get("instance")), source))


@fleet_agent.command("caches-send", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def caches_send(ctx: click.Context, protocol: int, host: str) -> None:
    """Print one saved file of a move ({"instance": NAME, "file": FILE} on stdin) as data
    lines, then delete it."""
    from llamanix.deploy import cache_moves

    d = _begin(ctx, protocol)
    order = _order("caches-send")
    config = _host_config(d, host)
    source = "llamanix fleet-agent caches-send: stdin"
    lines = cache_moves.send(
        config, host, str(order.get("instance")), str(order.get("file")), source
    )
    last = None
    for line in lines:
        if last is not None:
            click.echo(DATA + last)
        last = line
    _answer(json.loads(last) if last is not None else {})


@fleet_agent.command("caches-take", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def caches_take(ctx: click.Context, protocol: int, host: str) -> None:
    """Restore a moved file into an idle slot: its header (JSON) on stdin's first line, then
    its bytes as base64 lines."""
    from llamanix.deploy import cache_moves

    d = _begin(ctx, protocol)
    stdin = click.get_text_stream("stdin")
    header = _order("caches-take", stdin)
    config = _host_config(d, host)
    chunks = (line.strip() for line in stdin if line.strip())
    source = "llamanix fleet-agent caches-take: stdin"
    _answer(cache_moves.take(config, host, header, chunks, source))


@fleet_agent.command("gateway-route", context_settings=_LENIENT)
@click.pass_context
@_agent_options
def gateway_route(ctx: click.Context, protocol: int, host: str) -> None:
    """Hand this host's gateway the routes on stdin (draining replicas, moved conversations)
    and wait until it applied them."""
    from llamanix.deploy import cache_moves

    d = _begin(ctx, protocol)
    routes = _order("gateway-route")
    config = _host_config(d, host)
    if config.gateway is None or config.gateway.host != host:
        raise UserError(Problem(str(d.root), "", f"host '{host}' runs no gateway"))
    _answer(cache_moves.route(routes))


_DIR = click.option(
    "--dir", "root", required=True, type=click.Path(path_type=Path, file_okay=False)
)


@fleet_agent.command("unit-switch")
@click.option("--host", required=True)
@_DIR
@_FORMAT
def unit_switch(host: str, root: Path, fmt: ConfigFormat) -> None:
    """The switch as its transient unit runs it, with the options its agent kept (progress
    on stderr: the journal)."""
    d = agent.FleetDir(root, agent.FleetDir.here().user)
    outcome = agent.unit_switch(d, host, fmt, _echo_err)
    exit_with(0 if outcome.ok else EXIT_FAILED)


@fleet_agent.command("unit-rollback")
@click.option("--host", required=True)
@_DIR
@click.option("--to", type=int)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=DEFAULT_TIMEOUT_S)
def unit_rollback(host: str, root: Path, to: int | None, timeout_s: float) -> None:
    """The rollback as its transient unit runs it (progress on stderr: the journal)."""
    d = agent.FleetDir(root, agent.FleetDir.here().user)
    outcome = agent.unit_rollback(d, host, to, timeout_s, _echo_err)
    exit_with(0 if outcome.ok else EXIT_FAILED)


def register(group: click.Group) -> None:
    """Add this module's commands to the main group."""
    group.add_command(fleet_agent)
