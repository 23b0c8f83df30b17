"""``llamanix pin``: point a variant's flake input at a revision, or its newest commit."""

from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path

from llamanix.core.config import suggest
from llamanix.core.errors import Problem, UserError
from llamanix.core.variants import VARIANTS
from llamanix.deploy.generations import STATE_DIR
from llamanix.deploy.host_lock import host_lock
from llamanix.external import nix
from llamanix.external.process import Runner

_REV = re.compile(r"^[A-Za-z0-9._-]+$")
_PINNED_BY_URL = re.compile(r"/[0-9a-f]{40}$")


def pin(
    variant: str,
    rev: str | None,
    latest: bool,
    flake_dir: Path,
    runner: Runner,
    wait_s: float = 0.0,
) -> str:
    """Point the variant's flake input at REV (or its newest commit); returns the input name."""
    if variant not in VARIANTS:
        raise UserError(
            Problem(
                "llamanix pin",
                "VARIANT",
                f"unknown variant '{variant}'",
                suggest(variant, tuple(VARIANTS)),
            )
        )
    if (rev is None) == (not latest):
        raise UserError(
            Problem(
                "llamanix pin",
                "REV",
                "give a revision or --latest (not both)",
                f"e.g. llamanix pin {variant} --latest",
            )
        )
    if not (flake_dir / "flake.nix").exists():
        raise UserError(
            Problem(
                str(flake_dir),
                "--flake",
                "no flake.nix here",
                "run in the llamanix flake or pass --flake DIR",
            )
        )
    v = VARIANTS[variant]
    flake_input = v.flake_input or "nixpkgs"
    if _PINNED_BY_URL.search(v.upstream):
        # `nix flake lock` cannot move an input whose URL names a commit (and an override would
        # be undone by the next lock, whose `original` no longer matches flake.nix).
        raise UserError(
            Problem(
                "llamanix pin",
                "VARIANT",
                f"{variant} is pinned by URL in flake.nix ({v.upstream})",
                "edit that URL to move it, or pin variant upstream, which carries the same code",
            )
        )
    if rev is not None and not _REV.match(rev):
        raise UserError(
            Problem(
                "llamanix pin",
                "REV",
                f"'{rev}' is not a revision",
                "give a commit hash, tag or branch name",
            )
        )
    # flake.lock is the flake's, shared by all its hosts: one pin at a time (a dry run changes
    # nothing and locks nothing).
    lock = (
        nullcontext()
        if runner.dry_run
        else host_lock(flake_dir / STATE_DIR, f"flake {flake_dir}", str(flake_dir), wait_s, "pin")
    )
    with lock:
        if latest:
            nix.flake_lock_update_input(runner, flake_dir, flake_input)
            return flake_input
        assert rev is not None
        repo = (
            "github:NixOS/nixpkgs" if v.flake_input is None else "/".join(v.upstream.split("/")[:2])
        )
        nix.flake_lock_override_input(runner, flake_dir, flake_input, f"{repo}/{rev}")
        return flake_input
