"""llamanix CLI: ``bench`` (a running server), ``bench compare`` (saved results) and ``bench
synthetic`` (what acceptance would speculation need on this instance).

Bare ``bench`` measures, as ``bench run`` does: the group takes run's options and runs it when no
subcommand follows. ``bench --synthetic-acceptance RATES`` was the sweep's spelling until
``bench synthetic RATES``; it still works for a release and says so on stderr.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import click
from rich.markup import escape

from llamanix.bench import bench as benchmod
from llamanix.bench import bench_results
from llamanix.bench import report as bench_report
from llamanix.bench.prompts import load_prompts
from llamanix.cli.console import console as make_console
from llamanix.cli.console import echo_json, progress_bar, size
from llamanix.cli.options import (
    FILE,
    api_key_file_option,
    config_option,
    deprecated,
    deprecation_note,
    hidden_alias,
    instance_option,
    json_flag,
    output_option,
    runs_option,
    url_option,
)
from llamanix.core.address import is_loopback
from llamanix.core.api_key import read_api_key
from llamanix.core.errors import Problem, UserError
from llamanix.core.gpus import Gpu
from llamanix.diagnose import doctor
from llamanix.external.files import atomic_write
from llamanix.model.ceiling import ceiling_for, find_gpu
from llamanix.model.gguf_info import read_gguf
from llamanix.server.client import check_url

F = TypeVar("F", bound=Callable[..., Any])

_SYNTHETIC = "--synthetic-acceptance"
SYNTHETIC_SPELLING = "llamanix bench synthetic RATES --config CONFIG --instance NAME"


def _bench_ceiling(
    result: bench_results.BenchResult, url: str, gpu_name: str | None, gguf: Path | None
) -> bench_results.BenchResult:
    """The result with the roofline attached when the model file and the GPU are known."""
    gpu: Gpu | None = find_gpu(gpu_name, "llamanix bench") if gpu_name else None
    if gpu is None and is_loopback(urlparse(url).hostname or ""):
        smi = doctor.query_gpus()
        if smi:
            try:
                gpu = find_gpu(smi[0].name, "nvidia-smi", "name")
            except UserError:
                gpu = None
    model_path = gguf
    if model_path is None:
        served = result.meta.server.model_path
        if served is not None and Path(served).is_file():
            model_path = Path(served)
    if gpu is None or model_path is None:
        return result
    info = read_gguf(model_path)
    bytes_per_token = info.weight_bytes_per_token()
    ceiling = ceiling_for(gpu.bandwidth_gb_s, bytes_per_token, gpu=gpu.name, model=str(model_path))
    return benchmod.attach_ceiling(result, ceiling)


@dataclass(frozen=True)
class BenchOptions:
    """What `llamanix bench` was asked, option by option."""

    url: str | None
    model: str | None
    prompts: str
    max_tokens: str
    runs: int
    warmup: int
    concurrency: int
    temperature: float
    seed: int
    label: str | None
    as_json: bool
    json_out: Path | None
    csv_out: Path | None
    plot_out: Path | None
    ignore_eos: bool
    cache_prompt: bool
    api_key_file: Path | None
    gpu: str | None
    gguf: Path | None
    config: Path | None = None
    instance: str | None = None
    synthetic_acceptance: str | None = None


def _run_bench(opts: BenchOptions) -> None:
    if opts.synthetic_acceptance is not None or opts.config or opts.instance:
        _run_old_synthetic(opts)
        return
    if opts.url is None:
        raise UserError(
            Problem(
                "llamanix bench",
                "--url",
                "missing",
                "pass --url http://HOST:PORT of a running llama-server",
            )
        )
    check_url(opts.url, "llamanix bench", "--url")
    _check_counts(opts, "llamanix bench")
    if opts.gpu:
        find_gpu(opts.gpu, "llamanix bench")
    settings = _bench_settings(opts, opts.url)
    prompt_list = load_prompts(opts.prompts)
    api_key = read_api_key(opts.api_key_file) if opts.api_key_file else None
    console = make_console()
    with progress_bar(console, "bench", benchmod.planned_steps(settings, prompt_list)) as step:
        result = benchmod.run_bench(settings, prompt_list, api_key=api_key, progress=step)
    result = _bench_ceiling(result, opts.url, opts.gpu, opts.gguf)
    if opts.as_json:
        echo_json(result.to_json())
    else:
        console.print(bench_report.summary_table(result))
        agent = bench_report.agent_table(result)
        if agent is not None:
            console.print(agent)
    if result.ceiling and not opts.as_json:
        console.print(
            f"ceiling: {result.ceiling.tok_s:.1f} tok/s "
            f"({result.ceiling.gpu}, {size(result.ceiling.bytes_per_token)} "
            "read per token)"
        )
    if opts.json_out is not None:
        atomic_write(opts.json_out, json.dumps(result.to_json(), indent=2) + "\n")
    if opts.csv_out is not None:
        bench_report.write_csv(result, opts.csv_out)
    if opts.plot_out is not None:
        bench_report.plot_decode([result], opts.plot_out)


def _check_counts(opts: BenchOptions, source: str) -> None:
    for name, value, least in (
        ("--runs", opts.runs, 1),
        ("--warmup", opts.warmup, 0),
        ("--concurrency", opts.concurrency, 1),
    ):
        if value < least:
            raise UserError(
                Problem(
                    source,
                    name,
                    f"must be at least {least}",
                    f"pass {name} {least} or more",
                )
            )


def _bench_settings(opts: BenchOptions, url: str) -> bench_results.BenchSettings:
    return bench_results.BenchSettings(
        url=url,
        model=opts.model,
        max_tokens=tuple(benchmod.parse_lengths(opts.max_tokens)),
        runs=opts.runs,
        warmup=opts.warmup,
        concurrency=opts.concurrency,
        temperature=opts.temperature,
        seed=opts.seed,
        ignore_eos=opts.ignore_eos,
        cache_prompt=opts.cache_prompt,
        label=opts.label,
    )


# --- bench synthetic ----------------------------------------------------------------------------


def _run_old_synthetic(opts: BenchOptions) -> None:
    """`bench [run] --synthetic-acceptance RATES --config CONFIG --instance NAME`: the one line
    naming `bench synthetic`, the refusals of the options only a measurement takes, then the
    sweep `bench synthetic` runs."""
    if opts.synthetic_acceptance is not None:
        deprecation_note(_SYNTHETIC, SYNTHETIC_SPELLING)
    else:
        name = "--config" if opts.config is not None else "--instance"
        raise UserError(
            Problem(
                "llamanix bench",
                name,
                f"only taken with {_SYNTHETIC}",
                f"use {SYNTHETIC_SPELLING}, or leave {name} out and pass --url of a running server",
            )
        )
    given = (
        ("--url", opts.url),
        ("--api-key-file", opts.api_key_file),
        ("--csv", opts.csv_out),
        ("--plot", opts.plot_out),
        ("--gpu", opts.gpu),
        ("--gguf", opts.gguf),
    )
    for name, value in given:
        if value is not None:
            raise UserError(
                Problem(
                    "llamanix bench",
                    name,
                    f"not taken with {_SYNTHETIC}",
                    f"leave {name} out: bench starts the instance's own servers",
                )
            )
    _run_synthetic(opts, opts.synthetic_acceptance)


def _synthetic_needs(opts: BenchOptions, rates: str | None) -> tuple[Path, str, str]:
    """(config, instance, rates) once all three are given; UserError (one line) else."""
    source = "llamanix bench synthetic"
    if rates is None:
        raise UserError(
            Problem(
                source,
                "RATES",
                "missing",
                "give acceptance rates in [0, 1], comma-separated, e.g. 0.3,0.6,0.9",
            )
        )
    if opts.config is None or opts.instance is None:
        name = "--config" if opts.config is None else "--instance"
        raise UserError(
            Problem(
                source,
                name,
                "missing",
                "pass --config CONFIG --instance NAME: bench starts that instance's server",
            )
        )
    return opts.config, opts.instance, rates


def _run_synthetic(opts: BenchOptions, rates_text: str | None) -> None:
    """The sweep: the instance's server per acceptance rate, and one without speculation."""
    import tempfile

    from llamanix.bench import synthetic_acceptance as synth
    from llamanix.config.model import load_config

    config_path, instance, rates_text = _synthetic_needs(opts, rates_text)
    rates = synth.parse_rates(rates_text)
    _check_counts(opts, "llamanix bench synthetic")
    settings = _bench_settings(opts, "http://127.0.0.1")  # each server's own URL replaces it
    prompt_list = load_prompts(opts.prompts)
    plan = synth.plan_sweep(load_config(config_path), instance)
    console = make_console()
    steps = (1 + len(rates)) * benchmod.planned_steps(settings, prompt_list)

    def say(line: str) -> None:
        click.echo(f"llamanix bench synthetic: {line}", err=True)

    with (
        tempfile.TemporaryDirectory(prefix="llamanix-synthetic.") as logs,
        progress_bar(console, "synthetic acceptance", steps) as step,
    ):
        request = synth.SweepRequest(
            plan=plan,
            rates=rates,
            settings=settings,
            prompts=tuple(prompt_list),
            log_dir=Path(logs),
        )
        result = synth.run_sweep(request, progress=step, say=say)
    if opts.as_json:
        echo_json(result.to_json())
    else:
        console.print(synth.sweep_table(result))
        for note in result.notes:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    if opts.json_out is not None:
        atomic_write(opts.json_out, json.dumps(result.to_json(with_runs=True), indent=2) + "\n")


# --- options ------------------------------------------------------------------------------------


def _workload_options() -> list[Callable[[F], F]]:
    """What each measurement sends and how often: bench, bench run and bench synthetic."""
    return [
        click.option("--alias", help="Model name sent with each request (the server's --alias)."),
        hidden_alias("--model", "model"),
        click.option(
            "--prompts",
            default="builtin",
            show_default=True,
            help="'builtin', 'builtin:NAME,NAME', 'realtext[:edit|prose]' (raw text for base "
            "models without a chat template, sent to /completion), 'agent:N' (an agent-shaped "
            "prompt: N shared prefix tokens, a new last turn per request, cold then warm) or a "
            "JSON file of prompts.",
        ),
        click.option(
            "--max-tokens",
            default=",".join(map(str, bench_results.DEFAULT_MAX_TOKENS)),
            show_default=True,
            help="Output lengths to measure, comma-separated.",
        ),
        runs_option(bench_results.DEFAULT_RUNS, "Measured runs per prompt x length."),
        click.option(
            "--warmup",
            type=int,
            default=bench_results.DEFAULT_WARMUP,
            show_default=True,
            help="Unmeasured warm-up requests per prompt.",
        ),
        click.option(
            "--concurrency",
            type=int,
            default=1,
            show_default=True,
            help="Requests sent at once in each run.",
        ),
        click.option("--temperature", type=float, default=0.0, show_default=True),
        click.option("--seed", type=int, default=bench_results.DEFAULT_SEED, show_default=True),
        click.option("--label", help="Name of this configuration in tables and plots."),
        json_flag,
    ]


def _flags() -> list[Callable[[F], F]]:
    return [
        click.option(
            "--ignore-eos/--no-ignore-eos",
            default=True,
            show_default=True,
            help="Generate exactly --max-tokens tokens.",
        ),
        click.option(
            "--cache-prompt/--no-cache-prompt",
            default=False,
            show_default=True,
            help="Let the server reuse cached prompt tokens (off: prefill is measured cold).",
        ),
    ]


def _sweep_options(hidden: bool) -> list[Callable[[F], F]]:
    """--config and --instance: shown on `bench synthetic`; hidden on bench and bench run, with
    --synthetic-acceptance, the old spelling of the sweep."""
    old = click.option(_SYNTHETIC, "synthetic_acceptance", metavar="RATES", hidden=True)
    return [
        *([old] if hidden else []),
        config_option("llamanix.toml holding --instance.", hidden=hidden),
        instance_option("Instance whose servers the sweep starts.", hidden=hidden),
    ]


def _apply(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def _bench_options() -> Callable[[F], F]:
    """The options of `bench run`, which bare `bench` takes too (--url is checked by hand: a
    group cannot require an option its subcommands do not take)."""
    return _apply(
        [
            url_option(),
            *_workload_options(),
            output_option("every run and the summaries"),
            click.option(
                "--csv",
                "csv_out",
                type=FILE,
                help="Write one row per request to this CSV file.",
            ),
            click.option(
                "--plot",
                "plot_out",
                type=FILE,
                help="Plot decode tok/s against output length to this PNG (needs matplotlib).",
            ),
            *_flags(),
            api_key_file_option,
            click.option("--gpu", help="GPU (table name) for the ceiling column."),
            click.option(
                "--gguf",
                type=FILE,
                help="The served model file, for the ceiling column (default: /props model_path "
                "when readable here).",
            ),
            *_sweep_options(hidden=True),
        ]
    )


def _bench_opts(options: dict[str, Any]) -> BenchOptions:
    alias, model = options.pop("alias"), options.pop("model")
    return BenchOptions(model=deprecated(alias, model, "--model", "--alias"), **options)


# --- the commands -------------------------------------------------------------------------------


@click.group("bench", invoke_without_command=True)
@_bench_options()
@click.pass_context
def bench_group(ctx: click.Context, /, **options: Any) -> None:
    """Benchmark a running llama-server: TTFT, prefill and decode, server and client clocks.

    `llamanix bench run --url URL` measures (bare `llamanix bench --url URL` does the same);
    `llamanix bench compare A.json B.json` compares saved results; `llamanix bench synthetic
    RATES --config CONFIG --instance NAME` sweeps the acceptance speculation would need.
    """
    if ctx.invoked_subcommand is not None:
        return
    _run_bench(_bench_opts(options))


@bench_group.command("run")
@_bench_options()
def bench_run(**options: Any) -> None:
    """Measure a running llama-server (what bare `llamanix bench --url URL` also does)."""
    _run_bench(_bench_opts(options))


@bench_group.command("synthetic")
@click.argument("rates", metavar="RATES", required=False)
@_apply(
    [
        *_workload_options(),
        output_option("the sweep with every run"),
        *_flags(),
        *_sweep_options(hidden=False),
    ]
)
def bench_synthetic(rates: str | None, **options: Any) -> None:
    """Benchmark only: what acceptance would speculation need on this instance?

    Starts --instance's own server once per per-drafted-token acceptance rate in RATES (e.g.
    0.3,0.6,0.9) with upstream's --spec-synth-len, and once without speculation; prints decode
    tok/s and the speed-up per rate. The servers' output text is not valid.
    """
    # What only a measurement of a running server takes: the sweep starts its own.
    absent = ("url", "csv_out", "plot_out", "api_key_file", "gpu", "gguf")
    _run_synthetic(_bench_opts({**options, **dict.fromkeys(absent)}), rates)


@bench_group.command("compare")
@click.argument("files", nargs=-1, type=FILE)
@json_flag
@click.option(
    "--plot",
    "plot_out",
    type=FILE,
    help="Plot decode tok/s and wall clock against output length, one line per result, the "
    "crossover marked (needs matplotlib).",
)
@click.option("--prompt", help="Plot only this prompt (default: mean over prompts).")
def bench_compare(
    files: tuple[Path, ...], as_json: bool, plot_out: Path | None, prompt: str | None
) -> None:
    """Medians of saved bench results side by side, with ratios against the first, and the
    output length from which each later result wins on wall clock (the crossover; needs
    results swept over two or more --max-tokens).
    """
    results = [bench_results.load_result(f) for f in files]
    rows = bench_report.compare(results)
    if prompt is not None and not any(s.prompt == prompt for r in results for s in r.summaries):
        raise UserError(
            Problem(
                "llamanix bench compare",
                "--prompt",
                f"no result has prompt {prompt!r}",
                "name a prompt of the results, or leave --prompt out",
            )
        )
    if plot_out is not None:
        bench_report.pyplot()  # no matplotlib: one line before anything is printed
    crossovers = bench_report.compare_crossovers(results)
    if as_json:
        echo_json(bench_report.compare_json(results, rows, crossovers))
    else:
        console = make_console()
        console.print(bench_report.compare_table(results, rows))
        for c in crossovers:
            console.print("crossover: " + escape(c.sentence()), highlight=False, soft_wrap=True)
        if not crossovers:
            console.print(
                "crossover: needs both results swept over two or more --max-tokens",
                highlight=False,
            )
    if plot_out is not None:
        bench_report.plot_compare(results, plot_out, prompt)


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(bench_group)
