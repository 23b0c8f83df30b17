"""Where a host's deploy state lives: ``.llamanix-state/HOST/`` beside the config (its
generations, its manager record, and ``up``'s render directory). Its own module so that a
command can see whether there is any state without loading the records that read it, and in
core so that the exporter's unit (render) can hand the records to the exporter."""

from __future__ import annotations

from pathlib import Path

from llamanix.core.trusted_path import require_trusted
from llamanix.core.types import child_name

STATE_DIR = ".llamanix-state"


def host_state_root(config: Path, host: str) -> Path:
    """``.llamanix-state/HOST``: a host's name is one directory's name (core.types checks it
    in the config; this holds for a name from anywhere else, e.g. --host). As root, the
    config's directory must be root's alone: rollback installs the unit files kept there."""
    folder = config.resolve().parent
    require_trusted(folder, str(config), "", "keep its generations beside it and install them")
    return folder / STATE_DIR / child_name(host)
