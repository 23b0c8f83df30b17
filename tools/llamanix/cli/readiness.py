"""``llamanix readiness``, in a module of its own: every unit start waits on it, so it imports
nothing beyond click and the standard library's HTTP client (server/readiness.py)."""

from __future__ import annotations

from pathlib import Path

import click

from llamanix.cli.options import (
    api_key_file_option,
    deprecated,
    fail,
    hidden_alias,
    timeout_option,
    url_option,
)


@click.command()
@url_option(required=True, help="The server's base URL (loopback).")
@click.option(
    "--model",
    "model_files",
    multiple=True,
    help="A model file the server loads (repeatable); their size sets the deadline.",
)
@click.option(
    "--served-model",
    "served_models",
    multiple=True,
    metavar="NAME",
    help="A router: a model name that must answer too (repeatable); each is asked in turn, so "
    "each member is loaded and checked.",
)
@api_key_file_option
@click.option("--pid", type=int, help="The server's pid ($MAINPID): stop waiting once it exits.")
@timeout_option(None, "Seconds to wait (default: from the model size).")
@hidden_alias("--deadline", "deadline", type=float)
@click.option(
    "--as-server-user",
    is_flag=True,
    help="Started as root by a keyed unit's '+' line: read the key as the server (--pid) sees "
    "it, then switch to the server's user before any request.",
)
def readiness(
    url: str,
    model_files: tuple[str, ...],
    served_models: tuple[str, ...],
    api_key_file: Path | None,
    pid: int | None,
    timeout_s: float | None,
    deadline: float | None,
    as_server_user: bool,
) -> None:
    """Exit 0 once a llama-server serves: /health is 200 and a one-token completion answers.

    Rendered units run it as ExecStartPost=, so a unit only counts as started (and
    `nixos-rebuild switch` only succeeds) when its new backend serves. Exit 1 with one line
    when the deadline passes or the server exits first.
    """
    from llamanix.server.readiness import NotReady, ReadinessCheck, wait_ready

    timeout_s = deprecated(timeout_s, deadline, "--deadline", "--timeout")
    check = ReadinessCheck(
        url.rstrip("/"), model_files, api_key_file, pid, timeout_s, as_server_user, served_models
    )
    try:
        took = wait_ready(check)
    except NotReady as err:
        fail(f"llamanix readiness: {err}")
    click.echo(f"{url}: serving after {took:.1f}s")


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(readiness)
