"""pip, for the host test bed: the project's wheel, and its dependencies as wheels for another
Python (a Debian host's), so the host installs everything offline from a directory."""

from __future__ import annotations

import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from llamanix.core.errors import ExternalCommandError


def wheel_argv(project: Path, out: Path) -> list[str]:
    """The project's own wheel, built as pip builds any sdist (its build-system table)."""
    return [
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
        str(project),
    ]  # fmt: skip


def sdist_download_argv(requirement: str, dest: Path) -> list[str]:
    """The source distribution of ``requirement`` alone (no dependencies, never a wheel)."""
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        requirement, "-d", str(dest),
    ]  # fmt: skip


def wheels_download_argv(requirements: Sequence[str], dest: Path) -> list[str]:
    """These exact wheels alone (no dependencies, never an sdist) into ``dest``."""
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--dest", str(dest), *requirements,
    ]  # fmt: skip


def download_argv(python: str, requirements: Sequence[str], out: Path) -> list[str]:
    """Binary wheels of ``requirements`` (and what they need) for CPython ``python`` ("3.13")
    on this machine's architecture, whatever Python runs this."""
    machine = platform.machine()
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in (17, 28, 31, 34)] + [
        f"manylinux2014_{machine}"
    ]
    abi = "cp" + python.replace(".", "")
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp", "--abi", abi, "--abi", "abi3",
        "--abi", "none",
    ]  # fmt: skip
    for tag in platforms:
        argv += ["--platform", tag]
    return [*argv, "--dest", str(out), *requirements]


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, errors="replace", check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ExternalCommandError(f"{what} failed (exit {done.returncode}): {' '.join(tail)}")


def wheel(project: Path, out: Path) -> Path:
    """Build ``project``'s wheel into ``out``; its path."""
    before = set(out.glob("*.whl")) if out.is_dir() else set()
    _run(wheel_argv(project, out), f"pip wheel {project}")
    built = sorted(set(out.glob("*.whl")) - before) or sorted(out.glob("llamanix-*.whl"))
    if not built:
        raise ExternalCommandError(f"pip wheel {project} wrote no wheel into {out}")
    return built[-1]


def download_wheels(requirements: Sequence[str], dest: Path) -> None:
    _run(wheels_download_argv(requirements, dest), "pip download")


def download(python: str, requirements: Sequence[str], out: Path) -> None:
    _run(download_argv(python, requirements, out), f"pip download for Python {python}")


def venv_argv(python: str, venv: Path) -> list[str]:
    """A venv of ``python`` (the host's python3) at ``venv``, with its own pip."""
    return [python, "-m", "venv", str(venv)]


def venv_install_argv(venv: Path, requirements: Sequence[str]) -> list[str]:
    """``requirements`` into ``venv`` by its own pip, which reads the host's pip configuration
    (/etc/pip.conf: an index mirror, or no index and a directory of wheels)."""
    return [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements]
