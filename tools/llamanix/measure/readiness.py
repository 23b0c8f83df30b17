"""``llamanix readiness``: is a just-started llama-server serving?

Run as the unit's ``ExecStartPost=`` (and by ``up``), so a start only counts once the server
answers: ``GET /health`` is 200 and a one-token completion comes back. It talks to loopback only
and needs no privilege, so it runs under the unit's own sandbox. The API key, when the instance
has one, is read from a file (systemd's credential directory), never taken on the command line.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from llamanix.core.errors import UserError
from llamanix.core.readiness import deadline_s, files_size
from llamanix.measure.client import LlamaClient, read_api_key

POLL_S = 0.25


@dataclass(frozen=True)
class ReadinessCheck:
    url: str
    model_files: tuple[str, ...] = ()
    api_key_file: Path | None = None
    # The server's pid ($MAINPID): when it is gone there is nothing to wait for.
    pid: int | None = None
    deadline_s: float | None = None

    def effective_deadline_s(self) -> float:
        if self.deadline_s is not None:
            return self.deadline_s
        return float(deadline_s(files_size(self.model_files) or 0))


class NotReady(Exception):
    """The server did not serve in time, or stopped; the message says which, in one line."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # An exited child its parent has not reaped yet is a zombie: gone for our purpose.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_ready(check: ReadinessCheck) -> float:
    """Block until the server serves; returns the seconds it took. Raises NotReady."""
    started = time.monotonic()
    limit = check.effective_deadline_s()
    api_key = None
    if check.api_key_file is not None:
        try:
            api_key = read_api_key(check.api_key_file)
        except UserError as err:
            raise NotReady(str(err)) from None
    last = "no answer yet"
    with LlamaClient(check.url, api_key=api_key, timeout_s=max(10.0, limit)) as client:
        while True:
            elapsed = time.monotonic() - started
            if check.pid is not None and not _alive(check.pid):
                raise NotReady(f"llama-server (pid {check.pid}) exited before serving ({last})")
            if elapsed > limit:
                raise NotReady(f"{check.url} not serving after {limit:g}s ({last})")
            try:
                health = client.health()
                if health.status_code != 200:
                    last = f"/health answered {health.status_code}"
                else:
                    done = client.complete("Hello", 1)
                    if done.status_code == 200:
                        return time.monotonic() - started
                    last = f"a one-token completion answered {done.status_code}"
                    if done.status_code in (401, 403):
                        raise NotReady(f"{check.url}: {last}: check the API key file")
            except httpx.HTTPError as err:
                last = type(err).__name__
            time.sleep(POLL_S)
