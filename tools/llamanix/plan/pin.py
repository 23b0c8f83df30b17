"""``llamanix variant pin``: point a variant's flake input at a revision, or its newest commit."""

from __future__ import annotations

import re
import shlex
from contextlib import nullcontext
from pathlib import Path

from llamanix.config.drift import DriftReport, drift_report
from llamanix.config.model import Config, suggest
from llamanix.core.errors import Problem, UserError
from llamanix.core.probe import Capabilities
from llamanix.core.variants import VARIANTS
from llamanix.external import nix
from llamanix.external.process import Runner
from llamanix.state.host_lock import flake_lock_root, host_lock

_REV = re.compile(r"^[A-Za-z0-9._-]+$")
_PINNED_BY_URL = re.compile(r"/[0-9a-f]{40}$")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise UserError(
            Problem(
                "llamanix variant pin",
                "VARIANT",
                f"unknown variant '{variant}'",
                suggest(variant, tuple(VARIANTS)),
            )
        )


def pin(
    variant: str,
    rev: str | None,
    latest: bool,
    flake_dir: Path,
    runner: Runner,
    wait_s: float = 0.0,
) -> str:
    """Point the variant's flake input at REV (or its newest commit); returns the input name."""
    _check_variant(variant)
    if (rev is None) == (not latest):
        raise UserError(
            Problem(
                "llamanix variant pin",
                "REV",
                "give a revision or --latest (not both)",
                f"e.g. llamanix variant pin CONFIG {variant} --latest",
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
                "llamanix variant pin",
                "VARIANT",
                f"{variant} is pinned by URL in flake.nix ({v.upstream})",
                "edit that URL to move it, or pin variant upstream, which carries the same code",
            )
        )
    if rev is not None and not _REV.match(rev):
        raise UserError(
            Problem(
                "llamanix variant pin",
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
        else host_lock(
            flake_lock_root(flake_dir), f"flake {flake_dir}", str(flake_dir), wait_s, "pin"
        )
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


# flake.nix's own URL for the nixpkgs input: what --latest moves it to.
_NIXPKGS_URL = "github:NixOS/nixpkgs/nixos-unstable"


def _target_url(variant: str, rev: str | None) -> str:
    v = VARIANTS[variant]
    if v.flake_input is None:
        repo, latest = "github:NixOS/nixpkgs", _NIXPKGS_URL
    else:
        repo, latest = "/".join(v.upstream.split("/")[:2]), v.upstream
    return latest if rev is None else f"{repo}/{rev}"


def probe_hint(variant: str, rev: str | None, config: str | None) -> list[str]:
    """How to get the probe of the build the pin would bring, without moving the pin: build it
    with the input overridden (flake.lock untouched) and probe its llama-server."""
    v = VARIANTS[variant]
    out_link = f"new-{variant}"
    build = [
        "nix",
        "build",
        f".#llama-cpp-{variant}",
        "--override-input",
        v.flake_input or "nixpkgs",
        _target_url(variant, rev),
        "--no-write-lock-file",
        "-o",
        out_link,
    ]
    again = ["llamanix", "variant", "pin", config or "CONFIG", variant]
    again += [
        *([rev] if rev else ["--latest"]),
        "--dry-run",
        "--previous",
        "old.json",
        "--capabilities",
        "new.json",
    ]
    return [
        "to list the flags this move changes for your config, probe both builds:",
        "  " + shlex.join(build),
        f"  llamanix variant probe {out_link}/bin/llama-server --json > new.json",
        "  llamanix variant probe BINARY-YOU-RUN-NOW --json > old.json",
        "  " + shlex.join(again),
    ]


def pin_drift(
    config: Config, variant: str, previous: Capabilities, capabilities: Capabilities
) -> DriftReport:
    """The drift report of the config's instances that run VARIANT; UserError when none does."""
    _check_variant(variant)
    names = tuple(n for n, i in config.instances.items() if i.variant == variant)
    used = ", ".join(sorted({i.variant for i in config.instances.values()}))
    if not names:
        raise UserError(
            Problem(
                config.source,
                "instances",
                f"no instance runs variant {variant}, so moving its pin changes no flag here",
                f"pin a variant your instances use ({used})",
            )
        )
    return drift_report(config, previous, capabilities, names)
