"""`llamanix up` as a child process, as the demo's deploy loop and the deploy tests run it:
start it on a config, wait until an instance runs, and stop it the way an operator would
(SIGINT, then SIGKILL of its whole process group when it does not stop in time)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from llamanix.core.errors import ExternalCommandError
from llamanix.external import interrupt
from llamanix.external.process import PIPE, TextChild, spawn_text, wait_exit
from llamanix.external.signals import signal_child, signal_group
from llamanix.state.generations import HostState
from llamanix.state.up_status import UpInstance, UpState, read_status

UP_START_S = 180.0
STOP_S = 30.0
POLL_S = 0.1


def up_units(config: Path, host: str) -> Path:
    """Where `llamanix up` keeps HOST's manifest and status for CONFIG."""
    return HostState.beside(config, host).up_dir


def instance_status(units: Path, instance: str) -> UpInstance | None:
    """What up's status file says of INSTANCE; None while there is no file (before the start,
    after the stop) or no entry for it."""
    status = read_status(units)
    return None if status is None else status.instances.get(instance)


def instance_state(units: Path, instance: str) -> UpState | None:
    entry = instance_status(units, instance)
    return None if entry is None else entry.state


def start_up(config: Path, host: str, stdout: IO[Any] | int = PIPE) -> TextChild:
    """`llamanix up CONFIG --host HOST` in CONFIG's directory, in its own process group, so its
    llama-servers go down with it whatever happens to the caller."""
    return spawn_text(
        [sys.executable, "-m", "llamanix", "up", config.name, "--host", host],
        stdout=stdout,
        cwd=config.parent,
    )


def stop_up(proc: TextChild) -> None:
    """SIGINT, as Ctrl-C would (up stops its instances); a group that outlives STOP_S is killed.

    A stop signal to this process waits until up is gone (interrupt.deferred)."""
    with interrupt.deferred():
        if proc.poll() is None:
            signal_child(proc, signal.SIGINT)
            if wait_exit(proc, STOP_S) is None:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_running(
    proc: TextChild,
    units: Path,
    instance: str,
    explain: Callable[[], str] | None = None,
    deadline_s: float = UP_START_S,
) -> None:
    """Until up reports INSTANCE running; one error with up's output (``explain``, or what it
    printed to a pipe) when up exits first or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while instance_state(units, instance) != "running":
        exited = proc.poll() is not None
        if exited or time.monotonic() > deadline:
            if explain is not None:
                output = explain()
            elif exited and proc.stdout is not None:
                output = proc.communicate()[0]
            else:
                output = ""
            why = "exited" if exited else f"did not start {instance} within {deadline_s:g}s"
            raise ExternalCommandError(f"llamanix up {why}:\n{output}".rstrip())
        time.sleep(POLL_S)


@contextmanager
def running_up(
    config: Path,
    host: str,
    instance: str,
    stdout: IO[Any] | int = PIPE,
    explain: Callable[[], str] | None = None,
    deadline_s: float = UP_START_S,
    more: tuple[str, ...] = (),
) -> Iterator[TextChild]:
    """`llamanix up` with INSTANCE (and ``more`` instances) running until the block ends;
    stopped on the way out, by a stop signal too, even one that arrives while up is being
    started."""
    proc: TextChild | None = None
    try:
        with interrupt.deferred():
            proc = start_up(config, host, stdout)
        for name in (instance, *more):
            wait_running(proc, up_units(config, host), name, explain, deadline_s)
        yield proc
    finally:
        if proc is not None:
            stop_up(proc)
