"""A control group of its own for each container a process boots side by side with others.

``systemd-nspawn --keep-unit`` (no machined, no unit of its own) puts the container's tree under
``payload`` in the cgroup of the process that started it. Two containers started by one process
then share that tree: ``user.slice/user-1001.slice`` of one is the other's too, and stopping a
user manager in one waits for the other's processes, which it cannot see or kill. Each of the
fleet bed's hosts therefore starts in a cgroup of its own, a child of this process's, in the
hierarchies nspawn uses: the unified one (cgroup2) and, on a hybrid machine, name=systemd.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def _own_paths() -> dict[str, str]:
    """This process's cgroup in each hierarchy nspawn uses: "unified" and "name=systemd"."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            found["unified"] = path
        elif "name=systemd" in controllers.split(","):
            found["name=systemd"] = path
    return found


def _mounts() -> dict[str, tuple[str, Path]]:
    """Where each of those hierarchies is mounted: (the mount's root, its mount point)."""
    found: dict[str, tuple[str, Path]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, (fstype, _source, options) = before.split(), after.split()[:3]
        if fstype == "cgroup2":
            found.setdefault("unified", (fields[3], Path(fields[4])))
        elif fstype == "cgroup" and "name=systemd" in options.split(","):
            found.setdefault("name=systemd", (fields[3], Path(fields[4])))
    return found


def make_own(name: str) -> tuple[Path, ...]:
    """Make child cgroup ``name`` of this process's in each hierarchy; their directories (a
    process joins by writing its pid to each one's cgroup.procs)."""
    mounts = _mounts()
    made: list[Path] = []
    for hierarchy, path in _own_paths().items():
        if hierarchy not in mounts:
            continue
        root, mount_point = mounts[hierarchy]
        relative = path[len(root) :] if path.startswith(root) else path
        directory = mount_point / relative.lstrip("/") / name
        directory.mkdir(exist_ok=True)
        made.append(directory)
    return tuple(made)


def remove(directories: tuple[Path, ...]) -> None:
    """Remove the cgroups and what was made under them, deepest first, once no process is in
    them (a cgroup directory goes with rmdir, its control files with it). One that still holds
    a process stays: it is not this function's to kill."""
    for top in directories:
        if not top.is_dir():
            continue
        nested = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for directory in [*nested, top]:
            with contextlib.suppress(OSError):
                directory.rmdir()
