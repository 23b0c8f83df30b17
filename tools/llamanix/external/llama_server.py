"""llama-server's own word about itself: ``--version`` and ``--help``, run as plain commands.

The parsing lives in ``llamanix.core.probe``; this module only runs the binary.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.probe import Capabilities, parse_capabilities


def version_argv(binary: Path) -> list[str]:
    return [str(binary), "--version"]


def run_binary(binary: str, arg: str, timeout: float = 60) -> str:
    """Run ``BINARY ARG`` and return stdout+stderr (llama-server prints --version to stderr)."""
    try:
        proc = subprocess.run(
            [binary, arg],
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
    result = subprocess.run(
        version_argv(binary), capture_output=True, text=True, errors="replace", timeout=60
    )
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith("version:"):
            return line.strip()
    raise ExternalCommandError(
        f"{binary} --version printed no 'version:' line (exit code {result.returncode})"
    )
