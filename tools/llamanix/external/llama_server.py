"""llama-server as a program: its own word about itself (``--version`` and ``--help``, run as
plain commands) and the start of a serving process.

The parsing lives in ``llamanix.core.probe``, and waiting for a started server to serve in
``llamanix.server.server_process``; this module only runs the binary.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import Capabilities, parse_capabilities
from llamanix.core.process_end import died_of
from llamanix.core.trusted_path import require_trusted
from llamanix.external.process import Child, spawn


class ServerStartError(ExternalCommandError):
    """llama-server could not be started, exited or never became healthy."""


def binary_argv(binary: str | Path, arg: str) -> list[str]:
    """``BINARY ARG``: how llama-server is asked about itself (``--version``, ``--help``)."""
    return [str(binary), arg]


def run_binary(binary: str, arg: str, timeout: float = 60) -> str:
    """Run ``BINARY ARG`` and return stdout+stderr (llama-server prints --version to stderr).
    As root, only a binary that root alone can change is run."""
    require_trusted(Path(binary), binary, arg, f"run it ('{arg}')")
    try:
        proc = subprocess.run(
            binary_argv(binary, arg),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except OSError as err:
        raise UserError(
            Problem(binary, "", f"cannot run: {err}", "give the path of a llama-server binary")
        ) from None
    except subprocess.TimeoutExpired:
        raise UserError(Problem(binary, "", f"'{arg}' did not finish in {timeout:g} s")) from None
    if proc.returncode < 0:
        raise UserError(Problem(binary, arg, died_of(-proc.returncode)))
    return proc.stdout + proc.stderr


def probe_binary(binary: str | Path) -> Capabilities:
    """What BINARY accepts, from its ``--version`` and ``--help``."""
    path = str(binary)
    caps = parse_capabilities(path, run_binary(path, "--version"), run_binary(path, "--help"))
    if not caps.flags:
        raise UserError(Problem(path, "", "--help listed no flags; is this llama-server?"))
    return caps


def binary_version_line(binary: Path) -> str:
    """The ``version: ...`` line llama-server prints for ``--version``."""
    output = run_binary(str(binary), "--version")
    for line in output.splitlines():
        if line.startswith("version:"):
            return line.strip()
    raise ExternalCommandError(f"{binary} --version printed no 'version:' line")


def start_server(
    argv: Sequence[str], log: IO[bytes], env: Mapping[str, str] | None = None
) -> Child:
    """Start a serving llama-server (``argv``: program first) in its own process group, its
    output to ``log``; ``ServerStartError`` when it cannot be started."""
    try:
        return spawn(argv, stdout=log, env=env)
    except OSError as err:
        raise ServerStartError(f"cannot run {argv[0]}: {err}") from err
