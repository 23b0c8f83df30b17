"""llamanix CLI: checks of running servers and configs: lossless (do two servers answer alike)
and doctor (what silently costs speed or memory). Each exits 1 when it finds a problem."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape

from llamanix.bench import bench_results
from llamanix.bench.prompts import load_prompts
from llamanix.cli.console import console as make_console
from llamanix.cli.console import echo_json, progress_bar
from llamanix.cli.options import (
    FILE,
    api_key_file_option,
    config_argument,
    exit_with,
    instance_argument,
    json_flag,
    output_option,
    runs_option,
    url_option,
)
from llamanix.core.api_key import read_api_key
from llamanix.core.errors import Problem, UserError
from llamanix.diagnose import lossless as losslessmod
from llamanix.diagnose.doctor import Report
from llamanix.diagnose.doctor_inputs import DoctorRequest, run_doctor
from llamanix.external.files import atomic_write
from llamanix.server.client import check_url


@click.command("lossless")
@click.argument("url_a", metavar="URL_A")
@click.argument("url_b", metavar="URL_B")
@click.option(
    "--prompts",
    default="builtin",
    show_default=True,
    help="'builtin', 'builtin:NAME,NAME', 'realtext[:edit|prose]' (raw text for base models, "
    "sent to /completion) or a JSON file of prompts (as for bench; "
    '"must_match": true marks a prompt whose outputs must be identical).',
)
@runs_option(
    losslessmod.DEFAULT_RUNS,
    "Requests per prompt and server; the edit distance is the median over them.",
)
@click.option(
    "--max-tokens",
    type=int,
    default=losslessmod.DEFAULT_MAX_TOKENS,
    show_default=True,
    help="Output length asked for (a prompt's own max_tokens wins).",
)
@click.option("--seed", type=int, default=bench_results.DEFAULT_SEED, show_default=True)
@click.option(
    "--concurrency",
    type=int,
    default=1,
    show_default=True,
    help="Prompts in flight at once per server (a server with that many --parallel slots "
    "decodes them in one batch, whose numerics differ from one sequence's).",
)
@click.option("--strict", is_flag=True, help="Every prompt must match, not only must_match ones.")
@api_key_file_option
@json_flag
@output_option("every answer and the comparison")
@click.pass_context
def lossless_cmd(
    ctx: click.Context,
    url_a: str,
    url_b: str,
    prompts: str,
    runs: int,
    max_tokens: int,
    seed: int,
    concurrency: int,
    strict: bool,
    api_key_file: Path | None,
    as_json: bool,
    json_out: Path | None,
) -> None:
    """Do two servers answer alike at temperature 0? Speculation (B) against a baseline (A).

    Per prompt: identical or not, the character edit distance (median over --runs), where the
    texts first differ, and whether tool calls keep their structure. Exit 1 when a prompt
    marked must_match (or any, with --strict) differs.
    """
    check_url(url_a, "llamanix check lossless", "URL_A")
    check_url(url_b, "llamanix check lossless", "URL_B")
    for name, value in (
        ("--runs", runs),
        ("--max-tokens", max_tokens),
        ("--concurrency", concurrency),
    ):
        if value < 1:
            raise UserError(
                Problem(
                    "llamanix check lossless", name, "must be at least 1", f"pass {name} 1 or more"
                )
            )
    settings = losslessmod.LosslessSettings(
        url_a=url_a,
        url_b=url_b,
        max_tokens=max_tokens,
        runs=runs,
        seed=seed,
        strict=strict,
        concurrency=concurrency,
    )
    prompt_list = load_prompts(prompts)
    api_key = read_api_key(api_key_file) if api_key_file else None
    console = make_console()
    with progress_bar(
        console, "lossless", losslessmod.planned_steps(settings, prompt_list)
    ) as step:
        result = losslessmod.run_lossless(settings, prompt_list, api_key=api_key, progress=step)
    data = result.to_json()
    if as_json:
        echo_json(data)
    else:
        console.print(losslessmod.summary_table(result))
        if result.failed:
            console.print(
                f"[bold red]must match but differ:[/] {escape(', '.join(result.failed))}",
                highlight=False,
            )
    if json_out is not None:
        atomic_write(json_out, json.dumps(data, indent=2) + "\n")
    if result.failed:
        exit_with(1)


# --- doctor ---------------------------------------------------------------------------------

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@click.command("doctor")
@config_argument()
@instance_argument(required=False)
@click.option(
    "--log",
    "log_file",
    type=FILE,
    help="A saved llama-server log of the instance.",
)
@click.option("--journal", is_flag=True, help="Read the instance's log from journalctl.")
@url_option(help="Also probe the running instance at this base URL with one completion.")
@click.option("--gpu", help="GPU from the table (overrides hosts.NAME.gpu and nvidia-smi).")
@click.option(
    "--bench",
    "bench_files",
    multiple=True,
    type=FILE,
    help="bench --json results (speculative and baseline) to check speculation pays.",
)
@click.option(
    "--avg-output-tokens",
    type=float,
    help="Output tokens your requests average, for the --bench crossover check "
    "(default: what the bench results generated).",
)
@click.option(
    "--prompts",
    help="With --url: run these prompts once each (as for bench: 'realtext', a JSON file...) "
    "and give the acceptance per workload from /metrics.",
)
@click.option(
    "--baseline-url",
    help="With --prompts: the same model without speculation; each workload then gets the "
    "speed-up with its 95% interval and a verdict (pays, costs, unclear).",
)
@json_flag
@click.pass_context
def doctor_cmd(
    ctx: click.Context,
    config: Path,
    instance: str | None,
    log_file: Path | None,
    journal: bool,
    url: str | None,
    gpu: str | None,
    bench_files: tuple[Path, ...],
    avg_output_tokens: float | None,
    prompts: str | None,
    baseline_url: str | None,
    as_json: bool,
) -> None:
    """Find what silently costs speed or memory; exit 1 on any error finding."""
    report = run_doctor(
        DoctorRequest(
            config_path=config,
            instance=instance,
            log_file=log_file,
            journal=journal,
            url=url,
            gpu=gpu,
            bench_files=bench_files,
            avg_output_tokens=avg_output_tokens,
            prompts=prompts,
            baseline_url=baseline_url,
        )
    )
    from llamanix.config.model import load_config
    from llamanix.hosts.leftovers_report import report_leftovers

    # What a switch of a host of this config that did not finish left on this machine.
    report_leftovers(report, load_config(config), config)
    if as_json:
        echo_json(report.to_json())
    else:
        console = make_console()
        if not report.findings:
            console.print(no_findings_line(report), highlight=False, soft_wrap=True)
        for f in report.findings:
            where = f"{f.instance}: " if f.instance else ""
            console.print(
                f"[{_STYLE[f.severity]}]{f.severity}[/] {escape(where + f.message)}",
                highlight=False,
                soft_wrap=True,
            )
            console.print(f"  fix: {escape(f.fix)}", highlight=False, soft_wrap=True)
        for check, result in report.checks.items():
            if result.outcome == "skipped":
                console.print(f"[dim]{check}: {escape(result.text())}[/]", highlight=False)
    if report.has_errors:
        exit_with(1)


def no_findings_line(report: Report) -> str:
    """What a report without findings says: how many checks found nothing, and, first of all,
    how many were skipped for want of an input (each listed below with the option it needs)."""
    instances = f"{len(report.instances)} instance(s)"
    skipped = report.count("skipped")
    passed = report.count("ok")
    if not skipped:
        return f"no problems found ({instances}, {passed} checks passed)"
    total = len(report.checks)
    return (
        f"no problems found by the {passed} of {total} checks that ran ({instances}); "
        f"{skipped} skipped, each below with what it needs"
    )


def register(group: click.Group) -> None:
    """Add this module's command to the main group (lossless is under `check`, checks.py)."""
    group.add_command(doctor_cmd)
