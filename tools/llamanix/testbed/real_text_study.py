"""The real-text study behind docs/measuring.md's "Real text" tables (and the tests that print
them): is speculation lossless on real text, does ``llamanix bench`` agree with llama-bench,
and does the synthetic acceptance sweep predict the real speed-up?

Every function serves the real model itself, one server at a time (two servers would share the
two cores and slow each other), and returns typed figures; nothing here asserts or decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from llamanix.bench.bench import run_bench
from llamanix.bench.bench_results import BenchSettings
from llamanix.bench.interval import RatioInterval
from llamanix.bench.prompts import Prompt
from llamanix.bench.synthetic_acceptance import SweepRequest, mean_length, plan_sweep, run_sweep
from llamanix.config.model import Config
from llamanix.core.json_codec import JSON_INLINE, JsonRecord
from llamanix.diagnose.lossless import (
    Answer,
    LosslessSettings,
    WorkloadSummary,
    collect_answers,
    compare_runs,
    summarise_workloads,
)
from llamanix.external.llama_bench import LlamaBenchTest, llama_bench_argv, run_llama_bench
from llamanix.server.client import LlamaClient
from llamanix.testbed.real_text import (
    NGRAM_MOD,
    PLAIN,
    SPECULATIONS,
    THREADS,
    Speculation,
    compare,
    instance_name,
    real_config,
    run_interleaved,
    serving,
    serving_all,
)

# --- lossless at temperature 0, one slot and several ---------------------------------------


@dataclass(frozen=True)
class LosslessRow(JsonRecord):
    """One comparison at one slot count, per workload: B's texts against plain's."""

    slots: int
    compared: str  # "ngram-mod" or "plain (control)"
    # Its keys sit beside the counts.
    summary: WorkloadSummary = field(metadata=JSON_INLINE)


CONTROL = "plain (control)"


def _answers(
    config: Config,
    spec: Speculation,
    prompts: Sequence[Prompt],
    settings: LosslessSettings,
    work: Path,
) -> list[Answer]:
    with serving(config, spec, work) as server, LlamaClient(server.url) as client:
        return collect_answers(client, prompts, settings)


def lossless_study(
    binary: Path,
    model: Path,
    prompts: Sequence[Prompt],
    work: Path,
    *,
    tokens: int = 64,
    slots: Sequence[int] = (1, 4),
    specs: Sequence[Speculation] = SPECULATIONS,
) -> list[LosslessRow]:
    """Per slot count: plain twice (two server processes: the control), then each speculation,
    every prompt once, ``slots`` requests in flight on a server with as many slots. Each
    speculation and the control are compared with the first plain run."""
    rows: list[LosslessRow] = []
    for n in slots:
        config, kept = real_config(binary, model, [PLAIN, *specs], parallel=n)
        settings = LosslessSettings(url_a="", url_b="", max_tokens=tokens, runs=1, concurrency=n)
        plain = _answers(config, PLAIN, prompts, settings, work)
        again = _answers(config, PLAIN, prompts, settings, work)
        compared = [(CONTROL, again)]
        compared += [
            (s.name, _answers(config, s, prompts, settings, work)) for s in kept if s.enabled
        ]
        for label, answers in compared:
            for summary in summarise_workloads(compare_runs(prompts, [(plain, answers)])):
                rows.append(LosslessRow(n, label, summary))
    return rows


# --- llamanix bench against llama-bench ----------------------------------------------------


@dataclass(frozen=True)
class BenchAgreement:
    """The same binary and model measured by both: the server's clock over HTTP, and
    llama-bench's (pp at the prompt's length, tg after as many tokens of context)."""

    prompt_tokens: int
    gen_tokens: int
    bench_prefill_tok_s: float
    bench_decode_tok_s: float
    llama_bench: tuple[LlamaBenchTest, ...]

    def _test(self, kind: str) -> LlamaBenchTest:
        return next(t for t in self.llama_bench if t.kind == kind)

    @property
    def pp_ratio(self) -> float:
        return self.bench_prefill_tok_s / self._test("pp").avg_tok_s

    @property
    def tg_ratio(self) -> float:
        return self.bench_decode_tok_s / self._test("tg").avg_tok_s

    def lines(self) -> list[str]:
        pp, tg = self._test("pp"), self._test("tg")
        return [
            f"prefill ({self.prompt_tokens} tokens): llamanix bench {self.bench_prefill_tok_s:.1f} "
            f"tok/s, llama-bench pp{pp.n_prompt} {pp.avg_tok_s:.1f} +- {pp.stddev_tok_s:.1f}: "
            f"ratio {self.pp_ratio:.2f}",
            f"decode ({self.gen_tokens} tokens): llamanix bench {self.bench_decode_tok_s:.1f} "
            f"tok/s, llama-bench tg{tg.n_gen} at depth {tg.n_depth} {tg.avg_tok_s:.1f} +- "
            f"{tg.stddev_tok_s:.1f}: ratio {self.tg_ratio:.2f}",
        ]


def bench_against_llama_bench(
    binary: Path,
    bench_binary: Path,
    model: Path,
    prompt: Prompt,
    work: Path,
    *,
    gen_tokens: int = 128,
    runs: int = 5,
) -> BenchAgreement:
    """``llamanix bench`` on a plain server (N runs after two warm-ups), the server stopped,
    then llama-bench with the same threads, prompt length and output length."""
    config, _ = real_config(binary, model, [PLAIN])
    settings = BenchSettings(url="", max_tokens=(gen_tokens,), runs=runs, warmup=2, label="bench")
    with serving(config, PLAIN, work) as server:
        result = run_bench(replace(settings, url=server.url), [prompt])
    summary = result.summaries[0]
    prompt_n = int(summary.median("prompt_n") or 0)
    prefill = summary.median("server_prefill_tok_s") or 0.0
    decode = summary.median("server_decode_tok_s") or 0.0
    # The prompt is processed into an empty context, the answer decoded after the prompt:
    # llama-bench's depth applies to every test of a run, so each gets its own run.
    pp = run_llama_bench(
        llama_bench_argv(
            bench_binary, model, threads=THREADS, prompt_tokens=prompt_n, gen_tokens=0,
            repetitions=runs,
        )
    )  # fmt: skip
    tg = run_llama_bench(
        llama_bench_argv(
            bench_binary, model, threads=THREADS, prompt_tokens=0, gen_tokens=gen_tokens,
            depth=prompt_n, repetitions=runs,
        )
    )  # fmt: skip
    return BenchAgreement(prompt_n, gen_tokens, prefill, decode, (*pp, *tg))


# --- the synthetic sweep as a predictor ------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """The real edit workload with ngram-mod, and the synthetic sweep at its acceptance."""

    real_speedup: RatioInterval | None
    acceptance: float | None  # accepted / drafted tokens on the real workload
    mean_length: float  # tokens per verification step that checked a draft (1 + accepted/steps)
    steps: int
    predicted_tokens: int
    n_max: int
    rate: float  # the per-drafted-token rate whose mean length is the real one
    synthetic_speedup: float | None
    synthetic_interval: RatioInterval | None
    synthetic_acceptance: float | None  # what the synthetic run's drafts kept

    @property
    def error(self) -> float | None:
        """Predicted over real speed-up, minus one (+0.12: the sweep says 12% more)."""
        if self.real_speedup is None or self.synthetic_speedup is None:
            return None
        return self.synthetic_speedup / self.real_speedup.ratio - 1

    def lines(self) -> list[str]:
        real = self.real_speedup.text() if self.real_speedup else "-"
        synth = f"{self.synthetic_speedup:.2f}x" if self.synthetic_speedup else "-"
        if self.synthetic_interval is not None:
            interval = self.synthetic_interval
            synth += f" [{interval.low:.2f}, {interval.high:.2f}]"
        error = f"{self.error:+.0%}" if self.error is not None else "-"
        accepted = f"{self.acceptance:.0%}" if self.acceptance is not None else "-"
        synth_acc = (
            f"{self.synthetic_acceptance:.0%}" if self.synthetic_acceptance is not None else "-"
        )
        return [
            f"real edit workload, ngram-mod: decode {real}, {accepted} of drafted tokens "
            f"accepted, mean length {self.mean_length:.2f} over {self.steps} drafting steps "
            f"({self.predicted_tokens} tokens generated)",
            f"synthetic sweep at rate {self.rate:.3f} (n_max {self.n_max}, mean length "
            f"{mean_length(self.rate, self.n_max):.2f}): decode {synth}, drafts kept "
            f"{synth_acc}; prediction error {error}",
        ]


def rate_for_length(length: float, n_max: int) -> float:
    """The per-drafted-token rate ``p`` with ``1 + p + ... + p^n_max = length`` (bisection):
    the sweep's own model of a draft, solved for the mean length measured on real text."""
    if length <= 1:
        return 0.0
    if length >= n_max + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if mean_length(mid, n_max) < length:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def synthetic_prediction(
    binary: Path,
    model: Path,
    prompts: Sequence[Prompt],
    work: Path,
    *,
    tokens: int = 128,
) -> Prediction:
    """Measure ngram-mod against plain on ``prompts`` (real text), then sweep the synthetic
    acceptance at the rate whose mean acceptance length is the one measured, on the same
    prompts and lengths, and compare the two speed-ups. Both sides run each prompt once and
    warm up on none of them: ngram-mod keeps what a server has seen, so a repeat drafts more."""
    config, _ = real_config(binary, model, [PLAIN, NGRAM_MOD])
    with serving_all(config, [PLAIN, NGRAM_MOD], work) as urls:
        runs = run_interleaved(urls, prompts, tokens)
    plain, spec = runs[PLAIN], runs[NGRAM_MOD]
    # One speed-up over all the prompts, whatever their workloads.
    row = compare(
        NGRAM_MOD,
        [replace(r, workload="all") for r in plain],
        [replace(r, workload="all") for r in spec],
    )[0]
    drafted = sum(r.drafted for r in spec)
    accepted = sum(r.accepted for r in spec)
    steps = sum(r.steps for r in spec)
    length = 1 + accepted / steps if steps else 1.0
    plan = plan_sweep(config, instance_name(NGRAM_MOD))
    rate = rate_for_length(length, plan.n_max)
    sweep = run_sweep(
        SweepRequest(
            plan=plan,
            rates=(rate,),
            settings=BenchSettings(url="", max_tokens=(tokens,), runs=1, warmup=0),
            prompts=tuple(prompts),
            log_dir=work,
        )
    )
    point = sweep.points[0]
    return Prediction(
        real_speedup=row.speedup,
        acceptance=accepted / drafted if drafted else None,
        mean_length=length,
        steps=steps,
        predicted_tokens=tokens * len(prompts),
        n_max=plan.n_max,
        rate=rate,
        synthetic_speedup=point.speedup,
        synthetic_interval=point.speedup_interval,
        synthetic_acceptance=point.drafted_acceptance,
    )
