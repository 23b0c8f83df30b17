"""Atomic file writes (a reader sees the old file or the new one, never half of either), trusted
archive extraction, a blocking file lock, and a command's work directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
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
