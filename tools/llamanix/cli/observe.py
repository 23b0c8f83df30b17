"""llamanix CLI commands: metrics (a host's exporter) and top (a live view of the fleet)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from llamanix.cli.options import FILE, Hosts, exit_with, host_option, hosts_option, json_flag
from llamanix.config.model import Metrics, load_config, remote_exporter_refusal
from llamanix.core.address import is_loopback
from llamanix.core.errors import Problem, UserError
from llamanix.external import interrupt

# The exporter unit reads a config that only root may read through CAP_DAC_READ_SEARCH, which
# access(2) (click's readable check) ignores for a process that is not root: opening the file
# is the check (load_config says in one line why it cannot).
CONFIG = click.Path(path_type=Path, dir_okay=False, readable=False)


def _metrics_settings(config: Path) -> Metrics:
    found = load_config(config).metrics
    return found if found is not None else Metrics()


@click.command("metrics")
@click.argument("config", type=CONFIG)
@host_option()
@click.option("--listen", help="Address to serve /metrics on (default: [metrics] listen).")
@click.option("--port", type=int, help="Port to serve /metrics on (default: [metrics] port).")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The host's generation records, where they are not .llamanix-state/HOST beside CONFIG "
    "(the exporter unit hands it the config as a credential and the records in a read-only "
    "bind).",
)
@click.option(
    "--once",
    is_flag=True,
    help="Read every instance once, print what a scrape would get, and exit.",
)
def metrics_cmd(
    config: Path,
    host: str | None,
    listen: str | None,
    port: int | None,
    state_dir: Path | None,
    once: bool,
) -> None:
    """Serve a host's Prometheus exporter: every local llama-server's /metrics, labelled.

    Each series of each instance (a router's members through the router) gains the labels
    host, instance, variant, build, model and spec_type; the exporter adds decode rate,
    acceptance and share of the bandwidth ceiling, and the switches recorded beside CONFIG
    (docs/observability.md lists every series). It runs as llamanix-exporter.service where
    the config has a [metrics] table.
    """
    from llamanix.observe.exporter import Exporter, exposition, registry_of, serve
    from llamanix.observe.host_reading import HostReader

    settings = _metrics_settings(config)
    if port is not None and not 1 <= port <= 65535:
        raise UserError(Problem("llamanix metrics", "--port", f"{port} is not a port", "1-65535"))
    address, number = listen or settings.listen, port or settings.port
    if not once and not is_loopback(address) and not settings.allow_remote:
        message, fix = remote_exporter_refusal(address)
        # Only --listen can get here: load_config refuses the same in [metrics].
        raise UserError(Problem("llamanix metrics", "--listen", message, fix))
    reader = HostReader(config, host, state_dir=state_dir)
    registry = registry_of(Exporter(reader))
    if once:
        click.echo(exposition(registry), nl=False)
        reader.close()
        return
    try:
        server = serve(registry, address, number)
    except OSError as err:
        reader.close()
        raise UserError(
            Problem(
                "llamanix metrics",
                "--port",
                f"cannot listen on {address}:{number}: {err.strerror}",
                "give a free port (or stop what holds it)",
            )
        ) from None
    count = len(reader.config.instances_on(reader.host))
    click.echo(
        f"llamanix metrics: serving {count} instance(s) of host '{reader.host}' at "
        f"http://{address}:{number}/metrics",
        err=True,
    )
    try:
        while True:
            time.sleep(3600)
    except interrupt.Interrupted:
        # systemctl stop (SIGTERM) is how this service ends: a clean exit, not a failure.
        pass
    finally:
        server.shutdown()
        reader.close()


@click.command("top")
@click.argument("config", type=FILE)
@hosts_option()
@click.option("--once", is_flag=True, help="Print the figures once instead of a live view.")
@json_flag
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between redraws; each redraw takes the rates over the time since the last.",
)
@click.option(
    "--window",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="With --once: read twice this many seconds apart and take the rates over that "
    "window; 0 takes them since each server started.",
)
def top_cmd(
    config: Path,
    host: Hosts,
    once: bool,
    as_json: bool,
    interval: float,
    window: float,
) -> None:
    """A live view of every instance: in flight, decode tok/s, TTFT, acceptance, ceiling share.

    Reads each llama-server's /metrics on this machine, and each remote host (a target of kind
    systemd or systemd-user) through its own llamanix over ssh, as a fleet switch does. A row
    that cannot be read (down, refused, garbage, unloaded, unreachable) is marked, and the
    rest go on. --once --json prints the same figures once.
    """
    from llamanix.cli.top_view import run_top

    if as_json and not once:
        raise UserError(Problem("llamanix top", "--json", "needs --once", "add --once"))
    code = run_top(config, host, once=once, as_json=as_json, interval=interval, window=window)
    if code:
        exit_with(code)


def register(group: click.Group) -> None:
    for command in (metrics_cmd, top_cmd):
        group.add_command(command)
