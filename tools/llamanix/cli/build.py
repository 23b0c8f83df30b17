"""llamanix CLI command: build (a flake variant built by Nix on a Debian/Ubuntu host)."""

from __future__ import annotations

from pathlib import Path

import click

from llamanix.cli.host_flag import host_flag
from llamanix.cli.options import DIRECTORY, config_argument, host_option
from llamanix.config.model import load_config
from llamanix.plan.variant_build import driver_fix, plan_build, run_build


@click.command("build")
@click.argument("variant")
@config_argument()
@host_option("The host (of this machine) to build for; may be left out when the config has one.")
@click.option(
    "--flake",
    "flake_dir",
    type=DIRECTORY,
    help="Your llamanix checkout, whose flake.lock pins the source (default: beside CONFIG).",
)
@click.option(
    "--roots",
    type=DIRECTORY,
    help="Where the build's garbage-collector root goes (default: /var/lib/llamanix/builds, "
    "~/.local/state/llamanix/builds for a systemd-user host).",
)
@click.option("--dry-run", is_flag=True, help="Print the nix command; build and write nothing.")
def build_cmd(
    variant: str,
    config: Path,
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


def register(group: click.Group) -> None:
    group.add_command(build_cmd)
