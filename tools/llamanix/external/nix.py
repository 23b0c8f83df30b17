"""One function per nix / nixos-rebuild command llamanix runs (argv asserted by the tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llamanix.external.process import Runner


def remote_args(target: str | None) -> list[str]:
    # --use-remote-sudo: activation needs root on the target, the ssh login need not be root.
    return ["--target-host", target, "--use-remote-sudo"] if target else []


def nixos_rebuild_switch(runner: Runner, flake_dir: Path, host: str, target: str | None) -> None:
    runner.run(
        ["nixos-rebuild", "switch", "--flake", f".#{host}", *remote_args(target)], cwd=flake_dir
    )


def nixos_rebuild_rollback(runner: Runner, flake_dir: Path, target: str | None) -> None:
    runner.run(["nixos-rebuild", "switch", "--rollback", *remote_args(target)], cwd=flake_dir)


def flake_lock_update_input(runner: Runner, flake_dir: Path, flake_input: str) -> None:
    runner.run(["nix", "flake", "lock", "--update-input", flake_input], cwd=flake_dir)


def flake_lock_override_input(runner: Runner, flake_dir: Path, flake_input: str, url: str) -> None:
    runner.run(["nix", "flake", "lock", "--override-input", flake_input, url], cwd=flake_dir)


def locked_revisions(flake_dir: Path) -> dict[str, str]:
    """Input name -> locked revision, read from flake.lock (empty when there is none)."""
    try:
        data: Any = json.loads((flake_dir / "flake.lock").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    nodes = data.get("nodes", {}) if isinstance(data, dict) else {}
    root = nodes.get(data.get("root", "root"), {}) if isinstance(nodes, dict) else {}
    out: dict[str, str] = {}
    for name, ref in (root.get("inputs") or {}).items():
        node = nodes.get(ref) if isinstance(ref, str) else None
        rev = (node or {}).get("locked", {}).get("rev")
        if isinstance(rev, str):
            out[name] = rev
    return out
