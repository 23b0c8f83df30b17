"""ssh-keygen, for the fleet bed: each host's own host key, and the controller's client key.

Made on this machine (the hosts need no entropy of their own at boot, and the controller's
known_hosts is written from the real public keys before any connection).
"""

from __future__ import annotations

from pathlib import Path

from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import run_captured


def keygen_argv(path: Path, comment: str) -> list[str]:
    """A new ed25519 key pair at ``path`` and ``path.pub``, without a passphrase."""
    return ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]


def keygen(path: Path, comment: str) -> Path:
    """Make the key pair (``path`` must not exist); the public key's path."""
    try:
        done = run_captured(keygen_argv(path, comment), timeout_s=30)
    except ExternalCommandError as err:
        raise ExternalCommandError(f"{err} (apt-get install openssh-client)") from None
    if done.returncode != 0:
        raise ExternalCommandError(f"ssh-keygen {path}: {done.stderr.strip()}")
    return path.with_name(path.name + ".pub")
