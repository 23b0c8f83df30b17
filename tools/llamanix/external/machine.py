"""What this machine is: NixOS or another distribution, whether systemd runs it, and its name.

``llamanix init`` writes a starter config from these, and the deploy commands check that a
host whose kind the config leaves to its default (NixOS) is one.
"""

from __future__ import annotations

import os
from pathlib import Path

NIXOS_MARKER = Path("/etc/NIXOS")
# systemd's own test (sd_booted(3)): this directory exists only when systemd is PID 1.
SYSTEMD_RUNTIME = Path("/run/systemd/system")
OS_RELEASE = (Path("/etc/os-release"), Path("/usr/lib/os-release"))


def is_nixos() -> bool:
    """NixOS marks itself with /etc/NIXOS (nixos-rebuild and its installer test for it)."""
    return NIXOS_MARKER.exists()


def systemd_booted() -> bool:
    return SYSTEMD_RUNTIME.is_dir()


def os_pretty_name() -> str:
    """PRETTY_NAME of os-release(5), e.g. "Debian GNU/Linux 12 (bookworm)"; "Linux" without."""
    for path in OS_RELEASE:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "PRETTY_NAME":
                return value.strip().strip("\"'") or "Linux"
    return "Linux"


def hostname() -> str:
    return os.uname().nodename.split(".")[0]
