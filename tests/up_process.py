"""`llamanix up` as a real process for the deploy tests: start it on a directory's
llamanix.toml, wait until an instance runs, and stop it the way an operator would (SIGINT,
then SIGKILL of its whole process group when it does not stop in time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from llamanix.deploy.supervisor import read_status

DEADLINE_S = 120.0


def up_units(cwd: Path, host: str = "dev") -> Path:
    """Where `llamanix up` keeps its manifest and status for HOST."""
    return cwd / ".llamanix-state" / host / "up"


def status(units: Path) -> dict[str, Any]:
    """up's status file, or {} while there is none (before the start, after the stop)."""
    return read_status(units) or {}


def instance_state(units: Path, instance: str = "chat") -> str | None:
    state = status(units).get("instances", {}).get(instance, {}).get("state")
    return str(state) if state is not None else None


def start_up(
    cwd: Path, stdout: IO[str] | int = subprocess.PIPE, host: str = "dev"
) -> subprocess.Popen[str]:
    """Run `llamanix up llamanix.toml --host HOST` in CWD, in its own process group."""
    return subprocess.Popen(
        [sys.executable, "-m", "llamanix", "up", "llamanix.toml", "--host", host],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def stop_up(proc: subprocess.Popen[str]) -> None:
    """SIGINT, as Ctrl-C would; a process group that outlives 30 s is killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_running(
    proc: subprocess.Popen[str],
    units: Path,
    instance: str = "chat",
    explain: Callable[[], str] | None = None,
    deadline_s: float = DEADLINE_S,
) -> None:
    """Until up reports INSTANCE running; fails (with up's output) if up exits or time runs out."""
    deadline = time.monotonic() + deadline_s
    while instance_state(units, instance) != "running":
        if proc.poll() is not None:
            output = explain() if explain else (proc.communicate()[0] or "llamanix up exited")
            raise AssertionError(output)
        assert time.monotonic() < deadline, "llamanix up did not start the instance"
        time.sleep(0.1)


@contextmanager
def running_up(
    cwd: Path,
    stdout: IO[str] | int = subprocess.PIPE,
    explain: Callable[[], str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """`llamanix up` with the `chat` instance of host `dev` running; stopped on the way out."""
    proc = start_up(cwd, stdout)
    try:
        wait_running(proc, up_units(cwd), explain=explain)
        yield proc
    finally:
        stop_up(proc)
