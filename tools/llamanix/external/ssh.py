"""ssh: run a command on another machine through the user's own OpenSSH client, so their
ssh config, agent and known_hosts apply (as nixos-rebuild --target-host does).

The options make a run fail instead of hang: no prompt for a password or a host key
(BatchMode), a connection that is not made within 10 s, and one whose far end stops answering
for 15 s (three missed keep-alives, 5 s apart) is given up. ``-T``: no terminal, so what the
remote command prints arrives as it wrote it and its stdin is the pipe this side writes.
ssh itself exits 255 when it could not connect or lost the connection; anything else is the
remote command's own exit code.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from llamanix.core.address import SshTarget
from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import Runner
from llamanix.external.signals import signal_child

SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ServerAliveInterval=5",
    "-o", "ServerAliveCountMax=3",
    "-T",
)  # fmt: skip
# ssh's own exit code: it could not connect, authenticate, or it lost the connection.
SSH_FAILED = 255


class _Live:
    """The ssh processes running now (each in a session of its own, which a Ctrl-C at the
    terminal does not reach), so that a second stop signal can end them all at once, and
    whether new ones are refused."""

    def __init__(self) -> None:
        # Re-entrant: a signal handler on the main thread may call stop_all while that
        # thread holds it.
        self.lock = threading.RLock()
        self.procs: set[subprocess.Popen[str]] = set()
        self.stopped = False


_LIVE = _Live()


def stop_all() -> None:
    """End every ssh this process runs (SIGTERM: the remote side gets its hang-up), and refuse
    new ones until ``allow_again``: what a second Ctrl-C does to a batch of hosts."""
    with _LIVE.lock:
        _LIVE.stopped = True
        procs = list(_LIVE.procs)
    for proc in procs:
        if proc.poll() is None:
            signal_child(proc, signal.SIGTERM)


def allow_again() -> None:
    with _LIVE.lock:
        _LIVE.stopped = False


def ssh_argv(target: SshTarget, command: Sequence[str]) -> list[str]:
    """The ssh argv that runs ``command`` on ``target`` (its port as ``-p``). ssh hands the
    remote side one string that its login shell splits: the command is quoted here, once, so
    each argument arrives as it is. ``--`` ends ssh's own options (a target that starts with
    ``-``, which ssh would read as one, never parses)."""
    return ["ssh", *SSH_OPTIONS, *target.ssh_args(), "--", shlex.join(command)]


@dataclass(frozen=True)
class SshResult:
    """How a remote command ended: its exit code (255: ssh's own failure) and every line it,
    or ssh, wrote on stderr."""

    returncode: int
    stderr: tuple[str, ...]

    @property
    def last_error(self) -> str:
        """The last non-empty stderr line (ssh's reason, when it failed), or ""."""
        lines = [line.strip() for line in self.stderr if line.strip()]
        return lines[-1] if lines else ""


def run_ssh(
    runner: Runner,
    target: SshTarget,
    command: Sequence[str],
    on_line: Callable[[str], None],
    stdin_text: str | None = None,
    show: bool = True,
) -> SshResult:
    """Run ``command`` on ``target``: each stdout line (without its newline) to ``on_line`` as
    it comes, ``stdin_text`` (when given) on its stdin, never on a command line. ``show``: say
    the command line first, as ``Runner.run`` does (a query leaves it out).

    With ``runner.dry_run`` nothing runs: the argv is printed (``Runner.run``) and the result
    is a success with no output. A stop signal here ends ssh (so the remote side gets its
    hang-up) before it is raised on."""
    argv = ssh_argv(target, command)
    if runner.dry_run:
        runner.run(argv)
        return SshResult(0, ())
    if show:
        runner.echo(f"$ {shlex.join(argv)}")
    with _LIVE.lock:
        if _LIVE.stopped:
            raise ExternalCommandError("stopped: ssh is not run after a second stop signal")
        proc = _start(argv, stdin_text)
        _LIVE.procs.add(proc)
    try:
        return _read(proc, stdin_text, on_line)
    finally:
        with _LIVE.lock:
            _LIVE.procs.discard(proc)


def _start(argv: list[str], stdin_text: str | None) -> subprocess.Popen[str]:
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            # A session of its own: Ctrl-C at the terminal reaches only llamanix, which lets a
            # rolling switch finish the host under way (a second Ctrl-C ends ssh, below).
            start_new_session=True,
        )
    except FileNotFoundError:
        raise ExternalCommandError(
            "ssh not found: install OpenSSH's client (apt-get install openssh-client)"
        ) from None
    except OSError as err:
        raise ExternalCommandError(f"cannot run ssh: {err.strerror}") from None


def _read(
    proc: subprocess.Popen[str], stdin_text: str | None, on_line: Callable[[str], None]
) -> SshResult:
    """Each stdout line to ``on_line`` as it comes, stdin fed and stderr kept alongside; ssh
    ended (SIGTERM) when this is left by an exception."""
    assert proc.stdout is not None and proc.stderr is not None
    stderr: list[str] = []
    readers = [threading.Thread(target=_collect, args=(proc.stderr, stderr), daemon=True)]
    if stdin_text is not None:
        readers.append(threading.Thread(target=_feed, args=(proc, stdin_text), daemon=True))
    for thread in readers:
        thread.start()
    try:
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        returncode = proc.wait()
    finally:
        if proc.poll() is None:
            signal_child(proc, signal.SIGTERM)
            proc.wait()
        proc.stdout.close()
    for thread in readers:
        thread.join(timeout=5)
    return SshResult(returncode, tuple(stderr))


def _collect(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line.rstrip("\n"))


def _feed(proc: subprocess.Popen[str], text: str) -> None:
    """Write ``text`` to the child's stdin and close it, so the remote side reads to its end;
    a child that exits without reading it all is not an error here (its exit code says)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(text)
        proc.stdin.close()
    except OSError:  # BrokenPipeError among them
        pass
