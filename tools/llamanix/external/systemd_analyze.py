"""systemd-analyze, for checking rendered units: one function per subcommand."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

_EXPOSURE = re.compile(r"Overall exposure level for \S+:\s*([0-9.]+)")


def available() -> bool:
    return shutil.which("systemd-analyze") is not None


def verify(unit: Path, user: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = ["systemd-analyze", *(["--user"] if user else []), "verify", str(unit)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


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
