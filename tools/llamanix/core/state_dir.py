"""Where a host's deploy state lives: ``.llamanix-state/HOST/`` beside the config (its
generations, its manager record, and ``up``'s render directory). Its own module so that a
command can see whether there is any state without loading the records that read it, and in
core so that the exporter's unit (render) can hand the records to the exporter."""

from __future__ import annotations

from pathlib import Path

STATE_DIR = ".llamanix-state"


def host_state_root(config: Path, host: str) -> Path:
    return config.resolve().parent / STATE_DIR / host
