"""Atomic file writes (a reader sees the old file or the new one, never half of either), trusted
archive extraction, a blocking file lock, and a command's work directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from llamanix.core.errors import Problem, UserError


class WriteFailed(UserError):
    """A file could not be written (a full disk, a read-only file system, no permission): one
    line naming it, and the file as it was before, since the write goes to a temporary name."""

    def __init__(self, path: Path, err: OSError) -> None:
        code = err.errno or 0
        why = os.strerror(code).lower() if code else str(err)
        if code == errno.ENOENT:  # /proc, or a directory removed meanwhile
            why = f"{path.parent} takes no new file"
        fix = _WRITE_FIXES.get(code, "give a path in a writable directory")
        super().__init__(Problem(str(path), "", f"cannot write it: {why}", fix))
        self.path = path
        self.errno = code


_WRITE_FIXES = {
    errno.ENOSPC: "free space on its file system, then run it again",
    errno.EDQUOT: "free space within your quota, then run it again",
    errno.EROFS: "it is on a read-only file system: give a writable place",
    errno.EACCES: "run as a user who may write there",
    errno.EPERM: "run as a user who may write there",
}


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all; ``WriteFailed`` (the file as it was) when the
    system refuses."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise WriteFailed(path, err) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            # On the descriptor, never by name: in a directory another user owns (a unit's
            # state directory), the name may be a link to another file by the time it is used.
            os.fchmod(fh.fileno(), mode)
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise WriteFailed(path, err) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rewrite(path: Path, data: str | bytes) -> None:
    """Give the existing file at ``path`` new content atomically, as its owner set it up: a
    symlink is followed and its target replaced (the link stays a link), and the new file gets
    the old one's mode and owner before it holds anything. OSError, with nothing changed, where
    that cannot be done (PermissionError: this process may not give the file its owner)."""
    target = Path(os.path.realpath(path))
    st = os.stat(target)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                os.fchown(fh.fileno(), st.st_uid, st.st_gid)
            # After the owner: chown clears the set-id bits.
            os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_scratch(path: Path, text: str) -> None:
    """Write a file into a scratch directory this process made and will delete: no temporary
    name and no fsync, since nobody else reads it and a crash loses nothing."""
    path.write_text(text)


def extract_trusted(
    tar: tarfile.TarFile,
    dest: Path,
    members: Sequence[tarfile.TarInfo] | None = None,
    numeric_owner: bool = False,
) -> None:
    """Extract ``members`` (all when None) exactly as archived: for archives llamanix made or
    already filtered itself. Pythons before 3.11.4 (Debian 12 ships 3.11.2) have no ``filter``
    argument and extract this way anyway."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members, numeric_owner=numeric_owner, filter="fully_trusted")
    else:
        tar.extractall(dest, members, numeric_owner=numeric_owner)


@contextlib.contextmanager
def work_dir(keep: Path | None, prefix: str) -> Iterator[Path]:
    """``keep`` (created, and left behind) when given, else a temporary directory named
    ``PREFIX...`` that is removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, with its directory), waiting for
    whoever holds it; the kernel releases it when this process dies, so no stale lock stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def create_new(path: Path, data: str, mode: int = 0o644) -> None:
    """Write a file that must not exist yet, whole or not at all: FileExistsError when it does
    (also when another process made it meanwhile), and nothing is ever overwritten."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.link(tmp, path)  # fails where ``path`` exists, unlike a rename
    finally:
        Path(tmp).unlink(missing_ok=True)
