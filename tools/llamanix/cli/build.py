"""llamanix CLI command: ``variant build`` (a flake variant built by Nix on a Debian/Ubuntu
host); the group is in variant.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from llamanix.cli.host_flag import host_flag
from llamanix.cli.options import (
    DIRECTORY,
    config_argument,
    dry_run_flag,
    host_option,
    refuse_swapped,
)
from llamanix.config.model import load_config
from llamanix.plan.variant_build import driver_fix, plan_build, run_build

Command = Callable[..., Any]


def _build_options(f: Command) -> Command:
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


_OPTIONS = (
    host_option(),
    click.option(
        "--flake",
        "flake_dir",
        type=DIRECTORY,
        help="Your llamanix checkout, whose flake.lock pins the source (default: beside CONFIG).",
    ),
    click.option(
        "--roots",
        type=DIRECTORY,
        help="Where the build's garbage-collector root goes (default: /var/lib/llamanix/builds, "
        "~/.local/state/llamanix/builds for a systemd-user host).",
    ),
    dry_run_flag("Print the nix command; build and write nothing."),
)


@click.command("build")
@config_argument()
@click.argument("variant")
@_build_options
def build_cmd(
    config: Path,
    variant: str,
    host: str | None,
    flake_dir: Path | None,
    roots: Path | None,
    dry_run: bool,
) -> None:
    """Build VARIANT with Nix from the flake's pins, and record it in hosts.NAME.binaries.

    For a Debian/Ubuntu host (kind systemd or systemd-user): `nix build` of the flake's own
    package, for the host's cuda_archs (the same pins, cmake flags and binary cache as a NixOS
    host's), its out link a garbage-collector root named after the pinned revision. The
    binary is probed, then written into CONFIG as hosts.NAME.binaries.VARIANT, which a switch
    to the variant runs. Needs Nix with flakes (Debian: apt-get install nix-bin).
    """
    refuse_swapped("variant build", config, variant)
    _build(config, variant, host, flake_dir, roots, dry_run)


@click.command("build", hidden=True)
@click.argument("variant")
@config_argument()
@_build_options
def build_before_variant(
    variant: str,
    config: Path,
    host: str | None,
    flake_dir: Path | None,
    roots: Path | None,
    dry_run: bool,
) -> None:
    """`llamanix build VARIANT CONFIG`: `variant build` before it took CONFIG first
    (cli.MOVED)."""
    _build(config, variant, host, flake_dir, roots, dry_run)


def _build(
    config: Path,
    variant: str,
    host: str | None,
    flake_dir: Path | None,
    roots: Path | None,
    dry_run: bool,
) -> None:
    cfg = load_config(config)
    with host_flag(host):
        plan = plan_build(cfg, host, variant, flake_dir, roots)
    binary = run_build(config, plan, click.echo, dry_run)
    if dry_run and plan.cuda_archs:
        for line in driver_fix():
            click.echo(f"# the NVIDIA driver for a nixpkgs CUDA build: {line}")
    if binary is not None:
        click.echo(
            f"next: llamanix switch {config} --set instances.NAME.variant={variant} "
            "(each instance to run it)"
        )
