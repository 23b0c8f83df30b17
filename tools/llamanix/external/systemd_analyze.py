"""systemd-analyze, for checking rendered units: one function per subcommand."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

_EXPOSURE = re.compile(r"Overall exposure level for \S+:\s*([0-9.]+)")
_EXPOSURES = re.compile(r"Overall exposure level for (\S+):\s*([0-9.]+)")


def available() -> bool:
    return shutil.which("systemd-analyze") is not None


def verify(unit: Path, user: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = ["systemd-analyze", *(["--user"] if user else []), "verify", str(unit)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def security_exposures_argv(units: list[Path]) -> list[str]:
    return ["systemd-analyze", "security", "--offline=yes", "--no-pager", *map(str, units)]


def security_exposures(units: list[Path]) -> dict[str, float]:
    """Each unit's overall exposure (0 safest .. 10) by unit file name, from one run (a plan of
    many instances pays one program start, not one per unit); a unit it cannot measure is
    left out."""
    if not units:
        return {}
    proc = subprocess.run(
        security_exposures_argv(units), capture_output=True, text=True, check=False
    )
    return {m.group(1): float(m.group(2)) for m in _EXPOSURES.finditer(proc.stdout + proc.stderr)}


def security_exposure(unit: Path) -> float | None:
    """The unit's overall exposure (0 safest .. 10), or None when it cannot be measured."""
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    m = _EXPOSURE.search(proc.stdout + proc.stderr)
    return float(m.group(1)) if m else None
