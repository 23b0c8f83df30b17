"""llamanix CLI: ``gateway exec`` and ``gateway ready``, hidden: what the gateway's unit runs
(hosts/gateway_start.py), not a person. The unit itself runs them as ``gateway-exec`` and
``gateway-ready`` (cli.MOVED_QUIETLY says why)."""

from __future__ import annotations

import os

import click

from llamanix.cli.options import fail


@click.group("gateway", hidden=True)
def gateway_group() -> None:
    """The gateway unit's side: start its LiteLLM (exec), wait until it answers (ready)."""


@gateway_group.command(
    "exec",
    # LiteLLM's argv begins at its program: an option of its own is never taken for ours.
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--credential-env",
    "pairs",
    multiple=True,
    metavar="VARIABLE=CREDENTIAL",
    help="Read the key in the unit's credential CREDENTIAL into VARIABLE (repeatable).",
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def gateway_exec(pairs: tuple[str, ...], argv: tuple[str, ...]) -> None:
    """Start the gateway's LiteLLM: its keys from the unit's credentials, llamanix's plugin on
    its path, then ARGV (LiteLLM's own command line) in place of this process."""
    from llamanix.hosts.gateway_start import litellm_environment

    env = litellm_environment(pairs, os.environ.get("CREDENTIALS_DIRECTORY"), os.environ)
    try:
        os.execve(argv[0], list(argv), env)
    except OSError as err:
        fail(f"llamanix gateway exec: cannot run {argv[0]}: {err.strerror}")


@gateway_group.command("ready")
@click.option("--url", required=True, help="LiteLLM's liveliness endpoint.")
@click.option("--pid", type=int, help="LiteLLM's pid ($MAINPID): stop waiting once it exits.")
@click.option("--timeout", "timeout_s", type=float, default=180.0, show_default=True)
def gateway_ready(url: str, pid: int | None, timeout_s: float) -> None:
    """Exit 0 once the gateway's LiteLLM answers URL; 1 when it exits first or the time is
    up."""
    from llamanix.hosts.gateway_start import wait_live

    took = wait_live(url, pid, timeout_s)
    click.echo(f"{url}: live after {took:.1f}s")


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(gateway_group)
