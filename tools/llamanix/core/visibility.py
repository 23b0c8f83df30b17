"""Which paths a unit will not see or cannot read: pure rules over a small snapshot of the files.

A system unit runs as a ``DynamicUser`` (no supplementary groups, owner of nothing on the host)
with ``PrivateTmp=yes``, ``PrivateDevices=yes`` and ``ProtectHome=yes`` (``read-only`` when one
of its paths is under ``/home`` or ``/root``); a user unit runs as the user who installs it, with
the same ``PrivateTmp`` and ``ProtectHome``. A path the unit does not see or cannot read fails
the start with status 203/EXEC or "Permission denied". The rules here turn a path, what the unit
does with it and (where the file system was read) its snapshot into one finding, or none.

The readability rule reads mode bits, not ``access(2)``: llamanix often runs as root, for whom
``access`` says yes to everything, while the dynamic user gets only the "other" bits.
"""

from __future__ import annotations

import posixpath
import stat
from dataclasses import dataclass
from typing import Literal

# What the unit does with a path: reads a model (or a draft), runs the server binary, runs
# llamanix itself (a script: read and run), or has PID 1 read the key (LoadCredential=).
Role = Literal["model", "binary", "llamanix", "key"]
ProtectHome = Literal["yes", "read-only", "tmpfs"]

MISSING_FIX = "check the path; a config meant for another machine is checked with validate --remote"
_HOME_DIRS = ("/home", "/root", "/run/user")  # what ProtectHome= covers
_TMP_DIRS = ("/tmp", "/var/tmp")

_MOVES: dict[Role, str] = {
    "model": "move it under /srv/models",
    "binary": "install it under /opt or /usr/local",
    "llamanix": "install llamanix into a venv under /opt: python3 -m venv /opt/llamanix, then "
    "run /opt/llamanix/bin/llamanix",
    "key": "move it where it stays, e.g. /etc/llamanix/ with mode 0600",
}


@dataclass(frozen=True)
class Sandbox:
    """What of the host's file system the unit sees, as its unit text says."""

    dynamic_user: bool  # a system unit; a user unit runs as the user who installs it
    protect_home: ProtectHome
    private_devices: bool  # its own /dev: /dev/shm is empty


@dataclass(frozen=True)
class Reader:
    """Who opens the files: ``uid`` None is a dynamic user, which owns nothing and has no
    groups, so only the "other" permission bits apply to it."""

    uid: int | None
    gids: frozenset[int] = frozenset()

    def describe(self) -> str:
        if self.uid is None:
            return "the service's dynamic user"
        return f"the unit's user (uid {self.uid})"


@dataclass(frozen=True)
class Node:
    """One file or directory as ``stat`` (following symlinks) saw it."""

    path: str
    mode: int
    uid: int
    gid: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


@dataclass(frozen=True)
class PathState:
    """A path as found on this machine.

    ``dirs``: every existing directory a lookup of the path passes, from ``/`` down, along the
    path as written and along its resolved form (they differ when a symlink is on the way).
    ``target``: the file itself, symlinks followed; None when it does not exist.
    """

    path: str
    resolved: str
    dirs: tuple[Node, ...]
    target: Node | None
    is_link: bool = False


def under(path: str, directory: str) -> bool:
    path = posixpath.normpath(path)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def protect_home(paths: list[str], user: bool = False) -> ProtectHome:
    """The unit's ProtectHome=: read-only when something it runs or reads is in a home
    directory, so that it stays visible. Otherwise homes are hidden: "yes" for a system unit;
    "tmpfs" for a user unit, whose own StateDirectory= and CacheDirectory= are in the user's
    home and are mounted into the empty /home ("yes" would hide them too, and the start fails
    at CHDIR)."""
    if any(under(p, d) for p in paths for d in ("/home", "/root")):
        return "read-only"
    return "tmpfs" if user else "yes"


def hidden_by(path: str, sandbox: Sandbox) -> tuple[str, str] | None:
    """(the directory, the setting that hides it) when the unit does not see ``path``."""
    for directory in _TMP_DIRS:
        if under(path, directory):
            return directory, "PrivateTmp=yes gives it an empty one"
    if sandbox.private_devices and under(path, "/dev/shm"):
        return "/dev/shm", "PrivateDevices=yes gives it its own /dev"
    if sandbox.protect_home in ("yes", "tmpfs"):
        for directory in _HOME_DIRS:
            if under(path, directory):
                return directory, f"ProtectHome={sandbox.protect_home} hides it"
    return None


def _bits(node: Node, reader: Reader) -> int:
    """The rwx bits (4, 2, 1) that apply to ``reader``; root gets rw, and x where anyone has it
    or on a directory."""
    mode = stat.S_IMODE(node.mode)
    if reader.uid == 0:
        return 6 | (1 if node.is_dir or mode & 0o111 else 0)
    if reader.uid is not None and node.uid == reader.uid:
        return (mode >> 6) & 7
    if reader.uid is not None and node.gid in reader.gids:
        return (mode >> 3) & 7
    return mode & 7


def _needs(role: Role, node: Node) -> int:
    if node.is_dir:
        return 5  # a package directory: listed and searched by the import system
    return {"model": 4, "key": 4, "binary": 1, "llamanix": 5}[role]


def _mode(node: Node, path: str) -> str:
    name = "it" if node.path == posixpath.normpath(path) else node.path
    return f"{name} is mode {stat.S_IMODE(node.mode):04o}"


def _open_fix(role: Role, reader: Reader) -> str:
    """Move it, or open it up to the reader (llamanix itself: only the venv helps, since its
    interpreter and package would need opening too)."""
    if role == "llamanix":
        return _MOVES[role]
    if reader.uid is not None:
        grant = f"give uid {reader.uid} access to it and to each directory above it"
    elif role == "binary":
        grant = "chmod o+x it and each directory above it"
    else:
        grant = "chmod o+r it and o+x each directory above it"
    return grant if role == "key" else f"{_MOVES[role]}, or {grant}"


def finding(
    path: str,
    role: Role,
    sandbox: Sandbox,
    state: PathState | None = None,
    reader: Reader | None = None,
) -> tuple[str, str] | None:
    """(message, fix) for a path the unit will not see or cannot use, or None.

    Without ``state`` (the file system was not read: a remote host, or ``validate --remote``
    for a config meant for another machine) only where the path is counts. Without
    ``reader`` its modes are not checked (the key file, which PID 1 reads as root). With
    ``state``, the units run here, so a path that does not exist (a typo) is named: the
    server would fail its start on it.
    """
    fix = _MOVES[role]
    if role == "key":
        for directory in _TMP_DIRS:
            for where in (path, state.resolved if state else path):
                if under(where, directory):
                    shown = f"{path} is" if where == path else f"{path} resolves to {where},"
                    return (
                        f"{shown} under {directory}, which a reboot or systemd-tmpfiles "
                        "empties: the unit's LoadCredential= then fails its start",
                        fix,
                    )
    else:
        hidden = hidden_by(path, sandbox)
        if hidden:
            directory, why = hidden
            return f"{path} is under {directory}, which the unit does not see: {why}", fix
        if state is not None and state.resolved != posixpath.normpath(path):
            hidden = hidden_by(state.resolved, sandbox)
            if hidden:
                directory, why = hidden
                return (
                    f"{path} resolves to {state.resolved}, under {directory}, which the unit "
                    f"does not see: {why}",
                    fix,
                )
    if state is None:
        return None
    runs = role == "binary" or (role == "llamanix" and not (state.target and state.target.is_dir))
    verb = "cannot be run by" if runs else "is not readable by"
    if reader is not None:
        # A directory on the way that the reader cannot search hides the file, present or not.
        for node in state.dirs:
            if not _bits(node, reader) & 1:
                return f"{path} {verb} {reader.describe()}: {_mode(node, path)}", _open_fix(
                    role, reader
                )
    if state.target is None:
        if state.is_link:
            return f"{path} is a symlink to {state.resolved}, which does not exist", (
                "point it at the file"
            )
        return f"{path} does not exist", MISSING_FIX
    if reader is not None:
        needed = _needs(role, state.target)
        if _bits(state.target, reader) & needed != needed:
            return f"{path} {verb} {reader.describe()}: {_mode(state.target, path)}", _open_fix(
                role, reader
            )
    return None


def key_open_to_all(path: str, state: PathState) -> tuple[str, str] | None:
    """(message, fix) when a key file is readable by every user of the machine: "other" may
    read it and search every directory on the way to it. Any local process could then use the
    key; the unit needs no such thing (systemd reads the key, as root or as the unit's user)."""
    if state.target is None or state.target.is_dir:
        return None
    anyone = Reader(None)
    if not all(_bits(node, anyone) & 1 for node in state.dirs):
        return None
    if not _bits(state.target, anyone) & 4:
        return None
    return (
        f"{path} is readable by every user of this machine ({_mode(state.target, path)}): "
        "any local process can use the key",
        f"chmod 600 {path}",
    )
