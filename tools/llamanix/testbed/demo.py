"""``llamanix demo``: the whole path on this machine, no GPU and no download of a model.

It synthesizes a small confident model, writes a llamanix config with two instances of it
(one plain, one speculating with the model as its own draft), renders that config like a
deployment would, starts the real llama-server from each rendered argv in turn, measures
each with the benchmark's streaming client, and prints the two side by side.

A model drafting for itself cannot make decoding faster (every drafted token costs a full
forward pass of the same model); what the demo shows is the mechanism working end to end:
speculation configured in one place, rendered to the right flags, drafting, and accepted.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamanix.core.config import load_config
from llamanix.core.errors import Problem, UserError
from llamanix.external.files import atomic_write
from llamanix.measure import bench
from llamanix.measure.server_process import LlamaServer, free_port
from llamanix.render.units import render_host, write_render
from llamanix.testbed import server_build
from llamanix.testbed.synth import SynthSpec, synth_model

INSTANCES = ("plain", "speculative")
DEMO_PROMPT = "Write a short story about a llama who learns to read."
DEFAULT_TOKENS = 128
DEFAULT_RUNS = 5  # the guide: N >= 5 after warm-up, or the numbers are noise
# A little wider than synth-model's default, so there is something to measure.
DEMO_MODEL = SynthSpec(layers=4, embd=256, ff=512, heads=4, kv_heads=4, seed=1)


@dataclass(frozen=True)
class DemoRow:
    """One server's figures: medians over the runs, draft counts summed."""

    instance: str
    speculation: str
    server_decode_tok_s: float | None
    client_decode_tok_s: float | None
    ttft_ms: float | None
    drafted: int
    accepted: int

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def config_text(binary: Path, model: Path, ports: dict[str, int]) -> str:
    """The demo's llamanix.toml: the same model twice, the second drafting for itself."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    return (
        "# Written by llamanix demo.\n"
        "[hosts.local]\n"
        'kind = "systemd-user"\n'
        "\n"
        "[defaults]\n"
        'host = "local"\n'
        f"binary = {q(str(binary))}\n"
        f"model = {q(str(model))}\n"
        "context = 2048\n"
        "parallel = 1\n"
        "threads = 2\n"
        "metrics = true\n"
        "\n"
        "[instances.plain]\n"
        f"port = {ports['plain']}\n"
        "\n"
        "[instances.speculative]\n"
        f"port = {ports['speculative']}\n"
        "\n"
        "[instances.speculative.speculative]\n"
        'type = "draft"\n'
        f"draft_model = {q(str(model))}\n"
        "n_max = 8\n"
        "p_min = 0.6\n"
    )


def measure(
    url: str, label: str, speculation: str, tokens: int, runs: int
) -> tuple[bench.BenchResult, DemoRow]:
    """Streamed chat completions through llamanix.measure.bench: one warm-up, then ``runs`` runs."""
    settings = bench.BenchSettings(url=url, max_tokens=(tokens,), runs=runs, warmup=1, label=label)
    prompt = bench.Prompt("demo", ({"role": "user", "content": DEMO_PROMPT},))
    result = bench.run_bench(settings, [prompt])
    summary = result.summaries[0]
    requests = [q for run in result.runs for q in run.requests]
    ttft = summary.median("ttft_s")
    row = DemoRow(
        instance=label,
        speculation=speculation,
        server_decode_tok_s=summary.median("server_decode_tok_s"),
        client_decode_tok_s=summary.median("client_decode_tok_s"),
        ttft_ms=ttft * 1000 if ttft is not None else None,
        drafted=sum(q.draft_n or 0 for q in requests),
        accepted=sum(q.draft_n_accepted or 0 for q in requests),
    )
    return result, row


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="llamanix-demo.") as tmp:
        yield Path(tmp)


def run_demo(
    binary: Path | None,
    keep: Path | None,
    console: Console,
    tokens: int = DEFAULT_TOKENS,
    runs: int = DEFAULT_RUNS,
) -> list[DemoRow]:
    """Synthesize, configure, render, serve and measure; return one row per instance."""
    if binary is None:
        binary = server_build.ensure_llama_server(progress=True)
    elif not (binary.is_file() and os.access(binary, os.X_OK)):
        raise UserError(
            Problem(
                "llamanix demo",
                "--binary",
                f"{binary} is not an executable file",
                "give the path of a llama-server binary",
            )
        )
    rows: list[DemoRow] = []
    with _workdir(keep) as work:
        model = work / "demo-model.gguf"
        with console.status("synthesizing the model"):
            synth_model(DEMO_MODEL, model)
        config_path = work / "llamanix.toml"
        ports = {name: free_port() for name in INSTANCES}
        atomic_write(config_path, config_text(binary, model, ports))
        config = load_config(config_path)
        render_dir = work / "render"
        write_render(render_host(config, "local"), render_dir)
        console.print(f"config {config_path}, rendered units in {render_dir}")
        for name in INSTANCES:
            argv = json.loads((render_dir / f"{name}.argv.json").read_text())
            spec = config.instances[name].speculative
            speculation = (
                f"{spec.type}: self, n_max {spec.n_max}, p_min {spec.p_min:g}"
                if spec.enabled and spec.p_min is not None
                else "none"
            )
            with console.status(f"{name}: starting llama-server"):
                server = LlamaServer(argv, work / f"{name}.log").start()
            try:
                with console.status(f"{name}: {runs} runs of {tokens} tokens"):
                    result, row = measure(server.url, name, speculation, tokens, runs)
            finally:
                server.stop()
            atomic_write(work / f"{name}.bench.json", json.dumps(result.to_json(), indent=2))
            rows.append(row)
    return rows


def speedup(rows: list[DemoRow]) -> float | None:
    """Speculative decode tok/s over plain decode tok/s (server clock), when both exist."""
    plain = next((r for r in rows if r.speculation == "none"), None)
    spec = next((r for r in rows if r.speculation != "none"), None)
    if plain is None or spec is None:
        return None
    if not plain.server_decode_tok_s or spec.server_decode_tok_s is None:
        return None
    return spec.server_decode_tok_s / plain.server_decode_tok_s


def demo_json(rows: list[DemoRow], tokens: int, runs: int) -> dict[str, object]:
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
                "drafted": r.drafted,
                "accepted": r.accepted,
                "acceptance": r.acceptance,
            }
            for r in rows
        ],
        "speedup": speedup(rows),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def demo_table(rows: list[DemoRow], tokens: int, runs: int) -> Table:
    table = Table(
        title=f"llamanix demo: {runs} streamed runs of {tokens} tokens, medians",
        caption="tok/s: llama-server's decode rate; client: the same span on this side's "
        "clock. A model drafting for itself shows acceptance, not a speed-up.",
    )
    table.add_column("instance", no_wrap=True)
    table.add_column("speculation")
    for column in ("tok/s", "client", "TTFT ms", "accepted", "acceptance"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.instance,
            row.speculation,
            _fmt(row.server_decode_tok_s, ".1f"),
            _fmt(row.client_decode_tok_s, ".1f"),
            _fmt(row.ttft_ms, ".1f"),
            f"{row.accepted}/{row.drafted}",
            _fmt(row.acceptance, ".2f"),
        )
    return table
