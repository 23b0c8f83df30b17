"""Real text on the real model: speculation where acceptance depends on the workload.

The synthetic models of the test bed agree with their drafts by construction, so they only show
what speculation does when it is right. Here the real model (``real_model``: Gemma 3 270M,
Q4_K_M, a base model) is served through the same config, render and argv as any deployment,
once plain and once per self-speculating type (no draft model: n-gram drafters that look for the
next tokens in the context), and every prompt of the real-text set (``realtext``: raw text for
/completion, in two workloads) is run once on each server:

- ``edit``: a text, then the same text with one small change. Most of the answer is in the
  prompt, so an n-gram drafter finds it there and most drafts are kept;
- ``prose``: a story or a question to continue. Little of the answer is in the prompt: drafts
  are rare and mostly wrong.

Per speculation and workload this gives the decode speed-up over plain with its 95% interval
(the geometric mean of per-prompt ratios, ``interval.paired_ratio_interval``), the acceptance
(accepted over drafted tokens, from the requests' timings) and whether the text came out the
same as plain's at temperature 0 (the lossless question, on the very texts that were timed).
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rapidfuzz.distance import Levenshtein

from llamanix.bench.bench_results import RunResult
from llamanix.bench.interval import RatioInterval, paired_speedup
from llamanix.bench.prompts import Prompt, load_prompts
from llamanix.bench.workloads import run_interleaved as interleaved
from llamanix.config.model import Config, parse_config
from llamanix.core.errors import UserError
from llamanix.core.json_codec import JsonRecord, JsonShape
from llamanix.render.host_render import render_host
from llamanix.server.server_process import LlamaServer, free_port

HOST = "local"
THREADS = 2
CONTEXT_PER_SLOT = 2048  # the longest real-text prompt is ~450 tokens, plus the answer
DEFAULT_TOKENS = 64
DRAFT_STEPS = "spec_decode_num_drafts_total"


@dataclass(frozen=True)
class Speculation:
    """A server of the comparison: its instance name and its ``speculative.type``."""

    name: str
    types: tuple[str, ...]

    @property
    def enabled(self) -> bool:
        return self.types != ("none",)


PLAIN = Speculation("plain", ("none",))
NGRAM_MOD = Speculation("ngram-mod", ("ngram-mod",))
NGRAM_MAP_K4V = Speculation("ngram-map-k4v", ("ngram-map-k4v",))
# A chain: ngram-mod drafts where it finds a match, ngram-map-k4v where it does not.
CHAIN = Speculation("ngram-mod+ngram-map-k4v", ("ngram-mod", "ngram-map-k4v"))
SPECULATIONS = (NGRAM_MOD, NGRAM_MAP_K4V, CHAIN)


def instance_name(spec: Speculation) -> str:
    return spec.name.replace("+", "-then-")


def local_host(binary: Path, model: Path, context: int, parallel: int = 1) -> str:
    """The start of a test-bed llamanix.toml: host ``local`` (user units) and the defaults
    every instance of it shares (the binary, a model, the threads of this 2-core machine,
    /metrics on)."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    return (
        f"[hosts.{HOST}]\n"
        'kind = "systemd-user"\n'
        "\n"
        "[defaults]\n"
        f'host = "{HOST}"\n'
        f"binary = {q(str(binary))}\n"
        f"model = {q(str(model))}\n"
        f"context = {context}\n"
        f"parallel = {parallel}\n"
        f"threads = {THREADS}\n"
        "metrics = true\n"
    )


def config_text(
    binary: Path, model: Path, ports: Mapping[Speculation, int], parallel: int = 1
) -> str:
    """A llamanix.toml serving ``model`` once per speculation, each on its own port."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    text = "# Written by llamanix: the real model, plain and self-speculating.\n" + local_host(
        binary, model, CONTEXT_PER_SLOT * parallel, parallel
    )
    for spec, port in ports.items():
        text += f"\n[instances.{instance_name(spec)}]\nport = {port}\n"
        if spec.enabled:
            types = q(spec.types[0]) if len(spec.types) == 1 else q(list(spec.types))
            text += f"\n[instances.{instance_name(spec)}.speculative]\ntype = {types}\n"
    return text


def real_config(
    binary: Path, model: Path, specs: Sequence[Speculation], parallel: int = 1
) -> tuple[Config, list[Speculation]]:
    """The config serving ``specs`` and the speculations it holds: on a build that takes one
    speculative type, not a chain (the renderer refuses it from the binary's --help), the
    chains are left out."""
    kept = list(specs)
    while True:
        ports = {s: free_port() for s in kept}
        text = config_text(binary, model, ports, parallel)
        config = parse_config(tomllib.loads(text), "real-text")
        try:
            render_host(config, HOST)
        except UserError:
            if all(len(s.types) == 1 for s in kept):
                raise
            kept = [s for s in kept if len(s.types) == 1]
            continue
        return config, kept


@contextlib.contextmanager
def serving(config: Config, spec: Speculation, log_dir: Path) -> Iterator[LlamaServer]:
    """The instance's rendered argv, running until the block ends."""
    name = instance_name(spec)
    rendered = next(r for r in render_host(config, HOST).instances if r.name == name)
    with LlamaServer(rendered.argv, log_dir / f"{name}.log") as server:
        yield server


# --- one server, every prompt once ----------------------------------------------------------


@dataclass(frozen=True)
class PromptRun:
    """One prompt on one server: what it wrote and how fast."""

    prompt: str
    workload: str
    text: str
    decode_tok_s: float | None
    drafted: int
    accepted: int
    steps: int  # verification steps that checked a draft (/metrics spec_decode_num_drafts)


def _prompt_run(prompt: Prompt, run: RunResult) -> PromptRun:
    q = run.requests[0]
    return PromptRun(
        prompt=prompt.name,
        workload=prompt.workload or "all",
        text=q.text or "",
        decode_tok_s=q.server_decode_tok_s,
        drafted=q.draft_n or 0,
        accepted=q.draft_n_accepted or 0,
        steps=int((run.metrics_delta or {}).get(DRAFT_STEPS, 0)),
    )


def run_interleaved(
    urls: Mapping[Speculation, str], prompts: Sequence[Prompt], tokens: int
) -> dict[Speculation, list[PromptRun]]:
    """Every prompt once on every server, interleaved (``workloads.run_interleaved``: this VM
    drifts by 15% within a minute, and interleaving makes the drift fall on all alike)."""
    specs = list(urls)
    runs = interleaved(list(urls.values()), prompts, tokens)
    return {
        spec: [_prompt_run(p, run) for p, run in zip(prompts, mine, strict=True)]
        for spec, mine in zip(specs, runs, strict=True)
    }


@contextlib.contextmanager
def serving_all(
    config: Config, specs: Sequence[Speculation], log_dir: Path
) -> Iterator[dict[Speculation, str]]:
    """Every instance of ``specs`` running at once (idle ones cost nothing): their URLs."""
    with contextlib.ExitStack() as stack:
        yield {s: stack.enter_context(serving(config, s, log_dir)).url for s in specs}


# --- the comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadRow(JsonRecord):
    """One speculation on one workload, against plain on the same prompts; written with the
    acceptance that follows from the counts."""

    speculation: str
    workload: str
    prompts: int
    speedup: RatioInterval | None
    drafted: int
    accepted: int
    identical: int
    edit_distances: tuple[int, ...]  # of the prompts whose text differs from plain's

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={"acceptance": lambda r: r.acceptance},
        order=(
            "speculation",
            "workload",
            "prompts",
            "speedup",
            "drafted",
            "accepted",
            "acceptance",
            "identical",
            "edit_distances",
        ),
    )

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def compare(
    spec: Speculation, plain: Sequence[PromptRun], runs: Sequence[PromptRun]
) -> list[WorkloadRow]:
    """Per workload: the paired speed-up, the acceptance and the lossless count."""
    base = {r.prompt: r for r in plain}
    rows = []
    for workload in dict.fromkeys(r.workload for r in runs):
        mine = [r for r in runs if r.workload == workload]
        pairs = [(base[r.prompt], r) for r in mine if r.prompt in base]
        speedup = paired_speedup(
            [b.decode_tok_s for b, _ in pairs], [c.decode_tok_s for _, c in pairs]
        )
        differ = [Levenshtein.distance(b.text, c.text) for b, c in pairs if b.text != c.text]
        rows.append(
            WorkloadRow(
                speculation=spec.name,
                workload=workload,
                prompts=len(mine),
                speedup=speedup,
                drafted=sum(r.drafted for r in mine),
                accepted=sum(r.accepted for r in mine),
                identical=len(pairs) - len(differ),
                edit_distances=tuple(differ),
            )
        )
    return rows


def demo_prompts(per_workload: int) -> list[Prompt]:
    """The ``per_workload`` shortest prompts of each real-text workload (the demo's time goes
    into prefill as much as into decoding), in the set's order."""
    prompts = load_prompts("realtext")
    out: list[Prompt] = []
    for workload in dict.fromkeys(p.workload for p in prompts):
        mine = [p for p in prompts if p.workload == workload]
        shortest = {p.name for p in sorted(mine, key=lambda p: len(p.text or ""))[:per_workload]}
        out += [p for p in mine if p.name in shortest]
    return out


def measure_real_text(
    binary: Path,
    model: Path,
    prompts: Sequence[Prompt],
    work: Path,
    tokens: int = DEFAULT_TOKENS,
    specs: Sequence[Speculation] = SPECULATIONS,
) -> list[WorkloadRow]:
    """Serve the model plain and per speculation, run every prompt on each (interleaved), and
    compare each with plain."""
    config, kept = real_config(binary, model, [PLAIN, *specs])
    with serving_all(config, kept, work) as urls:
        runs = run_interleaved(urls, prompts, tokens)
    return [row for spec in kept if spec.enabled for row in compare(spec, runs[PLAIN], runs[spec])]
