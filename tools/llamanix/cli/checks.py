"""llamanix CLI: ``check``, checks that need no config: ``check smoke`` (does a built binary
serve, on the GPU) and ``check lossless`` (diagnose.py: does speculation answer as the baseline
does)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from llamanix.cli.console import console as make_console
from llamanix.cli.diagnose import lossless_cmd
from llamanix.cli.options import DIRECTORY, FILE, OneOf, exit_with, json_flag, output_option
from llamanix.core.variants import variant_names
from llamanix.diagnose import smoke as smoke_module
from llamanix.diagnose.smoke import SmokeReport, SmokeSettings
from llamanix.external.files import atomic_write
from llamanix.testbed.demo import DEMO_MODEL
from llamanix.testbed.synth import synth_model

_STYLE = {"pass": "green", "fail": "bold red", "skip": "dim"}


def smoke_table(report: SmokeReport) -> Table:
    build = "CUDA build" if report.cuda else "CPU build (no CUDA backend)"
    model = "synthetic model" if report.synthetic_model else report.model
    table = Table(
        title=f"llamanix check smoke: {report.binary}",
        caption=f"{build}; variant {report.variant}; {model}; --spec {report.spec}",
    )
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    for check in report.checks:
        table.add_row(check.name, f"[{_STYLE[check.status]}]{check.status}[/]", check.detail)
    return table


def summary_line(report: SmokeReport) -> str:
    counts = {s: sum(c.status == s for c in report.checks) for s in ("pass", "fail", "skip")}
    tally = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
    return f"smoke {'passed' if report.ok else 'FAILED'}: {tally}"


@click.command()
@click.option(
    "--binary",
    required=True,
    type=FILE,
    help="The llama-server to check.",
)
@click.option(
    "--model",
    type=FILE,
    help="GGUF to serve (default: a small synthetic model, written to a temp dir).",
)
@click.option(
    "--spec",
    type=OneOf(smoke_module.SPECS),
    default="none",
    show_default=True,
    help="Speculative decoding to check: draft (the model drafts for itself, or "
    "--draft-model) or mtp (needs --model with MTP heads).",
)
@click.option(
    "--draft-model",
    type=FILE,
    help="Draft GGUF for --spec draft (default: the model itself).",
)
@click.option(
    "--variant",
    type=OneOf(variant_names()),
    help="The variant the binary is a build of (default: the one its --help speaks); a "
    "binary of another project is refused.",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=2),
    default=smoke_module.DEFAULT_TOKENS,
    show_default=True,
    help="Tokens generated per request.",
)
@click.option(
    "--keep",
    type=DIRECTORY,
    help="Keep the synthetic model and the server log in this directory.",
)
@json_flag
@output_option("the report")
def smoke(
    binary: Path,
    model: Path | None,
    spec: str,
    draft_model: Path | None,
    variant: str | None,
    tokens: int,
    keep: Path | None,
    as_json: bool,
    json_out: Path | None,
) -> None:
    """Start a llama-server with all layers offloaded and check that it really serves.

    Checks /health, two identical streamed chat completions, /metrics, decode tok/s and, with
    --spec, that drafting happened. For a CUDA build also: the GPU in the log, every layer
    offloaded, SASS for the card's compute capability (cuobjdump --list-elf), and the first
    request against the second (a PTX JIT tell). Exit code 1 when any check failed.
    """
    settings = SmokeSettings(
        binary=binary,
        model=model,
        spec=spec,
        variant=variant,
        draft_model=draft_model,
        tokens=tokens,
        keep=keep,
        make_model=lambda path: synth_model(DEMO_MODEL, path),
    )
    console = Console(stderr=True)
    with console.status("llamanix check smoke") as status:
        report = smoke_module.run_smoke(settings, lambda msg: status.update(f"smoke: {msg}"))
    text = json.dumps(report.to_json(), indent=2) + "\n"
    if json_out is not None:
        atomic_write(json_out, text)
    if as_json:
        sys.stdout.write(text)
    else:
        out = make_console()
        out.print(smoke_table(report))
        for key, value in report.figures.items():
            if value is not None:
                out.print(
                    f"  {key} = {value:.3f}" if isinstance(value, float) else f"  {key} = {value}"
                )
    for check in report.failures:
        click.echo(f"smoke: {check.name}: {check.detail}", err=True)
    start = report.check("start")
    if start is not None and start.status == "fail" and report.log_tail:
        click.echo("llama-server log (last lines):\n  " + "\n  ".join(report.log_tail), err=True)
    click.echo(summary_line(report), err=True)
    if not report.ok:
        exit_with(1)


@click.group("check")
def check_group() -> None:
    """Does a build serve on the GPU (smoke)? Does speculation answer alike (lossless)?"""


check_group.add_command(smoke)
check_group.add_command(lossless_cmd)


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(check_group)
