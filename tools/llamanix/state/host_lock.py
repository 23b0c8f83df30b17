"""One command at a time: per host, and per machine's units.

``switch``, ``rollback``, ``tidy`` and ``pin`` hold an exclusive lock on the state directory
they change (``host_lock``). Every command that changes units (``switch``, ``rollback``,
``tidy``, ``up``, and the fleet agent, whose switch is an ordinary switch of its own copy of
the config) also holds the lock of the units directory it writes (``units_lock``): whatever
config path they came from, two commands never write ``/etc/systemd/system/llamanix-*`` at
once. That lock lives in this machine's run directory (``/run/llamanix`` for root), named by
the units directory.

Each lock is ``flock`` on a file, so the kernel releases it when its holder exits, however it
exits: a SIGKILLed switch leaves no lock behind that could block forever. The file holds who
has it (pid, command, config, since when), for the one line a second caller gets. Every
generation number is allocated while the host's lock is held, so two switches can never pick
the same.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llamanix.core.errors import Problem, UserError
from llamanix.core.state_dir import STATE_DIR
from llamanix.external.clock import now
from llamanix.external.process import alive

LOCK_FILE = "lock"
POLL_S = 0.2
# Where the units locks are: root's, unless this names another directory (the tests, so that
# runs beside each other on one machine do not take each other's turns).
RUN_DIR_ENV = "LLAMANIX_RUN_DIR"
SYSTEM_RUN_DIR = Path("/run/llamanix")


def _holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Holder:
    """Who holds a lock now: read from its file, its process alive."""

    pid: int
    command: str
    since: str
    config: str | None

    def describe(self) -> str:
        source = f" of {self.config}" if self.config else ""
        return f"a {self.command}{source} (pid {self.pid}, since {self.since})"


def holder_of(path: Path) -> Holder | None:
    """Who holds the lock ``path`` now; None when nobody does (no file, an empty one, or one
    whose process is gone: a holder killed with SIGKILL leaves its record, not its lock)."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return None
    pid = data.get("pid") if isinstance(data, dict) else None
    if not isinstance(pid, int) or not alive(pid):
        return None
    config = data.get("config")
    return Holder(
        pid, str(data.get("command", "switch")), str(data.get("since", "?")),
        str(config) if config else None,
    )  # fmt: skip


def _refusal(source: str, what: str, holder: dict[str, object]) -> UserError:
    by = f"pid {holder.get('pid', '?')}"
    config = holder.get("config")
    if config and config != source:
        by += f" for {config}"
    since = holder.get("since", "?")
    doing = holder.get("command", "switch")
    return UserError(
        Problem(
            source,
            "",
            f"{what} being {_participle(str(doing))} by {by} (since {since})",
            "try again, or pass --wait SECONDS",
        )
    )


@contextmanager
def _flock(
    path: Path, what: str, source: str, wait_s: float, command: str, scratch: bool
) -> Iterator[None]:
    """Hold the lock ``path``, waiting up to ``wait_s``. ``scratch``: the file is the lock's
    alone, removed when it is let go (a holder that took it after the removal checks that it
    holds the file the path names, and takes the new one otherwise)."""
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise _refusal(source, what, _holder(fd)) from None
                    time.sleep(POLL_S)
            if scratch and not _names(path, fd):
                continue  # its holder removed it as we waited: take the one there now
            record = {"pid": os.getpid(), "command": command, "since": now(), "config": source}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(record).encode(), 0)
            except OSError:
                pass  # a full disk: the lock holds all the same, only its holder goes unnamed
            try:
                yield
            finally:
                if scratch:
                    path.unlink(missing_ok=True)
                else:
                    os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            return
        finally:
            os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def flake_lock_root(flake_dir: Path) -> Path:
    """Where the lock of a flake's ``flake.lock`` lives (a pin changes it for every host)."""
    return flake_dir / STATE_DIR


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
        # Opened once here, so that a directory we cannot write is one line.
        os.close(os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as err:
        raise UserError(
            Problem(
                source,
                "",
                f"cannot keep {what}'s state in {state_dir} ({err.strerror})",
                "run llamanix as the user who owns the config's directory, or make it writable",
            )
        ) from None
    with _flock(state_dir / LOCK_FILE, f"{what} is", source, wait_s, command, scratch=False):
        yield


def run_dir() -> Path:
    """Where this machine's units locks are: ``/run/llamanix`` for root, a user's own
    ``~/.local/state/llamanix/locks`` (by the password database, not ``$HOME``: the same
    place in every session) for a user, or ``$LLAMANIX_RUN_DIR``."""
    override = os.environ.get(RUN_DIR_ENV)
    if override:
        return Path(override)
    uid = os.geteuid()
    if uid == 0:
        return SYSTEM_RUN_DIR
    return Path(pwd.getpwuid(uid).pw_dir) / ".local" / "state" / "llamanix" / "locks"


def units_lock_path(units_dir: Path) -> Path:
    """The lock of the units in ``units_dir`` on this machine (named by the directory's
    resolved path, so every spelling of it is the same lock)."""
    key = hashlib.sha256(os.fsencode(units_dir.resolve())).hexdigest()[:16]
    return run_dir() / f"units-{key}.lock"


@contextmanager
def units_lock(
    units_dir: Path, source: str, wait_s: float = 0.0, command: str = "switch"
) -> Iterator[None]:
    """Hold the lock of the units in ``units_dir`` (every command that writes them, from any
    config); wait up to ``wait_s`` for it, then one line and exit code 2."""
    path = units_lock_path(units_dir)
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            Problem(
                source,
                "",
                f"cannot keep this machine's units lock in {path.parent} ({err.strerror})",
                f"make it writable, or set {RUN_DIR_ENV} to a directory that is",
            )
        ) from None
    what = f"this machine's units in {units_dir} are"
    with _flock(path, what, source, wait_s, command, scratch=True):
        yield


def units_holder(units_dir: Path) -> Holder | None:
    """Who writes the units in ``units_dir`` now (None: nobody)."""
    return holder_of(units_lock_path(units_dir))


def _participle(command: str) -> str:
    return {
        "switch": "switched",
        "rollback": "rolled back",
        "pin": "pinned",
        "tidy": "tidied",
        "up": "started by llamanix up",
        "build": "given a new build",
    }.get(command, command)
