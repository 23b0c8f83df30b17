"""``nix build`` of one of the flake's llama.cpp packages, on a machine that has Nix but is not
NixOS: the argv (asserted by the tests) and the run, whose progress goes to the terminal and
whose result (``--json``) is read from stdout."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from llamanix.core.errors import ExternalCommandError

# Flakes and the nix command are still "experimental" to every Nix release that ships them;
# Debian 12's nix-bin (2.8) has neither on by default.
NIX = ("nix", "--extra-experimental-features", "nix-command flakes")


def build_argv(installable: list[str], out_link: Path) -> list[str]:
    """``installable``: ``FLAKE#ATTR``, or ``--impure --expr EXPR``. The out link is the build's
    garbage-collector root: ``nix-collect-garbage`` keeps what a unit runs."""
    return [*NIX, "build", "--json", "--out-link", str(out_link), *installable]


def nix_build(argv: list[str]) -> str:
    """Run the build; the store path it made (its ``out`` output)."""
    try:
        # stderr (the build's progress and log) goes to the terminal; stdout is the JSON.
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    except OSError as err:
        raise ExternalCommandError(
            f"cannot run {argv[0]}: {err.strerror} (install Nix: apt-get install nix-bin, or "
            "the installer of nixos.org)"
        ) from None
    if proc.returncode != 0:
        raise ExternalCommandError(f"{shlex.join(argv)} failed with exit code {proc.returncode}")
    try:
        return str(json.loads(proc.stdout)[0]["outputs"]["out"])
    except (ValueError, LookupError, TypeError):
        raise ExternalCommandError(
            f"{shlex.join(argv)} printed no store path: {proc.stdout.strip()[:200]!r}"
        ) from None
