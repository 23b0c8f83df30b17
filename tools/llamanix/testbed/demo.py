"""``llamanix testbed demo``: the whole path on this machine, no GPU, and one small real model.

Part one synthesizes a target and a draft that agree (llamanix.testbed.synth: the target is the
draft's one block plus eleven passthrough blocks that cost compute and change nothing), writes
a llamanix config with two instances of the target (one plain, one speculating with the
draft), renders that config like a deployment would, starts the real llama-server from each
rendered argv in turn, measures each with the benchmark's streaming client, and prints the
two side by side: on a CPU the draft costs a fraction of the target and nearly every drafted
token is accepted, so speculation decodes faster. It is the one place a draft model shows.

Part two is real text (llamanix.testbed.real_text): the real model of the test bed (Gemma 3
270M, Q4_K_M, fetched once from PyPI) served plain and with each self-speculating type
(ngram-mod, ngram-map-k4v and a chain of both where the build takes one), on two workloads:
edits, where most of the answer is in the prompt, and prose, where little is. Per speculation
and workload: the decode speed-up with its 95% interval, the acceptance, and whether the texts
came out as plain's did.

Then the deploy loop: ``llamanix up`` serves plain instances from one config (two of the real
model, one of the synthetic target), and ``llamanix switch --manager up --gate bench
--max-regression 10 --gate-prompts ...`` turns ngram-mod on for the real ones, gated on the
edit prompts for one and the prose prompts for the other: the gate keeps speculation where it
pays and rolls it back where it costs, whatever this machine makes of it. Last, the synthetic
target is switched to an unrelated draft drafting 16 tokens at p_min 0, which is sure to cost
(rolled back); ``--synthetic-gate`` puts the other synthetic flips through the gate before it:
no effect (kept) and the good draft (kept).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from llamanix.bench.bench import run_bench
from llamanix.bench.bench_results import BenchResult, BenchSettings
from llamanix.bench.prompts import Prompt
from llamanix.config.model import load_config
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.external.files import atomic_write, work_dir
from llamanix.external.process import run_captured
from llamanix.render.host_render import render_host
from llamanix.render.units import write_render
from llamanix.server.server_process import LlamaServer, free_port
from llamanix.testbed import real_model, real_text, server_build, up_process
from llamanix.testbed.synth import SynthSpec, synth_model

INSTANCES = ("plain", "speculative")
DEMO_PROMPT = "Write a short story about a llama who learns to read."
DEFAULT_TOKENS = 64
DEFAULT_RUNS = 5  # the guide: N >= 5 after warm-up, or the numbers are noise
# F32 and a wide FFN: on a CPU every block is a real cost. The draft is one block; the target
# is that block plus 11 passthrough blocks (12x the block compute, ~10x the file), so its
# logits are the draft's and nearly every drafted token is accepted.
DEMO_DRAFT = SynthSpec(layers=1, embd=512, ff=2048, heads=8, kv_heads=8, seed=1, type="f32")
PASSTHROUGH = 11
DEMO_TARGET = replace(DEMO_DRAFT, passthrough=PASSTHROUGH)
# Same shapes, another seed: it agrees with the target on almost nothing.
UNRELATED_DRAFT = replace(DEMO_DRAFT, seed=2)
# The small confident model `llamanix check smoke` synthesizes when given no model (it drafts for
# itself there, so only its speed matters, and small is quick).
DEMO_MODEL = SynthSpec(layers=4, embd=256, ff=512, heads=4, kv_heads=4, seed=1)
GOOD_N_MAX, GOOD_P_MIN = 8, 0.6
# p_min 0: draft 16 tokens every step whatever the draft's confidence, so the target verifies
# 17 tokens for about one it keeps.
BAD_N_MAX, BAD_P_MIN = 16, 0.0
# The gate's threshold for the demo's flips. Its interval sees the spread of runs inside one
# server process, not the offset between two processes: on the 2-core test machine a CPU server
# restarted on the same config decodes 0.94-1.08x as fast (scripts/bench-gate-trials), so the
# no-effect first flip could fail a 5% threshold by that alone. The flips it must tell apart are
# about 2.8x faster and 0.1x as fast, so 10% keeps both verdicts clear of the offset.
MAX_REGRESSION_PCT = 10.0
GateOutcome = Literal["kept", "rolled back"]
# Real text: prompts per workload (the shortest) and tokens per request in the table (every
# prompt runs once on each of four servers: with the gates this keeps the demo within three
# minutes on 2 cores).
REAL_PROMPTS_PER_WORKLOAD = 3
REAL_TOKENS = 32
# The real-text gates stop after this many candidate runs (one extra batch): their prompts
# differ run to run, so an interval may straddle the threshold for long (the default is 15).
REAL_GATE_MAX_RUNS = 8
# What each real-text gate measures: its workload's prompts, one per run, in turn.
REAL_GATES = (("edit", "realtext:edit"), ("prose", "realtext:prose"))


@dataclass(frozen=True)
class DemoModels:
    target: Path
    draft: Path
    unrelated_draft: Path
    real: Path | None = None  # the real model, when the demo runs it


def write_models(work: Path) -> DemoModels:
    models = DemoModels(
        target=work / "target.gguf",
        draft=work / "draft.gguf",
        unrelated_draft=work / "unrelated-draft.gguf",
    )
    synth_model(DEMO_TARGET, models.target)
    synth_model(DEMO_DRAFT, models.draft)
    synth_model(UNRELATED_DRAFT, models.unrelated_draft)
    return models


@dataclass(frozen=True)
class DemoRow:
    """One server's figures: medians over the runs, draft counts summed."""

    instance: str
    speculation: str
    server_decode_tok_s: float | None
    client_decode_tok_s: float | None
    ttft_ms: float | None
    wall_s: float | None
    drafted: int
    accepted: int

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class GateStep:
    """One ``llamanix switch`` of the demo's deploy loop and what the bench gate made of it.
    ``expected`` is None where no outcome is designed in: real text is what it is."""

    step: str
    change: str
    expected: GateOutcome | None
    outcome: GateOutcome
    detail: str


@dataclass(frozen=True)
class PlannedSwitch:
    """One switch the demo runs: its label, what it changes, and how it is gated."""

    step: str
    change: str
    expected: GateOutcome | None
    sets: list[str]
    gate_prompts: str | None = None


@dataclass(frozen=True)
class DemoResult:
    rows: list[DemoRow]
    gate: list[GateStep]
    real: list[real_text.WorkloadRow]


def config_text(binary: Path, models: DemoModels, ports: dict[str, int]) -> str:
    """The demo's llamanix.toml: the target twice, the second drafting with the draft."""
    q = json.dumps
    return (
        "# Written by llamanix testbed demo.\n"
        + real_text.local_host(binary, models.target, 2048)
        + "\n"
        "[instances.plain]\n"
        f"port = {ports['plain']}\n"
        "\n"
        "[instances.speculative]\n"
        f"port = {ports['speculative']}\n"
        "\n"
        "[instances.speculative.speculative]\n"
        'type = "draft"\n'
        f"draft_model = {q(str(models.draft))}\n"
        f"n_max = {GOOD_N_MAX}\n"
        f"p_min = {GOOD_P_MIN}\n"
    )


def deploy_config_text(binary: Path, models: DemoModels, ports: dict[str, int]) -> str:
    """The deploy loop's llamanix.toml: plain instances, which the switches then change: the
    synthetic target (``chat``) and, where ``ports`` name them, two of the real model (``edit``
    and ``prose``). One ``up`` serves them all; the idle ones cost nothing."""
    text = (
        "# Written by llamanix testbed demo: the deploy loop, run by `llamanix up`.\n"
        + real_text.local_host(binary, models.target, 2048)
        + "\n"
        "[instances.chat]\n"
        f"port = {ports['chat']}\n"
        "context = 1024\n"
    )
    for name in ("edit", "prose"):
        if name in ports and models.real is not None:
            text += (
                f"\n[instances.{name}]\n"
                f"model = {json.dumps(str(models.real))}\n"
                f"port = {ports[name]}\n"
                f"context = {real_text.CONTEXT_PER_SLOT}\n"
            )
    return text


def measure(
    url: str, label: str, speculation: str, tokens: int, runs: int
) -> tuple[BenchResult, DemoRow]:
    """Streamed chat completions through llamanix.bench.bench: one warm-up, then ``runs`` runs."""
    settings = BenchSettings(url=url, max_tokens=(tokens,), runs=runs, warmup=1, label=label)
    prompt = Prompt("demo", ({"role": "user", "content": DEMO_PROMPT},))
    result = run_bench(settings, [prompt])
    summary = result.summaries[0]
    requests = [q for run in result.runs for q in run.requests]
    ttft = summary.median("ttft_s")
    row = DemoRow(
        instance=label,
        speculation=speculation,
        server_decode_tok_s=summary.median("server_decode_tok_s"),
        client_decode_tok_s=summary.median("client_decode_tok_s"),
        ttft_ms=ttft * 1000 if ttft is not None else None,
        wall_s=summary.median("wall_s"),
        drafted=sum(q.draft_n or 0 for q in requests),
        accepted=sum(q.draft_n_accepted or 0 for q in requests),
    )
    return result, row


def _check_binary(binary: Path | None) -> Path:
    if binary is None:
        return server_build.ensure_llama_server(progress=True)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise UserError(
            Problem(
                "llamanix testbed demo",
                "--binary",
                f"{binary} is not an executable file",
                "give the path of a llama-server binary",
            )
        )
    return binary


def run_demo(
    binary: Path | None,
    keep: Path | None,
    console: Console,
    tokens: int = DEFAULT_TOKENS,
    runs: int = DEFAULT_RUNS,
    gate: bool = True,
    real: bool = True,
    synthetic_gate: bool = False,
) -> DemoResult:
    """The synthetic pair, then real text, then the switches through the bench gate."""
    binary = _check_binary(binary)
    model = real_model.ensure_real_model() if real else None
    rows: list[DemoRow] = []
    with work_dir(keep, "llamanix-demo.") as work:
        with console.status("synthesizing the target and the drafts"):
            models = write_models(work)
        config_path = work / "llamanix.toml"
        ports = {name: free_port() for name in INSTANCES}
        atomic_write(config_path, config_text(binary, models, ports))
        config = load_config(config_path)
        render_dir = work / "render"
        write_render(render_host(config, "local"), render_dir)
        console.print(f"config {config_path}, rendered units in {render_dir}")
        for name in INSTANCES:
            argv = json.loads((render_dir / f"{name}.argv.json").read_text())
            spec = config.instances[name].speculative
            speculation = (
                f"{spec.type}: 1-block, n_max {spec.n_max}, p_min {spec.p_min:g}"
                if spec.enabled and spec.p_min is not None
                else "none"
            )
            server = LlamaServer(argv, work / f"{name}.log")
            try:
                with console.status(f"{name}: starting llama-server"):
                    server.start()
                with console.status(f"{name}: {runs} runs of {tokens} tokens"):
                    result, row = measure(server.url, name, speculation, tokens, runs)
            finally:
                server.stop()
            atomic_write(work / f"{name}.bench.json", json.dumps(result.to_json(), indent=2))
            rows.append(row)
        real_rows: list[real_text.WorkloadRow] = []
        if model is not None:
            with console.status("real text: the real model, plain and self-speculating"):
                real_rows = real_text.measure_real_text(
                    binary,
                    model,
                    real_text.demo_prompts(REAL_PROMPTS_PER_WORKLOAD),
                    work / "real-text",
                    tokens=REAL_TOKENS,
                )
        steps: list[GateStep] = []
        if gate:
            # Real text may well cost nothing anywhere on this machine: the unrelated draft is
            # the switch that is sure to cost, so the gate is seen to roll one back.
            plan = gate_plan(models)
            if not (synthetic_gate or model is None):
                plan = [p for p in plan if p.expected == "rolled back"]
            names = ("chat", "edit", "prose") if model is not None else ("chat",)
            ports = {name: free_port() for name in names}
            real_plan = real_gate_plan() if model is not None else []
            steps = deploy_loop(
                deploy_config_text(binary, replace(models, real=model), ports),
                names,
                [*real_plan, *plan],
                work / "deploy",
                console,
            )
    return DemoResult(rows, steps, real_rows)


# --- the deploy loop: llamanix up + llamanix switch --gate bench -----------------------------


def _llamanix(*args: str) -> list[str]:
    return [sys.executable, "-m", "llamanix", *args]


def switch_argv(config: Path, sets: list[str], gate_prompts: str | None = None) -> list[str]:
    """The switch the demo runs: the bench gate, against the instance as it serves now (on
    ``gate_prompts``, in turn, with at most REAL_GATE_MAX_RUNS runs)."""
    argv = [
        "switch",
        str(config),
        "--host",
        "local",
        "--manager",
        "up",
        "--gate",
        "bench",
        "--max-regression",
        f"{MAX_REGRESSION_PCT:g}",
    ]
    if gate_prompts is not None:
        argv += ["--gate-prompts", gate_prompts, "--max-runs", str(REAL_GATE_MAX_RUNS)]
    for item in sets:
        argv += ["--set", item]
    return _llamanix(*argv)


def _speculation_sets(draft: Path, n_max: int, p_min: float) -> list[str]:
    key = "instances.chat.speculative"
    return [
        f"{key}.type=draft",
        f"{key}.draft_model={json.dumps(str(draft))}",
        f"{key}.n_max={n_max}",
        f"{key}.p_min={p_min:.1f}",
    ]


def gate_plan(models: DemoModels) -> list[PlannedSwitch]:
    """The synthetic switches, in order: each with its designed outcome."""
    return [
        PlannedSwitch(
            "baseline",
            "plain, context 1024 -> 2048: no effect on decode speed",
            "kept",
            ["instances.chat.context=2048"],
        ),
        PlannedSwitch(
            "good draft",
            f"speculate with the 1-block draft, n_max {GOOD_N_MAX}, p_min {GOOD_P_MIN:g}",
            "kept",
            _speculation_sets(models.draft, GOOD_N_MAX, GOOD_P_MIN),
        ),
        PlannedSwitch(
            "bad draft",
            f"an unrelated draft, n_max {BAD_N_MAX}, p_min {BAD_P_MIN:g}",
            "rolled back",
            _speculation_sets(models.unrelated_draft, BAD_N_MAX, BAD_P_MIN),
        ),
    ]


def real_gate_plan() -> list[PlannedSwitch]:
    """ngram-mod for each instance, gated on its own workload's prompt."""
    return [
        PlannedSwitch(
            f"ngram-mod, {workload}",
            f"instance {workload}: speculate with ngram-mod (real model), gated on the "
            f"{workload} prompts",
            None,
            [f"instances.{workload}.speculative.type=ngram-mod"],
            prompt,
        )
        for workload, prompt in REAL_GATES
    ]


def _gate_detail(output: str) -> str:
    """The gate's own line(s) from switch's output, e.g. the decode rate it measured. A gate
    said again for the same instance (a regression confirmed by measuring the baseline again)
    replaces what it said first: the later line carries the first verdict too."""
    said: dict[str, str] = {}
    for ln in (ln.strip() for ln in output.splitlines()):
        if ln.startswith("gate "):
            said[ln.split(": ", 1)[0]] = ln.split(": ", 2)[-1]
    return "; ".join(said.values()) or output.strip()[-300:]


def run_switch(config: Path, switch: PlannedSwitch, log: Path) -> tuple[GateOutcome, str]:
    """One real ``llamanix switch``: exit 0 is kept, exit 1 is a failed gate rolled back."""
    argv = switch_argv(config, switch.sets, switch.gate_prompts)
    proc = run_captured(argv, cwd=config.parent)
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode not in (0, 1):
        raise ExternalCommandError(
            f"llamanix switch exited {proc.returncode} (log: {log}):\n"
            f"{(proc.stdout + proc.stderr).strip()[-1000:]}"
        )
    outcome: GateOutcome = "kept" if proc.returncode == 0 else "rolled back"
    return outcome, _gate_detail(proc.stdout + proc.stderr)


@contextlib.contextmanager
def running_up(config: Path, instances: tuple[str, ...], log: Path) -> Iterator[Path]:
    """``llamanix up`` on a deploy config until the block ends; yields its units directory."""
    with (
        log.open("ab") as out,
        up_process.running_up(
            config,
            "local",
            instances[0],
            more=instances[1:],
            stdout=out,
            explain=lambda: f"(log: {log})\n" + log.read_text(errors="replace").strip()[-1000:],
        ),
    ):
        yield up_process.up_units(config, "local")


def deploy_loop(
    config_text: str,
    instances: tuple[str, ...],
    plan: list[PlannedSwitch],
    work: Path,
    console: Console,
) -> list[GateStep]:
    """Run ``up`` on a config of plain instances and put each planned switch through the
    bench gate."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "llamanix.toml"
    atomic_write(config, config_text)
    steps: list[GateStep] = []
    with (
        console.status("deploy loop: starting llamanix up") as status,
        running_up(config, instances, work / "up.log"),
    ):
        for switch in plan:
            status.update(f"llamanix switch ({switch.step}): bench gate")
            outcome, detail = run_switch(config, switch, work / "switch.log")
            console.print(f"llamanix switch ({switch.step}): {outcome}")
            steps.append(GateStep(switch.step, switch.change, switch.expected, outcome, detail))
    return steps


# --- output ----------------------------------------------------------------------------------


def _row(rows: list[DemoRow], speculating: bool) -> DemoRow | None:
    return next((r for r in rows if (r.speculation != "none") == speculating), None)


def speedup(rows: list[DemoRow]) -> float | None:
    """Speculative decode tok/s over plain decode tok/s (server clock), when both exist."""
    plain, spec = _row(rows, False), _row(rows, True)
    if plain is None or spec is None:
        return None
    if not plain.server_decode_tok_s or spec.server_decode_tok_s is None:
        return None
    return spec.server_decode_tok_s / plain.server_decode_tok_s


def demo_json(result: DemoResult, tokens: int, runs: int) -> dict[str, object]:
    spec = _row(result.rows, True)
    return {
        "tokens": tokens,
        "runs": runs,
        "rows": [
            {
                "instance": r.instance,
                "speculation": r.speculation,
                "server_decode_tok_s": r.server_decode_tok_s,
                "client_decode_tok_s": r.client_decode_tok_s,
                "ttft_ms": r.ttft_ms,
                "wall_s": r.wall_s,
                "drafted": r.drafted,
                "accepted": r.accepted,
                "acceptance": r.acceptance,
            }
            for r in result.rows
        ],
        "acceptance": spec.acceptance if spec is not None else None,
        "speedup": speedup(result.rows),
        "real_text": {
            "model": real_model.MODEL_FILE,
            "tokens": REAL_TOKENS,
            "prompts_per_workload": REAL_PROMPTS_PER_WORKLOAD,
            "rows": [r.to_json() for r in result.real],
        }
        if result.real
        else None,
        "gate": [
            {
                "step": g.step,
                "change": g.change,
                "expected": g.expected,
                "outcome": g.outcome,
                "detail": g.detail,
            }
            for g in result.gate
        ],
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def demo_table(rows: list[DemoRow], tokens: int, runs: int) -> Table:
    ratio = speedup(rows)
    table = Table(
        title=f"llamanix testbed demo: {runs} streamed runs of {tokens} tokens, medians",
        caption="tok/s: llama-server's decode rate; client: the same span on this side's "
        "clock; wall: one whole request. "
        + (f"Speculation: {ratio:.2f}x the plain decode rate." if ratio is not None else ""),
    )
    table.add_column("instance", no_wrap=True)
    table.add_column("speculation")
    for column in ("tok/s", "client", "TTFT ms", "wall s", "accepted", "acceptance"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.instance,
            row.speculation,
            _fmt(row.server_decode_tok_s, ".1f"),
            _fmt(row.client_decode_tok_s, ".1f"),
            _fmt(row.ttft_ms, ".1f"),
            _fmt(row.wall_s, ".2f"),
            f"{row.accepted}/{row.drafted}",
            _fmt(row.acceptance, ".2f"),
        )
    return table


def real_table(rows: list[real_text.WorkloadRow]) -> Table:
    table = Table(
        title=f"real text: {real_model.MODEL_FILE} (a base model), {REAL_PROMPTS_PER_WORKLOAD} "
        f"prompts per workload, {REAL_TOKENS} tokens each, against the same model without "
        "speculation",
        caption="speed-up: llama-server's decode rate over plain's, the geometric mean over the "
        "prompts with its 95% interval; acceptance: drafted tokens kept; same text: prompts "
        "whose text at temperature 0 is plain's (the others' edit distances).",
    )
    table.add_column("speculation", no_wrap=True)
    table.add_column("workload", no_wrap=True)
    for column in ("decode speed-up [95%]", "acceptance", "same text"):
        table.add_column(column, justify="right")
    for r in rows:
        acceptance = (
            f"{r.acceptance:.0%} ({r.accepted}/{r.drafted})" if r.acceptance is not None else "-"
        )
        same = f"{r.identical}/{r.prompts}"
        if r.edit_distances:
            same += f" ({', '.join(map(str, r.edit_distances))})"
        table.add_row(
            r.speculation,
            r.workload,
            r.speedup.text() if r.speedup else "-",
            acceptance,
            same,
        )
    return table


def gate_table(steps: list[GateStep]) -> Table:
    table = Table(
        title=f"switches through llamanix switch --manager up --gate bench "
        f"--max-regression {MAX_REGRESSION_PCT:g}",
    )
    table.add_column("switch", no_wrap=True)
    table.add_column("change")
    table.add_column("outcome", no_wrap=True)
    table.add_column("bench gate")
    for g in steps:
        # The health and chat checks pass in every row; the decode figure is the news.
        # A verdict other than the planned one (a very noisy machine) is shown, not hidden.
        outcome = (
            g.outcome
            if g.expected is None or g.outcome == g.expected
            else f"{g.outcome} (expected {g.expected})"
        )
        table.add_row(g.step, g.change, outcome, g.detail.removeprefix("health ok, chat ok; "))
    return table
