"""Where a host's deploy state lives (``core.state_dir``, which render reads too), for the
deploy modules that name it here."""

from __future__ import annotations

from llamanix.core.state_dir import STATE_DIR, host_state_root

__all__ = ["STATE_DIR", "host_state_root"]
