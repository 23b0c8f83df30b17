"""llamanix CLI commands: bench (and bench compare), lossless, inspect, ceiling, doctor."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llamanix.cli.completion import complete_instances
from llamanix.cli.options import (
    api_key_file_option,
    deprecated,
    exit_with,
    hidden_alias,
    json_flag,
    output_option,
    runs_option,
    url_option,
)
from llamanix.core.address import is_loopback
from llamanix.core.api_key import read_api_key
from llamanix.core.errors import Problem, UserError
from llamanix.core.gpus import Gpu, load_gpus
from llamanix.external.files import atomic_write
from llamanix.measure import bench as benchmod
from llamanix.measure import bench_results, doctor
from llamanix.measure import lossless as losslessmod
from llamanix.measure import report as bench_report
from llamanix.measure.ceiling import (
    ceiling_for,
    decode_ceiling_tok_s,
    find_gpu,
    parse_bytes,
)
from llamanix.measure.client import check_url
from llamanix.measure.doctor_inputs import DoctorRequest, run_doctor
from llamanix.measure.gguf_info import CACHE_TYPES, GgufInfo, read_gguf
from llamanix.measure.prompts import load_prompts

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def _progress_bar(
    console: Console, label: str, total: int
) -> Iterator[benchmod.ProgressHook | None]:
    """A bar on a terminal; None when stdout is a pipe or a file, so logs get no escape codes."""
    if not sys.stdout.isatty():
        yield None
        return
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)

        def step(what: str) -> None:
            bar.update(task, advance=1, description=what)

        yield step


def _console() -> Console:
    # Piped output is read in logs and CI, where 80 columns would wrap every table.
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _size(n: float) -> str:
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    for unit, factor in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= factor:
            return f"{n / factor:.2f}{unit}"
    return f"{n:.0f}"


# --- bench ----------------------------------------------------------------------------------


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


def _run_bench(ctx: click.Context, opts: BenchOptions) -> None:
    if opts.synthetic_acceptance is not None or opts.config or opts.instance:
        _run_synthetic(opts)
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
    _check_counts(opts)
    if opts.gpu:
        find_gpu(opts.gpu, "llamanix bench")
    settings = _bench_settings(opts, opts.url)
    prompt_list = load_prompts(opts.prompts)
    api_key = read_api_key(opts.api_key_file) if opts.api_key_file else None
    console = _console()
    with _progress_bar(console, "bench", benchmod.planned_steps(settings, prompt_list)) as step:
        result = benchmod.run_bench(settings, prompt_list, api_key=api_key, progress=step)
    result = _bench_ceiling(result, opts.url, opts.gpu, opts.gguf)
    if opts.as_json:
        _echo_json(result.to_json())
    else:
        console.print(bench_report.summary_table(result))
        agent = bench_report.agent_table(result)
        if agent is not None:
            console.print(agent)
    if result.ceiling and not opts.as_json:
        console.print(
            f"ceiling: {result.ceiling.tok_s:.1f} tok/s "
            f"({result.ceiling.gpu}, {_size(result.ceiling.bytes_per_token)} "
            "read per token)"
        )
    if opts.json_out is not None:
        atomic_write(opts.json_out, json.dumps(result.to_json(), indent=2) + "\n")
    if opts.csv_out is not None:
        bench_report.write_csv(result, opts.csv_out)
    if opts.plot_out is not None:
        bench_report.plot_decode([result], opts.plot_out)


def _check_counts(opts: BenchOptions) -> None:
    for name, value, least in (
        ("--runs", opts.runs, 1),
        ("--warmup", opts.warmup, 0),
        ("--concurrency", opts.concurrency, 1),
    ):
        if value < least:
            raise UserError(
                Problem(
                    "llamanix bench",
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


_SYNTHETIC = "--synthetic-acceptance"


def _synthetic_refusals(opts: BenchOptions) -> tuple[Path, str, str]:
    """(config, instance, rates) once the options make a sweep; UserError (one line) else."""
    if opts.synthetic_acceptance is None:
        name = "--config" if opts.config is not None else "--instance"
        raise UserError(
            Problem(
                "llamanix bench",
                name,
                f"only taken with {_SYNTHETIC}",
                f"add {_SYNTHETIC} RATES, or leave {name} out and pass --url of a running server",
            )
        )
    if opts.config is None or opts.instance is None:
        raise UserError(
            Problem(
                "llamanix bench",
                _SYNTHETIC,
                "needs --config and --instance",
                "pass --config CONFIG --instance NAME: bench starts that instance's server",
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
    return opts.config, opts.instance, opts.synthetic_acceptance


def _run_synthetic(opts: BenchOptions) -> None:
    """`bench --synthetic-acceptance RATES --config CONFIG --instance NAME`."""
    import tempfile

    from llamanix.core.config import load_config
    from llamanix.measure import synthetic_acceptance as synth

    config_path, instance, rates_text = _synthetic_refusals(opts)
    rates = synth.parse_rates(rates_text)
    _check_counts(opts)
    settings = _bench_settings(opts, "http://127.0.0.1")  # each server's own URL replaces it
    prompt_list = load_prompts(opts.prompts)
    plan = synth.plan_sweep(load_config(config_path), instance)
    console = _console()
    steps = (1 + len(rates)) * benchmod.planned_steps(settings, prompt_list)

    def say(line: str) -> None:
        click.echo(f"llamanix bench: {line}", err=True)

    with (
        tempfile.TemporaryDirectory(prefix="llamanix-synthetic.") as logs,
        _progress_bar(console, "synthetic acceptance", steps) as step,
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
        _echo_json(result.to_json())
    else:
        console.print(synth.sweep_table(result))
        for note in result.notes:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    if opts.json_out is not None:
        atomic_write(opts.json_out, json.dumps(result.to_json(with_runs=True), indent=2) + "\n")


def _bench_options() -> Callable[[F], F]:
    """The options of `bench run`, which bare `bench` takes too (--url is checked by hand: a
    group cannot require an option its subcommands do not take, and --synthetic-acceptance
    starts its own servers instead)."""
    options = [
        url_option(),
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
        output_option("every run and the summaries"),
        click.option(
            "--csv",
            "csv_out",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Write one row per request to this CSV file.",
        ),
        click.option(
            "--plot",
            "plot_out",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Plot decode tok/s against output length to this PNG (needs matplotlib).",
        ),
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
        api_key_file_option,
        click.option("--gpu", help="GPU (table name) for the ceiling column."),
        click.option(
            "--gguf",
            type=click.Path(path_type=Path, dir_okay=False),
            help="The served model file, for the ceiling column (default: /props model_path "
            "when readable here).",
        ),
        click.option(
            "--synthetic-acceptance",
            metavar="RATES",
            help="Benchmark only: start --instance's own server per per-drafted-token acceptance "
            "rate (e.g. 0.3,0.6,0.9) with upstream's --spec-synth-len, and a baseline without "
            "speculation; prints decode tok/s and speedup per rate. Output text is not valid.",
        ),
        click.option(
            "--config",
            type=click.Path(path_type=Path, dir_okay=False),
            help="llamanix.toml holding --instance (with --synthetic-acceptance).",
        ),
        click.option(
            "--instance",
            shell_complete=complete_instances,
            help="Instance whose server --synthetic-acceptance starts.",
        ),
    ]

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def _bench_opts(options: dict[str, Any]) -> BenchOptions:
    alias, model = options.pop("alias"), options.pop("model")
    return BenchOptions(model=deprecated(alias, model, "--model", "--alias"), **options)


@click.group("bench", invoke_without_command=True)
@_bench_options()
@click.pass_context
def bench_group(ctx: click.Context, /, **options: Any) -> None:
    """Benchmark a running llama-server: TTFT, prefill and decode, server and client clocks.

    `llamanix bench run --url URL` measures (bare `llamanix bench --url URL` does the same);
    `llamanix bench compare A.json B.json` compares saved results.
    """
    if ctx.invoked_subcommand is not None:
        return
    _run_bench(ctx, _bench_opts(options))


@bench_group.command("run")
@_bench_options()
@click.pass_context
def bench_run(ctx: click.Context, /, **options: Any) -> None:
    """Measure a running llama-server (what bare `llamanix bench --url URL` also does)."""
    _run_bench(ctx, _bench_opts(options))


@bench_group.command("compare")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@json_flag
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(path_type=Path, dir_okay=False),
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
        _echo_json(bench_report.compare_json(results, rows, crossovers))
    else:
        console = _console()
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


# --- lossless -------------------------------------------------------------------------------


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
    check_url(url_a, "llamanix lossless", "URL_A")
    check_url(url_b, "llamanix lossless", "URL_B")
    for name, value in (
        ("--runs", runs),
        ("--max-tokens", max_tokens),
        ("--concurrency", concurrency),
    ):
        if value < 1:
            raise UserError(
                Problem("llamanix lossless", name, "must be at least 1", f"pass {name} 1 or more")
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
    console = _console()
    with _progress_bar(
        console, "lossless", losslessmod.planned_steps(settings, prompt_list)
    ) as step:
        result = losslessmod.run_lossless(settings, prompt_list, api_key=api_key, progress=step)
    data = result.to_json()
    if as_json:
        _echo_json(data)
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


# --- inspect --------------------------------------------------------------------------------


def _inspect_table(info: GgufInfo) -> Table:
    table = Table(title=info.path, title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value")
    mix = ", ".join(
        f"{k} {v.bytes / max(info.tensor_bytes, 1):.0%} ({v.count})"
        for k, v in info.tensor_types.items()
    )
    rows = [
        ("architecture", info.architecture + (f" ({info.name})" if info.name else "")),
        ("parameters", _count(info.parameter_count)),
        ("file size", f"{_size(info.file_bytes)} (tensors {_size(info.tensor_bytes)})"),
        ("tensor types", mix or "-"),
        ("vocabulary", f"{info.vocab_size} ({info.tokenizer_model or '?'})"),
        ("training context", str(info.context_length or "-")),
        (
            "layers",
            f"{info.block_count} ({info.attention_layers} attention, "
            f"{info.recurrent_layers} recurrent, {info.nextn_layers} MTP)",
        ),
        ("heads / KV heads", f"{info.head_count or '-'} / {info.head_count_kv or '-'}"),
        ("head dims (K/V)", f"{info.head_dim_k or '-'} / {info.head_dim_v or '-'}"),
    ]
    if info.expert_count:
        rows.append(("experts", f"{info.expert_used_count} of {info.expert_count} per token"))
    if info.sliding_window:
        rows.append(("sliding window", str(info.sliding_window)))
    rows.append(
        (
            "KV bytes / token",
            ", ".join(
                f"{t} {_size(info.kv_bytes_per_token(t, t))}" for t in ("f16", "q8_0", "q4_0")
            ),
        )
    )
    if info.recurrent_state_bytes:
        rows.append(("recurrent state / slot", _size(info.recurrent_state_bytes)))
    rows.append(("MTP (nextn) layers", "yes" if info.has_mtp else "no"))
    rows.append(
        (
            "hybrid / recurrent",
            "hybrid" if info.is_hybrid else ("recurrent" if info.is_recurrent else "no"),
        )
    )
    rows.append(("weights read / token", _size(info.weight_bytes_per_token())))
    for key, value in rows:
        table.add_row(key, value)
    return table


@click.command("inspect")
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False))
@json_flag
def inspect_cmd(model: Path, as_json: bool) -> None:
    """What a GGUF holds: architecture, sizes, layers, KV cost per token, MTP, hybrid."""
    info = read_gguf(model)
    if as_json:
        _echo_json(info.to_json())
        return
    console = _console()
    console.print(_inspect_table(info))
    kv = Table(title="KV cache per token (K and V of one type)", title_justify="left")
    kv.add_column("cache type")
    kv.add_column("bytes/token", justify="right")
    kv.add_column("at training context", justify="right")
    for t in CACHE_TYPES:
        per = info.kv_bytes_per_token(t, t)
        kv.add_row(t, f"{per:,.0f}", _size(per * (info.context_length or 0)))
    console.print(kv)


# --- ceiling --------------------------------------------------------------------------------


def _gpu_table() -> Table:
    table = Table(title="GPU table (llamanix/data/gpus.toml)", title_justify="left")
    for heading in ("name", "label", "bandwidth GB/s", "memory GiB", "compute capability"):
        table.add_column(heading)
    for g in load_gpus().values():
        table.add_row(
            g.name, g.label, f"{g.bandwidth_gb_s:g}", f"{g.memory_gib:g}", g.compute_capability
        )
    return table


@click.command("ceiling")
@click.option("--gpu", help="GPU from the table (see --list).")
@click.option("--bandwidth", type=float, help="Memory bandwidth in GB/s (10^9 bytes/s).")
@click.option(
    "--model",
    "model",
    type=click.Path(path_type=Path, dir_okay=False),
    help="GGUF whose weights are read per token.",
)
@click.option("--bytes", "bytes_text", help="Bytes read per token: 15300000000, 15.3e9, 15.3GB.")
@click.option(
    "--active-fraction",
    type=float,
    help="Share of the weights read per token (MoE: active/total parameters).",
)
@click.option("--list", "show_list", is_flag=True, help="Show the GPU table.")
@json_flag
def ceiling_cmd(
    gpu: str | None,
    bandwidth: float | None,
    model: Path | None,
    bytes_text: str | None,
    active_fraction: float | None,
    show_list: bool,
    as_json: bool,
) -> None:
    """The decode roofline: memory bandwidth / bytes read per token."""
    if show_list:
        if as_json:
            _echo_json({name: vars(g) for name, g in load_gpus().items()})
        else:
            _console().print(_gpu_table())
        return
    if (gpu is None) == (bandwidth is None):
        raise UserError(
            Problem(
                "llamanix ceiling",
                "--gpu/--bandwidth",
                "give exactly one",
                "pass --gpu NAME (see --list) or --bandwidth GB/s",
            )
        )
    if (model is None) == (bytes_text is None):
        raise UserError(
            Problem(
                "llamanix ceiling",
                "--model/--bytes",
                "give exactly one",
                "pass --model FILE.gguf or --bytes 15.3GB",
            )
        )
    if bandwidth is not None and bandwidth <= 0:
        raise UserError(
            Problem(
                "llamanix ceiling",
                "--bandwidth",
                "must be positive",
                "give the card's memory bandwidth in GB/s",
            )
        )
    if active_fraction is not None and not 0 < active_fraction <= 1:
        raise UserError(
            Problem(
                "llamanix ceiling",
                "--active-fraction",
                f"{active_fraction} is not in (0, 1]",
                "give active/total parameters, e.g. 0.1",
            )
        )
    table_gpu = find_gpu(gpu, "llamanix ceiling") if gpu else None
    bw = table_gpu.bandwidth_gb_s if table_gpu else float(bandwidth or 0)
    if model is not None:
        info = read_gguf(model)
        per_token = info.weight_bytes_per_token(active_fraction)
    else:
        per_token = parse_bytes(str(bytes_text)) * (active_fraction or 1.0)
    result = ceiling_for(
        bw,
        per_token,
        gpu=table_gpu.name if table_gpu else None,
        model=str(model) if model else None,
        active_fraction=active_fraction,
    )
    if as_json:
        _echo_json(result.to_json())
        return
    source = f"{table_gpu.label}, {bw:g} GB/s" if table_gpu else f"{bw:g} GB/s"
    click.echo(
        f"{source} / {per_token / 1e9:.2f} GB per token = "
        f"{decode_ceiling_tok_s(bw, per_token):.0f} tok/s decode ceiling"
    )


# --- doctor ---------------------------------------------------------------------------------

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@click.command("doctor")
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("instance", required=False, shell_complete=complete_instances)
@click.option(
    "--log",
    "log_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A saved llama-server log of the instance.",
)
@click.option("--journal", is_flag=True, help="Read the instance's log from journalctl.")
@url_option(help="Also probe the running instance at this base URL with one completion.")
@click.option("--gpu", help="GPU from the table (overrides hosts.NAME.gpu and nvidia-smi).")
@click.option(
    "--bench",
    "bench_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
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
    config_path: Path,
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
            config_path=config_path,
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
    if as_json:
        _echo_json(report.to_json())
    else:
        console = _console()
        if not report.findings:
            console.print(
                f"no problems found ({len(report.instances)} instance(s), "
                f"{report.count('ok')} checks passed)"
            )
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


def register(group: click.Group) -> None:
    """Add this module's commands to the main group."""
    group.add_command(bench_group)
    group.add_command(lossless_cmd)
    group.add_command(inspect_cmd)
    group.add_command(ceiling_cmd)
    group.add_command(doctor_cmd)
