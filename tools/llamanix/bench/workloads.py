"""Speculation per workload: how much of the drafts a server keeps, and whether it pays.

Acceptance depends on the text: an edit (the answer is mostly the prompt again) is where an
n-gram drafter finds the next tokens in the context, free prose is where it finds few and
guesses wrong. So the prompts are grouped by their ``workload`` and each group is measured on
its own: every prompt once (after one warm-up request), /metrics read around each request, the
drafted and accepted tokens summed per workload from llama-server's own counters
(``spec_decode_num_draft_tokens_total``, ``spec_decode_num_accepted_tokens_total``; a request's
``timings`` stand in where /metrics is off). With a baseline (the same model without
speculation) the same prompts are measured there too, prompt by prompt on both servers so that
the machine's drift falls on both alike, and the speed-up is the geometric mean of the
per-prompt decode ratios with its bootstrap interval (``interval.paired_ratio_interval``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from llamanix.bench.bench import run_bench
from llamanix.bench.bench_results import BenchSettings, RunResult
from llamanix.bench.interval import RatioInterval, paired_speedup
from llamanix.bench.prompts import Prompt, warmup_prompt
from llamanix.core.json_codec import JsonRecord, JsonShape

DEFAULT_TOKENS = 64
DRAFTED = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
# Pays, costs, or neither can be told apart from noise (the interval holds 1).
Verdict = Literal["pays", "costs", "unclear"]


@dataclass(frozen=True)
class WorkloadFigures(JsonRecord):
    """One workload on one server, and on its baseline when there is one; written with the
    acceptance, speedup and verdict that follow from the fields."""

    workload: str
    prompts: tuple[str, ...]
    drafted: int | None  # None: the server reported no speculation at all
    accepted: int | None
    decode_tok_s: tuple[float | None, ...]  # per prompt, llama-server's clock
    baseline_tok_s: tuple[float | None, ...] | None = None

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={
            "acceptance": lambda w: w.acceptance,
            "speedup": lambda w: w.speedup,
            "verdict": lambda w: w.verdict,
        },
        order=(
            "workload",
            "prompts",
            "drafted",
            "accepted",
            "acceptance",
            "decode_tok_s",
            "baseline_tok_s",
            "speedup",
            "verdict",
        ),
    )

    @property
    def acceptance(self) -> float | None:
        if not self.drafted or self.accepted is None:
            return None
        return self.accepted / self.drafted

    @property
    def speedup(self) -> RatioInterval | None:
        """Speculation over the baseline, None without a baseline or with too few prompts."""
        if self.baseline_tok_s is None:
            return None
        return paired_speedup(self.baseline_tok_s, self.decode_tok_s)

    @property
    def verdict(self) -> Verdict | None:
        interval = self.speedup
        if interval is None:
            return None
        if interval.high < 1:
            return "costs"
        if interval.low > 1:
            return "pays"
        return "unclear"

    def sentence(self, label: str) -> str:
        """``ngram-mod: 0.82x on prose, 71% of drafts rejected``."""
        interval = self.speedup
        head = f"{label}: " + (
            f"{interval.ratio:.2f}x on {self.workload} (95% interval "
            f"{interval.low:.2f}-{interval.high:.2f})"
            if interval is not None
            else f"on {self.workload}"
        )
        rate = self.acceptance
        if rate is None:
            return head + ", nothing drafted"
        return (
            head + f", {1 - rate:.0%} of drafts rejected ({self.accepted} of {self.drafted} kept)"
        )


def workload_of(prompt: Prompt) -> str:
    return prompt.workload or "all"


def run_interleaved(
    urls: Sequence[str],
    prompts: Sequence[Prompt],
    tokens: int,
    *,
    api_key: str | None = None,
    model: str | None = None,
) -> list[list[RunResult]]:
    """Every prompt once on every server (``out[j][i]``: prompt ``i`` on server ``j``), prompt
    by prompt, the server that goes first taking turns, so that drift over the minutes of a
    run (other load, clock speed) falls on all of them alike. One warm-up each first, on
    another text: an n-gram drafter that keeps a pool across requests (ngram-mod) would know a
    measured prompt's answer. Streamed, temperature 0, cold cache, one request at a time."""
    settings = [
        BenchSettings(url=u, model=model, max_tokens=(tokens,), runs=1, warmup=0, label=u)
        for u in urls
    ]
    for one in settings:
        run_bench(one, [warmup_prompt(prompts[0])], api_key=api_key)
    out: list[list[RunResult]] = [[] for _ in urls]
    for i, prompt in enumerate(prompts):
        for k in range(len(urls)):
            j = (i + k) % len(urls)
            out[j].append(run_bench(settings[j], [prompt], api_key=api_key).runs[0])
    return out


def _counts(runs: Sequence[RunResult]) -> tuple[int | None, int | None]:
    """Drafted and accepted tokens over ``runs``: /metrics counters, else the timings."""
    drafted = accepted = 0
    seen = False
    for run in runs:
        delta = run.metrics_delta or {}
        if DRAFTED in delta:
            seen = True
            drafted += int(delta[DRAFTED])
            accepted += int(delta.get(ACCEPTED, 0))
            continue
        for q in run.requests:
            if q.draft_n is not None:
                seen = True
                drafted += q.draft_n
                accepted += q.draft_n_accepted or 0
    return (drafted, accepted) if seen else (None, None)


def _rates(runs: Sequence[RunResult]) -> tuple[float | None, ...]:
    return tuple(next((q.server_decode_tok_s for q in r.requests), None) for r in runs)


def measure_workloads(
    url: str,
    prompts: Sequence[Prompt],
    *,
    api_key: str | None = None,
    model: str | None = None,
    baseline_url: str | None = None,
    tokens: int = DEFAULT_TOKENS,
) -> list[WorkloadFigures]:
    """Each workload of ``prompts`` on ``url`` (and on ``baseline_url``), in prompt order."""
    urls = [url] if baseline_url is None else [url, baseline_url]
    measured = run_interleaved(urls, prompts, tokens, api_key=api_key, model=model)
    spec, base = measured[0], (measured[1] if baseline_url is not None else None)
    out = []
    for workload in dict.fromkeys(workload_of(p) for p in prompts):
        mine = [i for i, p in enumerate(prompts) if workload_of(p) == workload]
        drafted, accepted = _counts([spec[i] for i in mine])
        out.append(
            WorkloadFigures(
                workload=workload,
                prompts=tuple(prompts[i].name for i in mine),
                drafted=drafted,
                accepted=accepted,
                decode_tok_s=_rates([spec[i] for i in mine]),
                baseline_tok_s=_rates([base[i] for i in mine]) if base is not None else None,
            )
        )
    return out
