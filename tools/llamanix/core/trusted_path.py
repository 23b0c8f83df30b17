"""Whether root may act on a file a config names: run it, or keep its records beside it.

llamanix runs as root on the hosts it deploys. A program root runs (a llama-server asked for
its ``--help``), or a directory whose files root later installs (the state directory beside a
config), must be changeable by root alone: otherwise whoever may change it gets root. The rule
is OpenSSH's StrictModes: the file and every directory above it, on the path as written and on
the path its links lead to, belong to root and are writable by nobody else, a sticky directory
(``/tmp``) aside. Run as another user, llamanix trusts that user's own files, and checks
nothing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from llamanix.core.errors import Problem, UserError


def _chain(path: Path) -> list[Path]:
    return [path, *path.parents]


def _problem(candidate: Path) -> str | None:
    try:
        st = candidate.lstat()
    except OSError:
        return None  # what is missing is for the caller's own check to say
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's target is checked on the resolved path
    if st.st_uid != 0:
        return f"{candidate} belongs to uid {st.st_uid}"
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & 0o022 and not sticky_dir:
        return (
            f"{candidate} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        )
    return None


def untrusted(path: Path) -> str | None:
    """Why someone other than root could change what ``path`` is (one clause), or None. None
    as well when this process is not root."""
    if os.geteuid() != 0:
        return None
    written = Path(os.path.abspath(path))
    resolved = Path(os.path.realpath(written))
    for candidate in dict.fromkeys([*_chain(written), *_chain(resolved)]):
        problem = _problem(candidate)
        if problem is not None:
            return problem
    return None


def require_trusted(path: Path, source: str, field: str, what: str) -> None:
    """Refuse, in one line, to ``what`` (e.g. "run it") when someone other than root could
    change ``path``."""
    problem = untrusted(path)
    if problem is not None:
        raise UserError(
            Problem(
                source,
                field,
                f"{problem}: llamanix runs as root and would {what}, so whoever may change it "
                "would act as root",
                "give root alone the file and each directory above it (chown root, chmod go-w), "
                "e.g. install programs under /usr/local/bin or /opt and keep configs under "
                "/etc/llamanix",
            )
        )
