"""llamanix CLI command: init (a starter config from what this machine has)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from llamanix.cli.options import DIRECTORY, FILE, exit_with
from llamanix.config.model import load_config
from llamanix.core.errors import Problem, UserError
from llamanix.external.files import create_new
from llamanix.plan import init_config


@click.command("init")
@click.argument("out", type=FILE, default="llamanix.toml", required=False)
@click.option(
    "--models",
    "models_dir",
    type=DIRECTORY,
    help="A directory of GGUF files: the first becomes the instance's model.",
)
@click.option(
    "--binary",
    "binaries",
    multiple=True,
    type=FILE,
    help="A llama-server to probe besides those on PATH, /usr/local/bin and /opt; repeatable.",
)
@click.option("--host", "host", help="The host's name in the config (default: this machine's).")
@click.option("--instance", default="chat", show_default=True, help="The instance's name.")
def init_cmd(
    out: Path, models_dir: Path | None, binaries: tuple[Path, ...], host: str | None, instance: str
) -> None:
    """Write a starter config (default ./llamanix.toml) from what this machine has.

    It names this machine as a host of the kind it is (NixOS, or systemd units elsewhere),
    each llama-server it finds with the variant its --help speaks (probed), the first GGUF of
    --models as the instance's model, and the GPU nvidia-smi reports with its compute
    capability. It never overwrites a file, checks what it wrote as validate does, and
    prints the next command.
    """
    if out.exists() or out.is_symlink():
        raise UserError(
            Problem(str(out), "", "exists already, and init never overwrites a file",
                    "name another file, e.g. llamanix init new.toml, or move this one away")
        )  # fmt: skip
    if not out.parent.is_dir():
        raise UserError(Problem(str(out), "", "its directory does not exist", "create it first"))
    if models_dir is not None and not models_dir.is_dir():
        raise UserError(
            Problem("llamanix init", "--models", f"{models_dir} is not a directory",
                    "name the directory that holds your GGUF files")
        )  # fmt: skip
    for binary in binaries:
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise UserError(
                Problem("llamanix init", "--binary", f"{binary} is not an executable file",
                        "give the path of a llama-server binary")
            )  # fmt: skip
    name = host or init_config.host_name_here()
    found = init_config.look(models_dir, binaries)
    text = init_config.config_text(found, name, instance, models_dir)
    try:
        create_new(out, text)
    except FileExistsError:
        raise UserError(
            Problem(str(out), "", "was made by another program meanwhile; init overwrote nothing")
        ) from None
    found_binaries = [b for b in found.binaries if b.variant is not None]
    click.echo(
        f"init: wrote {out}: host {name} ({found.kind}), instance {instance}; "
        f"{len(found_binaries)} llama-server(s), {len(found.models)} model(s), "
        f"{len(found.gpus)} GPU(s) found"
    )
    from llamanix.cli.core import validate_loaded

    try:
        validate_loaded(load_config(out), {}, remote=False)
    except UserError as err:
        for problem in err.problems:
            click.echo(str(problem), err=True)
        click.echo(
            f"init: {out} does not validate yet ({len(err.problems)} problem(s) above); fix "
            f"them, then: {init_config.llamanix_command()} validate {out}",
            err=True,
        )
        exit_with(1)
    click.echo(f"init: {out}: ok (validate)")
    click.echo(f"next: {_next_command(found.kind, found.kind_why, str(out))}")


def _next_command(kind: str, why: str, out: str) -> str:
    llamanix = init_config.llamanix_command()
    if kind == "nixos":
        return (
            f"{llamanix} plan {out}, then services.llamanix = llamanix.lib.fromToml "
            f"./{Path(out).name} HOST in your system flake (docs/nixos.md)"
        )
    if "without systemd" in why:
        return f"{llamanix} up {out}"
    return f"sudo {llamanix} switch {out} --dry-run (then without --dry-run)"


def register(group: click.Group) -> None:
    group.add_command(init_cmd)
