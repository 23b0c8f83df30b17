"""llamanix CLI commands: deploy (up, switch, rollback, tidy, generations; pin, which `variant`
holds)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.table import Table

from llamanix.cli.console import console
from llamanix.cli.fleet import EXIT_INTERRUPTED, print_rollout
from llamanix.cli.host_flag import host_flag
from llamanix.cli.options import (
    DIRECTORY,
    FILE,
    Hosts,
    OneOf,
    config_argument,
    config_option,
    deprecated,
    dry_run_flag,
    exit_with,
    fail,
    hidden_alias,
    host_option,
    hosts_option,
    json_flag,
    refuse_swapped,
    timeout_option,
)
from llamanix.cli.switch_options import PIN_WAIT, WAIT, rollback_options, switch_options
from llamanix.config.host_choice import pick_host
from llamanix.config.model import load_config
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import from_json_or_none
from llamanix.external.process import Runner
from llamanix.fleet import commands, remote
from llamanix.fleet.rollout import (
    DEFAULT_PREFLIGHT_TIMEOUT_S,
    ON_FAILURE,
    OnFailure,
    RolloutOptions,
)
from llamanix.hosts import listing, managers
from llamanix.hosts.supervisor import DEFAULT_START_TIMEOUT_S, Supervisor
from llamanix.plan import pin as pin_module
from llamanix.render.host_render import render_host, with_source_revisions
from llamanix.state.generations import GenerationRecord, HostState
from llamanix.state.host_lock import units_lock
from llamanix.switch.request import parse_hosts
from llamanix.switch.switch_records import DEFAULT_TIMEOUT_S, RollbackOptions, SwitchOptions

Command = Callable[..., Any]


def _echo(line: str) -> None:
    click.echo(line)


def _echo_err(line: str) -> None:
    """Progress lines while stdout carries JSON."""
    click.echo(line, err=True)


@click.command()
@config_argument()
@host_option()
@click.option(
    "--units-dir",
    type=DIRECTORY,
    help="Render directory to run and watch (default: .llamanix-state/HOST/up beside CONFIG).",
)
@timeout_option(
    DEFAULT_START_TIMEOUT_S,
    "Seconds an instance may take to answer /health before the start counts as failed.",
)
@hidden_alias("--start-timeout", "start_timeout", type=float)
def up(
    config: Path,
    host: str | None,
    units_dir: Path | None,
    timeout_s: float,
    start_timeout: float | None,
) -> None:
    """Run a host's instances in the foreground, restarting them like their units say.

    The config is rendered into the units directory, then that directory is watched:
    `llamanix switch --manager up` writes a new render there and the instances whose
    command line changed are restarted. Ctrl-C (or SIGTERM) stops them all.
    """
    cfg = load_config(config)
    with host_flag(host):
        name = pick_host(cfg, host)
    managers.refuse_router_under_up(cfg, name)
    directory = units_dir or HostState.beside(config, name).up_dir
    timeout_s = deprecated(timeout_s, start_timeout, "--start-timeout", "--timeout")
    supervisor = Supervisor(directory, start_timeout_s=timeout_s, log=_echo)
    render = with_source_revisions(render_host(cfg, name), cfg, from_flake=False)
    manager = managers.UpManager(directory)
    # Writing the directory's units is what a switch of it does: not while one is under way.
    with units_lock(directory, str(config), command="up"):
        supervisor.claim()
        managers.install_files(
            Runner(echo=_echo),
            directory,
            render.files(),
            manager.installed().files,
            managers.is_render_file,
        )
    click.echo(f"up: {len(render.instances)} instance(s) of host {name} from {directory}")
    supervisor.run()


@click.command()
@config_argument()
@hosts_option(old=("--hosts", "--all-hosts"))
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Rolling switch: hosts switched at once after the canary.",
)
@click.option(
    "--on-failure",
    type=OneOf(ON_FAILURE),
    default="stop",
    show_default=True,
    help="Rolling switch: on the first host that fails (or whatever else ends the rollout: a "
    "host refused or lost, a Ctrl-C), stop (that host rolls itself back), or also put the "
    "hosts already switched, and the config file, back (rollback-all).",
)
@click.option(
    "--preflight-timeout",
    "preflight_timeout_s",
    type=click.FloatRange(min=0),
    default=DEFAULT_PREFLIGHT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="Rolling switch: follow a run that still goes on on a remote host this long at most "
    "before that host is refused (and no host switched).",
)
@dry_run_flag("Print the commands a real run would execute.")
@json_flag
@switch_options
def switch(
    config: Path,
    host: Hosts,
    batch: int,
    on_failure: OnFailure,
    preflight_timeout_s: float,
    dry_run: bool,
    as_json: bool,
    opts: SwitchOptions,
) -> None:
    """Change what a host runs, gate it, and roll back when the gate fails (exit 1).

    --host A,B (or all, every host in config order): A rolling switch of these hosts, in this
    order: the first is the canary. Then --batch hosts at a time, each gated; the first
    failure stops the rollout (that host rolls itself back, the hosts not reached stay
    untouched) and exits 1. Remote plain-systemd hosts
    (a `target`) run their own llamanix over ssh. It ends with one table: host, generation
    before -> after, verdict, time out of service. Ctrl-C between hosts stops cleanly.

    With --json, progress goes to stderr and stdout gets one object per host: outcome,
    generation, and each gated instance's result (the bench gate's runs, baseline, interval,
    threshold and decision included).
    """
    echo = _echo_err if as_json else _echo
    runner = Runner(dry_run=dry_run, echo=echo)
    if not host.several:
        with host_flag(host.name):
            outcome = commands.switch_one_host(config, host.name, opts, runner, echo)
        if as_json:
            click.echo(json.dumps([outcome.to_json()], indent=2))
        if not outcome.ok:
            fail(f"llamanix: switch of {outcome.host} failed: {outcome.detail}")
        return
    # --host A,B or all: a rollout, the first host the canary, stopping at the first failure
    # (its own --batch and --on-failure apply).
    rollout_opts = RolloutOptions(batch, on_failure, preflight_timeout_s)
    rollout = commands.rolling_switch(config, host.names, opts, rollout_opts, runner, echo)
    print_rollout(rollout, as_json)
    if rollout.aborted:
        exit_with(EXIT_INTERRUPTED)
    if not rollout.ok:
        exit_with(1)


@click.command()
@config_argument(default="llamanix.toml")
@hosts_option(old=("--hosts",))
@dry_run_flag("Print the commands a real run would execute.")
@rollback_options
def rollback(config: Path, host: Hosts, dry_run: bool, opts: RollbackOptions) -> None:
    """Serve an earlier generation again (and put its config back).

    --host A,B (or all, every host in config order): Roll back each of these hosts, in this
    order, stopping at the first that fails (exit 1); remote plain-systemd hosts roll back
    with their own llamanix over ssh.
    """
    _default_config_exists(config, "rollback")
    if host.several:
        outcomes = commands.fleet_rollback(
            config, host.names, opts, Runner(dry_run=dry_run, echo=_echo), _echo
        )
        for o in outcomes:
            now = f"generation {o.generation}" if o.generation is not None else "unknown"
            click.echo(f"{o.host}: {'now serving ' + now if o.ok else 'FAILED: ' + o.detail}")
        if not all(o.ok for o in outcomes):
            exit_with(1)
        return
    with host_flag(host.name):
        runner = Runner(dry_run=dry_run, echo=_echo)
        number = commands.rollback_one_host(config, host.name, opts, runner, _echo)
    if number is not None and not dry_run:
        click.echo(f"now serving generation {number}")


@click.command()
@config_argument(default="llamanix.toml")
@host_option()
@timeout_option(DEFAULT_TIMEOUT_S, "Seconds each restarted instance may take to serve.")
@WAIT
def tidy(config: Path, host: str | None, timeout_s: float, wait_s: float) -> None:
    """Remove what a killed switch left, and serve the current generation again (exit 1 if not).

    After a switch or rollback that did not finish (SIGKILL, the OOM killer, a reboot):
    fences and redirects, a blue-green bridge, warm-switch slot files, staging directories
    and temporary files go, a generation left "pending" is marked interrupted, the units are
    put back as the current generation records them and those that do not run are started.
    `llamanix doctor` lists what is left; the config is not changed.
    """
    from llamanix.switch.tidy import tidy as tidy_host

    with host_flag(host):
        serving = tidy_host(config, host, timeout_s, wait_s, Runner(echo=_echo), _echo)
    if not serving:
        exit_with(1)


@click.command()
@config_argument(default="llamanix.toml")
@hosts_option(old=("--hosts",))
@json_flag
def generations(config: Path, host: Hosts, as_json: bool) -> None:
    """List a host's generations: date, variant and source revision per instance, gate.

    A remote plain-systemd host (a `target`) keeps its generations itself: they are asked of
    its llamanix over ssh. --host A,B (or all, every host in config order): List the
    generations of each of these hosts, in this order. --json: an object by host.
    """
    _default_config_exists(config, "generations")
    cfg = load_config(config)
    if host.names is not None:
        names = parse_hosts(host.names, tuple(cfg.hosts), str(config))
    elif host.several:
        names = tuple(cfg.hosts)
    else:
        with host_flag(host.name):
            names = (pick_host(cfg, host.name),)
    found: dict[str, list[listing.GenerationRow]] = {}
    for name in names:
        rh = remote.remote_host(cfg, name)
        if rh is not None:
            listed = remote.remote_generations(rh, Runner(echo=_echo_err))
            read = (from_json_or_none(listing.GenerationRow, r) for r in listed)
            found[name] = [r for r in read if r]
        else:
            found[name] = listing.generation_rows(cfg, HostState.beside(config, name))
    if as_json:
        if not host.several:
            click.echo(json.dumps([r.to_json() for r in found[names[0]]], indent=2))
        else:
            by_host = {n: [r.to_json() for r in rows] for n, rows in found.items()}
            click.echo(json.dumps(by_host, indent=2))
        return
    for name, rows in found.items():
        table = Table(title=f"generations of {name}")
        gaps = [_gaps_cell(row.record) for row in rows]
        # The column only where a restart was measured: a narrow terminal keeps its room.
        columns = ["#", "date", "instances (variant @ revision)", "gate"]
        for column in [*columns, "restart gap"] if any(gaps) else columns:
            table.add_column(column)
        for row, gap in zip(rows, gaps, strict=True):
            cells = [
                f"{row.number}{' *' if row.current else ''}",
                str(row.record.date),
                _instances_cell(row.record),
                _verdict_cell(row.record, row.not_serving_now),
            ]
            table.add_row(*cells, *([gap] if any(gaps) else []))
        console().print(table)


def _default_config_exists(config: Path, command: str) -> None:
    """A config left out is ./llamanix.toml: where there is none, say that it was the default
    and how to name the config, rather than only that the file is missing."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source("config") is not ParameterSource.DEFAULT or config.exists():
        return
    raise UserError(
        Problem(
            str(config),
            "",
            f"no such file: CONFIG was left out, and {command} reads ./{config} by default "
            f"(here: {Path.cwd()})",
            f"name the config: llamanix {command} /etc/llamanix/llamanix.toml",
        )
    )


def _gaps_cell(record: GenerationRecord) -> str:
    """Each restarted instance's gap next to its load time (docs/switching.md); not an
    instance that started for the first time (no old server, so no gap)."""
    return "\n".join(
        f"{n}: {g.describe()}"
        for n, g in sorted((record.gaps or {}).items())
        if g.gap_s is not None or g.drained is not None
    )


def _instances_cell(record: GenerationRecord) -> str:
    return "\n".join(
        f"{n}: {e.variant} @ {(e.source_revision or 'unknown')[:12]}"
        for n, e in sorted(record.instances.items())
    )


def _verdict_cell(record: GenerationRecord, not_serving: dict[str, str]) -> str:
    gate = record.gate
    if gate is None:
        verdict, found = "unknown", []
    else:
        verdict = f"{gate.kind or ''} {gate.result}".strip()
        found = sorted((gate.instances or {}).items())
    for name, result in found:
        bench = result.bench
        interval = bench.interval if bench else None
        if bench and interval:  # the bench comparison: decision and candidate/baseline interval
            verdict += (
                f"\n{name}: {bench.decision} {interval.ratio:.3f} "
                f"[{interval.low:.3f}, {interval.high:.3f}]"
            )
    for name, result in found:
        if not result.passed and result.detail:
            verdict += f"\n{name}: {result.detail}"
    for name, why in sorted(not_serving.items()):
        verdict += f"\nnow {name}: {why}"
    return verdict


_PIN_OPTIONS = (
    click.option("--latest", is_flag=True, help="Lock the input's newest commit."),
    PIN_WAIT,
    dry_run_flag("Print the command instead of running it."),
    click.option(
        "--previous",
        type=FILE,
        metavar="FILE",
        help="Probe of the build VARIANT runs now (llamanix variant probe BINARY --json).",
    ),
    click.option(
        "--capabilities",
        type=FILE,
        metavar="FILE",
        help="Probe of the build the pin would bring: with --previous, list each field of "
        "CONFIG whose flag is respelled, refused (with the fix) or no longer rendered.",
    ),
)


def _pin_options(f: Command) -> Command:
    for option in reversed(_PIN_OPTIONS):
        f = option(f)
    return f


@click.command("pin")
@config_argument()
@click.argument("variant")
@click.argument("rev", required=False)
@click.option(
    "--flake",
    "flake_dir",
    type=DIRECTORY,
    help="The llamanix flake (with flake.lock; default: CONFIG's directory).",
)
@_pin_options
def pin(
    config: Path,
    variant: str,
    rev: str | None,
    flake_dir: Path | None,
    latest: bool,
    wait_s: float,
    dry_run: bool,
    previous: Path | None,
    capabilities: Path | None,
) -> None:
    """Pin a variant's flake input to REV (or --latest); `plan` shows the pins.

    Before moving a pin, --dry-run with --previous and --capabilities prints the flag drift
    of CONFIG: what the new build spells differently, refuses or no longer renders, field by
    field. Without --capabilities, --dry-run says how to build and probe the new build first.
    Exit 1 when the new build refuses a field (and then, without --dry-run, the pin does not
    move).
    """
    refuse_swapped("variant pin", config, variant)
    flake = flake_dir if flake_dir is not None else config.parent
    _pin(Pin(variant, rev, latest, flake, wait_s, dry_run, config, previous, capabilities))


@click.command("pin", hidden=True)
@click.argument("variant")
@click.argument("rev", required=False)
@click.option("--flake", "flake_dir", type=DIRECTORY, default=".")
@config_option("Config whose instances of VARIANT the drift report covers.", hidden=True)
@_pin_options
def pin_before_variant(
    variant: str,
    rev: str | None,
    flake_dir: Path,
    config: Path | None,
    latest: bool,
    wait_s: float,
    dry_run: bool,
    previous: Path | None,
    capabilities: Path | None,
) -> None:
    """`llamanix pin VARIANT [REV] [--config CONFIG]`: `variant pin` before it took CONFIG
    first (cli.MOVED), with the flake in the working directory by default."""
    asked = Pin(variant, rev, latest, flake_dir, wait_s, dry_run, config, previous, capabilities)
    _pin(asked, hint_config=str(config) if config else None, config_option=True)


@dataclass(frozen=True)
class Pin:
    """What a pin was asked, whichever grammar asked it."""

    variant: str
    rev: str | None
    latest: bool
    flake_dir: Path
    wait_s: float
    dry_run: bool
    config: Path | None
    previous: Path | None
    capabilities: Path | None


def _pin(asked: Pin, hint_config: str | None = None, config_option: bool = False) -> None:
    """The pin, with its drift report where both probes are given. ``hint_config``: the
    config the hint for a dry run without probes names (CONFIG where none was given);
    ``config_option``: the old grammar, where the config is --config, not an argument."""
    report = None
    variant, rev, config, dry_run = asked.variant, asked.rev, asked.config, asked.dry_run
    if asked.capabilities is not None or asked.previous is not None:
        if config is None or asked.capabilities is None or asked.previous is None:
            needs = "--previous and --capabilities"
            needs = f"--config, {needs}" if config_option else needs
            raise UserError(
                Problem(
                    "llamanix variant pin",
                    "--capabilities",
                    f"the drift report needs {needs} together",
                    "probe the build you run now (--previous) and the new one (--capabilities)",
                )
            )
        from llamanix.core.probe import load_capabilities

        report = pin_module.pin_drift(
            load_config(config),
            variant,
            load_capabilities(asked.previous),
            load_capabilities(asked.capabilities),
        )
    if report is not None:
        for line in report.lines():
            click.echo(line)
        if report.refused and not dry_run:
            fail(
                f"llamanix variant pin: not moved: the new build refuses {len(report.refused)} "
                "field(s) of the config (above); fix them first, or pin without --capabilities",
                1,
            )
    runner = Runner(dry_run=dry_run, echo=_echo)
    flake_input = pin_module.pin(variant, rev, asked.latest, asked.flake_dir, runner, asked.wait_s)
    if report is None and dry_run:
        for line in pin_module.probe_hint(variant, rev, hint_config):
            click.echo(line)
    if not dry_run:
        from llamanix.external.nix import locked_revisions

        revision = locked_revisions(asked.flake_dir).get(flake_input)
        click.echo(f"{variant}: {flake_input} = {revision}")
    if report is not None and report.refused:
        exit_with(1)  # a dry run that shows refusals fails, so a script can gate on it


def register(group: click.Group) -> None:
    """Add this module's commands to the main group."""
    for command in (up, switch, rollback, tidy, generations):
        group.add_command(command)
