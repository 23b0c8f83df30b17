"""One function per nix / nixos-rebuild command llamanix runs (argv asserted by the tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llamanix.core import file_reader
from llamanix.core.schema import NixosSudo
from llamanix.external.process import Runner


def login_user(target: str) -> str | None:
    """The ssh login of a target ("root@gpu1:22" -> "root"), or None where ssh picks it."""
    user, at, _ = target.rpartition("@")
    return user if at else None


def running_as_root() -> bool:
    return os.geteuid() == 0


def sudo_flag(target: str | None, sudo: NixosSudo) -> list[str]:
    """How nixos-rebuild gets root for activation. ``auto``: no flag for a ``root@`` target
    (so the target needs no sudo installed) or for this machine when llamanix runs as root,
    else nixos-rebuild-ng's ``--sudo`` (the older nixos-rebuild's ``--use-remote-sudo`` is
    deprecated there): a user's local switch activates through sudo, as a remote one does."""
    if sudo == "sudo":
        return ["--sudo"]
    if sudo == "use-remote-sudo":
        return ["--use-remote-sudo"]
    if sudo == "none":
        return []
    if target is None:
        return [] if running_as_root() else ["--sudo"]
    if login_user(target) == "root":
        return []
    return ["--sudo"]


def remote_args(target: str | None, build_host: str | None, sudo: NixosSudo) -> list[str]:
    """--target-host, --build-host (so a CUDA build runs on the builder, not here) and the
    sudo flag, in the order nixos-rebuild's manual writes them."""
    out = ["--target-host", target] if target else []
    out += ["--build-host", build_host] if build_host else []
    return out + sudo_flag(target, sudo)


def nixos_rebuild_switch_argv(
    host: str, target: str | None, build_host: str | None = None, sudo: NixosSudo = "auto"
) -> list[str]:
    return [
        "nixos-rebuild", "switch", "--flake", f".#{host}", *remote_args(target, build_host, sudo)
    ]  # fmt: skip


def nixos_rebuild_rollback_argv(target: str | None, sudo: NixosSudo = "auto") -> list[str]:
    # No --build-host: the previous generation is on the target already, nothing is built.
    return ["nixos-rebuild", "switch", "--rollback", *remote_args(target, None, sudo)]


def nixos_rebuild_switch(
    runner: Runner,
    flake_dir: Path,
    host: str,
    target: str | None,
    build_host: str | None = None,
    sudo: NixosSudo = "auto",
) -> None:
    runner.run(nixos_rebuild_switch_argv(host, target, build_host, sudo), cwd=flake_dir)


def nixos_rebuild_rollback(
    runner: Runner, flake_dir: Path, target: str | None, sudo: NixosSudo = "auto"
) -> None:
    runner.run(nixos_rebuild_rollback_argv(target, sudo), cwd=flake_dir)


def flake_lock_update_input(runner: Runner, flake_dir: Path, flake_input: str) -> None:
    # `nix flake update INPUT` (Nix 2.19 and later); `nix flake lock --update-input` is its
    # deprecated spelling.
    runner.run(["nix", "flake", "update", flake_input], cwd=flake_dir)


def flake_lock_override_input(runner: Runner, flake_dir: Path, flake_input: str, url: str) -> None:
    runner.run(["nix", "flake", "lock", "--override-input", flake_input, url], cwd=flake_dir)


def locked_revisions(flake_dir: Path) -> dict[str, str]:
    """Input name -> locked revision, read from flake.lock (empty when there is none)."""
    path = flake_dir / "flake.lock"
    data: Any = file_reader.json_if_present(path, source=str(path))
    if data is None:
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
