"""Read what the visibility rules (core.visibility) need about a path from this machine."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from llamanix.core import file_reader
from llamanix.core.errors import UserError
from llamanix.core.visibility import Node, PathState, Reader


def _node(path: str) -> Node | None:
    try:
        st = os.stat(path)  # follows symlinks: the mode a lookup through ``path`` meets
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    return Node(path, st.st_mode, st.st_uid, st.st_gid)


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def path_state(path: str) -> PathState:
    """``path`` (absolute) as found here: the directories a lookup passes and the file."""
    written = posixpath.normpath(path)
    resolved = os.path.realpath(written)
    dirs: list[Node] = []
    seen: set[str] = set()
    for candidate in (written, resolved):
        for directory in _ancestors(candidate):
            if directory in seen:
                continue
            seen.add(directory)
            node = _node(directory)
            if node is None:
                break  # nothing below a missing directory exists
            dirs.append(node)
    return PathState(
        path=written,
        resolved=resolved,
        dirs=tuple(dirs),
        target=_node(written),
        is_link=os.path.islink(written),
    )


def current_reader() -> Reader:
    """The user running llamanix, who is the one a user unit runs as."""
    return Reader(os.getuid(), frozenset({os.getgid(), *os.getgroups()}))


def script_interpreter(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names (``/usr/bin/env`` is not one: what it
    finds depends on the unit's PATH), or None."""
    try:
        with file_reader.open_regular(Path(path)) as fh:  # a FIFO named as a binary: no wait
            first = fh.readline(256)
    except (UserError, OSError):
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words or not words[0].startswith("/") or posixpath.basename(words[0]) == "env":
        return None
    return words[0]
