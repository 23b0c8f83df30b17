"""``llamanix up``'s status file: its name and its reader. The supervisor writes it; the
managers and ``plan`` read it without importing the supervisor (and the server process and HTTP
client behind it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llamanix.external.process import alive

STATUS = "up-status.json"


def read_status(units_dir: Path) -> dict[str, Any] | None:
    """``up``'s status file, or None when no live ``up`` owns this directory."""
    try:
        data = json.loads((units_dir / STATUS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not alive(int(data.get("pid", 0))):
        return None
    return data
