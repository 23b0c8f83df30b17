"""The one place llamanix runs deployment commands (nixos-rebuild, nix, systemctl).

Like nixos-rebuild-ng's ``run_wrapper``: every external command goes through ``Runner.run``, so
``--dry-run`` prints exactly the argv a real run would execute (and runs nothing), and tests
can check the recorded argv lists.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamanix.core.errors import ExternalCommandError

Echo = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass
class Runner:
    """Runs (or, with ``dry_run``, only prints) external commands."""

    dry_run: bool = False
    echo: Echo = _print

    def run(
        self, argv: Sequence[str], *, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        args = list(argv)
        where = f"(cd {shlex.quote(str(cwd))} && {shlex.join(args)})" if cwd else shlex.join(args)
        if self.dry_run:
            self.echo(where)
            return subprocess.CompletedProcess(args, 0, "", "")
        self.echo(f"$ {where}")
        try:
            # Output goes straight to the terminal: nixos-rebuild's progress is the user's.
            proc = subprocess.run(args, cwd=cwd, check=False, text=True, errors="surrogateescape")
        except OSError as err:
            raise ExternalCommandError(f"cannot run {args[0]}: {err}") from err
        if check and proc.returncode != 0:
            raise ExternalCommandError(
                f"{shlex.join(args)} failed with exit code {proc.returncode}"
            )
        return proc

    def note(self, line: str) -> None:
        """Something that is not a command (a file written): shown, marked as such, in dry runs."""
        self.echo(f"# {line}")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs. Not a process number (0 or less) is not alive, and
    neither is a zombie: an exited child its parent has not reaped yet is gone for every
    caller's purpose (a readiness check waiting on it, a status file naming it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
