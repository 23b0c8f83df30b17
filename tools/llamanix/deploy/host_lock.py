"""One switch at a time per host: ``switch``, ``rollback`` and ``pin`` hold an exclusive lock on
the state directory they change.

The lock is ``flock`` on a file in that directory, so the kernel releases it when its holder
exits, however it exits: a SIGKILLed switch leaves no lock behind that could block forever. The
file holds who has it (pid, command, since when), for the one line a second caller gets. Every
generation number is allocated while the lock is held, so two switches can never pick the same.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llamanix.core.errors import Problem, UserError
from llamanix.external.clock import now

LOCK_FILE = "lock"
POLL_S = 0.2


def _holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextmanager
def host_lock(
    state_dir: Path, what: str, source: str, wait_s: float = 0.0, command: str = "switch"
) -> Iterator[None]:
    """Hold ``state_dir``'s lock; wait up to ``wait_s`` for it, then one line and exit code 2.

    ``what`` names the locked thing in that line ("host gpu1"), ``source`` the config or flake
    the user named.
    """
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise UserError(
            Problem(
                source,
                "",
                f"cannot keep {what}'s state in {state_dir} ({err.strerror})",
                "run llamanix as the user who owns the config's directory, or make it writable",
            )
        ) from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    by = f"pid {holder.get('pid', '?')}"
                    since = holder.get("since", "?")
                    doing = holder.get("command", "switch")
                    raise UserError(
                        Problem(
                            source,
                            "",
                            f"{what} is being {_participle(str(doing))} by {by} (since {since})",
                            "try again, or pass --wait SECONDS",
                        )
                    ) from None
                time.sleep(POLL_S)
        record = {"pid": os.getpid(), "command": command, "since": now()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds all the same, only its holder goes unnamed
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _participle(command: str) -> str:
    return {
        "switch": "switched",
        "rollback": "rolled back",
        "pin": "pinned",
        "build": "given a new build",
    }.get(command, command)
