"""journalctl: a unit's last log lines, as its server printed them."""

from __future__ import annotations

import subprocess

from llamanix.core.errors import ExternalCommandError

# Enough for a server's start-up and its last requests.
JOURNAL_LINES = 500


def journalctl_argv(
    unit: str, user: bool = False, lines: int = JOURNAL_LINES, own: bool = False
) -> list[str]:
    """``own``: only what the unit's processes printed, not systemd's lines about the unit."""
    argv = ["journalctl"]
    if user:
        argv.append("--user")
    if own:
        argv.append(f"_SYSTEMD_{'USER_' if user else ''}UNIT={unit}")
    else:
        argv += ["-u", unit]
    return [*argv, "-n", str(lines), "--no-pager", "-o", "cat"]


def read_journal(
    unit: str, user: bool = False, lines: int = JOURNAL_LINES, own: bool = False
) -> str:
    """The unit's last log lines, as llama-server printed them."""
    argv = journalctl_argv(unit, user, lines, own)
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=60, check=False
        )
    except FileNotFoundError:
        raise ExternalCommandError("journalctl not found: use --log FILE instead") from None
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"{' '.join(argv)} failed with exit code {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout
