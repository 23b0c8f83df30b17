"""Recording stand-ins for programs that cannot run here (nvidia-smi, cuobjdump, journalctl).

A stand-in only records its argv and prints a recorded output, so a test can assert the exact
command line llamanix runs and feed the parser real-shaped text.
"""

from __future__ import annotations

import stat
from pathlib import Path


def stand_in(bin_dir: Path, name: str, output_file: Path) -> Path:
    """A script named ``name`` that records its argv (one per line) and prints a recording."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    record = bin_dir / f"{name}.argv"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > "{record}"\ncat "{output_file}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return record


def recorded_argv(record: Path) -> list[str]:
    lines = record.read_text().splitlines()
    return [Path(lines[0]).name, *lines[1:]]
