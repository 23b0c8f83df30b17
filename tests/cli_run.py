"""How the tests start llamanix and the test llama-server: one helper for each.

- ``run_llamanix``: ``python -m llamanix ARGS`` in a process of its own, as a user runs it
  (``llamanix_argv`` is that command line, for a test that starts it some other way).
- ``invoke``: the CLI in this process, through click's ``CliRunner``.
- ``server_argv``: the command line of a test llama-server.

A file that always passes the same options binds them once (``functools.partial``); the body
lives here. The child runs the package of this checkout through the environment it gets: the
test run's own (``PYTHONPATH`` absolute, as the docs run the tests), or an ``env`` that names
it (``CHECKOUT_PYTHONPATH``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from click.testing import Result

# The package of this checkout, for a child whose environment is not the test run's.
CHECKOUT_PYTHONPATH = str(Path(__file__).resolve().parent.parent / "tools")


def llamanix_argv(*args: str) -> list[str]:
    """``python -m llamanix ARGS`` with the interpreter that runs the tests."""
    return [sys.executable, "-m", "llamanix", *args]


def run_llamanix(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300,
    input: str | None = None,
    errors: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m llamanix ARGS`` to its end, output captured as text, any exit code returned
    (``subprocess.TimeoutExpired`` past ``timeout``). ``env`` None: this process's environment;
    ``input`` None: stdin inherited; ``errors``: how undecodable output is read (None: strict).
    """
    return subprocess.run(
        llamanix_argv(*args),
        cwd=cwd,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        errors=errors,
        timeout=timeout,
        check=False,
    )


def invoke(
    *args: str,
    input: str | None = None,
    env: Mapping[str, str | None] | None = None,
    catch_exceptions: bool = True,
) -> Result:
    """``llamanix ARGS`` in this process (click's ``CliRunner``): exit code, stdout and stderr
    apart. ``env`` is laid over this process's environment for the call."""
    from click.testing import CliRunner

    from llamanix.cli import main

    return CliRunner().invoke(
        main, list(args), input=input, env=env, catch_exceptions=catch_exceptions
    )


def server_argv(
    binary: Path | str,
    model: Path | str,
    *extra: str,
    ctx: int,
    parallel: int | None = None,
    threads: int | None = None,
    port: int | None = None,
) -> list[str]:
    """``BINARY -m MODEL -c CTX [-np PARALLEL] [-t THREADS] [--port PORT] EXTRA...``.

    A flag given None is left out, for llama-server's own default (``-np``'s is several
    slots, not one; without ``--port`` the server's starter picks a free one)."""
    argv = [str(binary), "-m", str(model), "-c", str(ctx)]
    for flag, value in (("-np", parallel), ("-t", threads), ("--port", port)):
        if value is not None:
            argv += [flag, str(value)]
    return [*argv, *extra]
