"""Running programs: the deployment runner, child processes, and whether a process lives.

Deployment commands (nixos-rebuild, nix, systemctl) go through ``Runner.run``, like
nixos-rebuild-ng's ``run_wrapper``, so ``--dry-run`` prints exactly the argv a real run would
execute (and runs nothing), and tests can check the recorded argv lists. The other helpers here
are what the rest of the package uses instead of the subprocess module, which only this layer
imports: a captured run, a run whose output is streamed line by line, and waiting for a child.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from llamanix.core.errors import ExternalCommandError

Echo = Callable[[str], None]
# Children and finished runs, as the layers above hold them.
Child = subprocess.Popen[bytes]
TextChild = subprocess.Popen[str]
Finished = subprocess.CompletedProcess[str]
# A child's stdout to a pipe, and its stderr to wherever its stdout goes.
PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT


class CommandTimedOut(ExternalCommandError):
    """A program did not finish within its time limit (and was killed)."""


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


def run_captured(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = None,
    input_text: str | None = None,
) -> Finished:
    """Run ``argv`` to its end with its output captured as text (``input_text`` on its stdin);
    any exit code is returned.
    ``CommandTimedOut`` past ``timeout_s``; ``ExternalCommandError`` (``PROGRAM: why``) when it
    cannot be started."""
    args = list(argv)
    try:
        return subprocess.run(
            args,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            input=input_text,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CommandTimedOut(f"{args[0]} timed out after {timeout_s:g}s") from None
    except OSError as err:
        raise ExternalCommandError(f"{args[0]}: {err.strerror}") from None


def run_streamed(
    argv: Sequence[str], on_line: Callable[[str], None], on_start: Callable[[], None]
) -> int:
    """Run ``argv`` with stdout and stderr merged: ``on_start`` once it runs, then each line
    (with its newline) to ``on_line`` as it comes; the exit code. ``FileNotFoundError`` when
    there is no such program (before ``on_start``), for the caller to say what to install."""
    with subprocess.Popen(
        list(argv), stdout=PIPE, stderr=STDOUT, text=True, errors="replace", bufsize=1
    ) as proc:
        assert proc.stdout is not None
        on_start()
        for line in proc.stdout:
            on_line(line)
    return proc.returncode


def spawn(
    argv: Sequence[str],
    *,
    stdout: IO[Any] | int,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Child:
    """Start ``argv`` in a session (and process group) of its own, stdin from /dev/null and
    stderr with stdout, so that stopping its group stops everything it started and a
    terminal's Ctrl-C reaches only llamanix, which stops it. ``OSError`` when it cannot start."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=STDOUT,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
    )


def spawn_text(argv: Sequence[str], *, stdout: IO[Any] | int, cwd: Path | None = None) -> TextChild:
    """``spawn`` for a child whose output the caller reads as text (``stdout=PIPE``); its stdin
    is the caller's."""
    return subprocess.Popen(
        list(argv),
        stdout=stdout,
        stderr=STDOUT,
        cwd=cwd,
        text=True,
        start_new_session=True,
    )


def wait_exit(proc: Child | TextChild, timeout_s: float) -> int | None:
    """The child's exit code once it exits within ``timeout_s``, else None (it still runs)."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
