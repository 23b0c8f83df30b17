"""How long a llama-server may take to become ready, from the size of what it loads.

A start is only a success once the server answers (``llamanix readiness``). Loading is bound by
reading the model files (disk, then host-to-device copies), so the deadline grows with their
size: a fixed part for process start-up and CUDA initialisation, plus a time per GiB that a slow
SATA disk (about 100 MiB/s, 10 s per GiB) meets twice over. Pure arithmetic: rendering uses it
for ``TimeoutStartSec=`` and the readiness check for its own deadline.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

BASE_S = 120
PER_GIB_S = 20
# Where the model files cannot be read at render time (a NixOS build sandbox, a remote host),
# the unit's start timeout is sized for this much; the readiness check, which runs next to the
# server, still computes its own deadline from the real sizes.
UNKNOWN_SIZE_GIB = 64
# systemd's own margin over the readiness deadline, so the check reports why before systemd
# kills it.
TIMEOUT_MARGIN_S = 30


def deadline_s(total_bytes: int) -> int:
    """Seconds allowed to load ``total_bytes`` of model files and answer."""
    return BASE_S + PER_GIB_S * math.ceil(total_bytes / 2**30)


def files_size(paths: Iterable[str]) -> int | None:
    """Total size of the files, or None when any of them cannot be read here."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            return None
    return total


def start_timeout_s(paths: Iterable[str]) -> int:
    """``TimeoutStartSec=`` for a unit loading these files."""
    size = files_size(paths)
    if size is None:
        size = UNKNOWN_SIZE_GIB * 2**30
    return deadline_s(size) + TIMEOUT_MARGIN_S
