"""The gate a switched instance must pass before its generation is kept.

- ``health``: GET /health answers 200 (polled until the deadline), then one chat completion.
- ``smoke``: health, plus /metrics parses as Prometheus text (when metrics are on) and, when
  speculation is configured, a completion reports ``draft_n > 0`` (the draft really drafts).
- ``bench``: health, plus a short decode measurement (``llamanix.bench.bench``, 64 tokens, a
  warm-up and five runs, each run's decode rate kept). The prompt is the built-in ``fibonacci``
  chat unless ``--gate-prompts`` names others (speculation pays on some text and costs on
  other text: gate on the workload the instance serves; a base model's raw text goes to
  /completion). Several prompts are taken in turn, one per run, baseline and candidate alike
  from the first: an n-gram drafter that keeps what it has seen across requests (ngram-mod)
  knows a repeated prompt's answer, so a prompt measured once says what a new request gets.
  ``--min-tok-s`` checks the median against a floor. ``--max-regression`` compares the runs
  with a baseline's runs through a bootstrap interval of the ratio of medians
  (``llamanix.bench.interval``): the whole interval below the threshold is a regression,
  its lower end at or above it a pass; in between, three more runs at a time until
  ``--max-runs``, then ``inconclusive``, resolved by ``--inconclusive keep|rollback``.

The baseline is measured fresh, the same way, on the instance still serving just before the
switch (``measure_baseline``), so both sides see the same machine at nearly the same time; only
when that instance does not answer does the last good bench's stored runs stand in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from llamanix.bench.interval import MIN_SAMPLES, Decision, decide, ratio_interval, threshold_of
from llamanix.bench.prompts import Prompt, load_prompts, warmup_prompt
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.core.json_value import JsonObject, JsonValue
from llamanix.external.clock import now
from llamanix.server.metrics import parse_metrics
from llamanix.state.gate_records import (
    BENCH_MAX_TOKENS,
    DEFAULT_GATE_PROMPTS,
    Action,
    Baseline,
    BenchVerdict,
    GateKind,
    GateResult,
)

if TYPE_CHECKING:
    from llamanix.server.client import LlamaClient

BENCH_RUNS = 5  # N >= 5 after a warm-up: fewer runs make a regression check noise
BENCH_BATCH = 3  # runs added while the interval straddles the threshold
# The baseline cannot take more runs once the switch has replaced it, and with five runs a side
# its spread alone keeps the interval wider than a 5% threshold on a busy CPU: twice as many.
BASELINE_RUNS = 2 * BENCH_RUNS
DEFAULT_MAX_RUNS = 15
POLL_S = 0.2


@dataclass(frozen=True)
class GateTarget:
    """One instance as the gate sees it."""

    name: str
    url: str
    alias: str | None = None
    api_key: str | None = None
    speculative: bool = False
    metrics: bool = True


@dataclass(frozen=True)
class Thresholds:
    min_tok_s: float | None = None
    max_regression_pct: float | None = None
    baseline: Baseline | None = None
    max_runs: int = DEFAULT_MAX_RUNS
    inconclusive: Action = "keep"
    prompts: GatePrompts | None = None  # None: the built-in fibonacci chat


class GateFailed(Exception):
    def __init__(self, message: str, tok_s: float | None = None) -> None:
        super().__init__(message)
        self.tok_s = tok_s


def chat(client: LlamaClient, target: GateTarget, max_tokens: int) -> JsonObject:
    body: JsonObject = {
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if target.alias:
        body["model"] = target.alias
    resp = client.chat(body)
    if resp.status_code != 200:
        raise GateFailed(f"chat completion: HTTP {resp.status_code}: {resp.text[:200]}")
    data: JsonValue = resp.json()
    choices = data.get("choices") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or not isinstance(choices, list)
        or not choices
        or not isinstance(choices[0], dict)
        or "message" not in choices[0]
    ):
        raise GateFailed(f"chat completion without a message: {str(data)[:200]}")
    return data


def _smoke(client: LlamaClient, target: GateTarget) -> str:
    notes = []
    if target.metrics:
        resp = client.metrics_response()
        if resp.status_code != 200:
            raise GateFailed(f"/metrics: HTTP {resp.status_code}")
        snapshot = parse_metrics(resp.text)
        if snapshot.get("prompt_tokens_total") is None:
            raise GateFailed("/metrics has no llamacpp:prompt_tokens_total")
        notes.append("/metrics ok")
    if target.speculative:
        timings = chat(client, target, 64).get("timings")
        draft_n = (timings.get("draft_n") if isinstance(timings, dict) else None) or 0
        if not isinstance(draft_n, int | float):
            raise GateFailed(f"timings.draft_n is not a number: {str(draft_n)[:200]}")
        if draft_n <= 0:
            raise GateFailed(
                "speculation is configured but the server drafted nothing (timings.draft_n = 0)"
            )
        notes.append(f"draft_n {draft_n}")
    return ", ".join(notes)


@dataclass(frozen=True)
class GatePrompts:
    """What the bench gate measures: the prompts ``spec`` names, one per run, in turn."""

    spec: str
    prompts: tuple[Prompt, ...]

    @staticmethod
    def load(spec: str = DEFAULT_GATE_PROMPTS) -> GatePrompts:
        """The prompts as bench's --prompts names them (one line when there are none)."""
        return GatePrompts(spec, tuple(load_prompts(spec)))

    def in_turn(self, start: int, runs: int) -> list[Prompt]:
        return [self.prompts[(start + k) % len(self.prompts)] for k in range(runs)]


@dataclass(frozen=True)
class BenchRuns:
    """What bench runs measured: each run's decode rate, and the draft tokens of all of them."""

    rates: list[float]
    drafted: int = 0
    accepted: int = 0

    def __add__(self, more: BenchRuns) -> BenchRuns:
        return BenchRuns(
            self.rates + more.rates, self.drafted + more.drafted, self.accepted + more.accepted
        )

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def bench_samples(
    target: GateTarget, runs: int, warmup: int, prompts: GatePrompts, start: int = 0
) -> BenchRuns:
    """Decode tok/s of each of ``runs`` runs (BENCH_MAX_TOKENS tokens), run ``k`` on prompt
    ``start + k`` of ``prompts`` (in turn), after ``warmup`` warm-ups on another text; and
    their drafted and accepted tokens."""
    # httpx (here and in the two functions below) loads only when a gate talks to a server:
    # every deploy command imports this module, and httpx alone adds a tenth of a second.
    import httpx

    from llamanix.bench.bench import run_bench  # httpx

    # With the bench run, not above: its settings' module brings the GGUF reader and the
    # ceiling tables, some 40 ms (2-core machine) that a deploy command without a bench gate
    # would pay for nothing.
    from llamanix.bench.bench_results import BenchSettings

    settings = BenchSettings(
        url=target.url,
        model=target.alias,
        max_tokens=(BENCH_MAX_TOKENS,),
        runs=1,
        warmup=0,
        label=f"gate:{target.name}",
    )
    try:
        for _ in range(warmup):
            run_bench(settings, [warmup_prompt(prompts.prompts[0])], api_key=target.api_key)
        result = run_bench(settings, prompts.in_turn(start, runs), api_key=target.api_key)
    except (UserError, ExternalCommandError, httpx.HTTPError) as err:
        raise GateFailed(f"bench: {err}") from None
    requests = [q for run in result.runs for q in run.requests]
    # The server's own rate where it reports one (it excludes HTTP and streaming).
    return BenchRuns(
        [rate for q in requests if (rate := q.server_decode_tok_s or q.client_decode_tok_s)],
        sum(q.draft_n or 0 for q in requests),
        sum(q.draft_n_accepted or 0 for q in requests),
    )


def measure_baseline(target: GateTarget, prompts: GatePrompts | None = None) -> Baseline | None:
    """The instance as it serves now, measured like the candidate (same prompt, length and
    warm-up; BASELINE_RUNS runs); None when it does not answer (nothing installed, or down)."""
    import httpx  # when a gate runs (see bench_samples)

    from llamanix.server.client import LlamaClient  # httpx

    try:
        with LlamaClient(target.url, api_key=target.api_key, timeout_s=30.0, connect_s=5.0) as c:
            if c.health().status_code != 200:
                return None
        samples = bench_samples(target, BASELINE_RUNS, 1, prompts or GatePrompts.load()).rates
    except (GateFailed, httpx.HTTPError):
        return None
    if len(samples) < MIN_SAMPLES:
        return None
    return Baseline(tuple(samples), "fresh", date=now())


def resolve(decision: Decision, inconclusive: Action) -> Action:
    """What a decision does to the generation; ``inconclusive`` as --inconclusive says."""
    if decision == "inconclusive":
        return inconclusive
    return "keep" if decision == "pass" else "rollback"


def _bench(target: GateTarget, limits: Thresholds) -> tuple[BenchVerdict, float | None]:
    """The verdict, and the candidate's draft acceptance over its runs (None without
    speculation): what the generation is kept at."""
    prompts = limits.prompts or GatePrompts.load()
    drafts = bench_samples(target, BENCH_RUNS, 1, prompts)
    samples = list(drafts.rates)
    runs = BENCH_RUNS
    if len(samples) < MIN_SAMPLES:
        raise GateFailed(
            f"bench: {len(samples)} of {runs} runs reported a decode rate "
            f"(need {MIN_SAMPLES}: is max_tokens honoured?)"
        )
    median = statistics.median(samples)
    measured = (
        f"decode {median:.1f} tok/s (median of {len(samples)} runs, {BENCH_MAX_TOKENS} tokens)"
    )
    if limits.min_tok_s is not None:
        if median < limits.min_tok_s:
            note = f"{measured} is below --min-tok-s {limits.min_tok_s:g}"
            verdict = BenchVerdict(tuple(samples), "rollback", note, prompts=prompts.spec)
            return verdict, drafts.acceptance
        verdict = BenchVerdict(tuple(samples), "keep", measured, prompts=prompts.spec)
        return verdict, drafts.acceptance
    pct = limits.max_regression_pct
    baseline = limits.baseline
    if pct is None or baseline is None:
        if pct is not None:
            measured += "; no baseline to compare with (these runs become the baseline)"
        verdict = BenchVerdict(
            tuple(samples), "keep", measured, max_regression_pct=pct, prompts=prompts.spec
        )
        return verdict, drafts.acceptance
    threshold = threshold_of(pct)
    while True:
        interval = ratio_interval(baseline.samples, samples)
        decision = decide(interval, threshold)
        if decision != "inconclusive" or runs >= limits.max_runs:
            break
        more = min(BENCH_BATCH, limits.max_runs - runs)
        extra = bench_samples(target, more, 0, prompts, start=runs)
        samples += extra.rates
        drafts += extra
        runs += more
    action = resolve(decision, limits.inconclusive)
    note = (
        f"decode {statistics.median(samples):.1f} tok/s (median of {len(samples)} runs) against "
        f"{statistics.median(baseline.samples):.1f} ({baseline.source} baseline, "
        f"{len(baseline.samples)} runs): ratio {interval.ratio:.3f}, {interval.confidence:.0%} "
        f"interval [{interval.low:.3f}, {interval.high:.3f}], threshold {threshold:.3f} "
        f"(--max-regression {pct:g}): {decision}"
    )
    if decision == "inconclusive":
        resolved = "kept" if action == "keep" else "rolled back"
        note += f" after {runs} runs, {resolved} (--inconclusive {limits.inconclusive})"
    verdict = BenchVerdict(
        samples=tuple(samples),
        action=action,
        note=note,
        decision=decision,
        interval=interval,
        threshold=threshold,
        max_regression_pct=pct,
        baseline=baseline,
        prompts=prompts.spec,
    )
    return verdict, drafts.acceptance


def confirm_regression(verdict: BenchVerdict, again: Baseline, on_drift: Action) -> BenchVerdict:
    """A, B, A: ``verdict`` found a regression of the candidate (B) against the baseline (A);
    ``again`` is the baseline measured again on the previous generation, restored after the
    rollback. Still a regression against it: confirmed. Otherwise the machine moved between
    the measurements (another load, a thermal state), not the change: the verdict is
    inconclusive, with how far the baseline moved, and ``on_drift`` says whether the switch
    stands (``keep``) or stays rolled back."""
    threshold = verdict.threshold if verdict.threshold is not None else threshold_of(0.0)
    interval = ratio_interval(again.samples, verdict.samples)
    first = statistics.median(verdict.baseline.samples) if verdict.baseline else None
    second = statistics.median(again.samples)
    moved = (second / first - 1) * 100 if first else 0.0
    measured = (
        f"the baseline measured again after the rollback: decode {second:.1f} tok/s "
        f"({len(again.samples)} runs; first {first or 0:.1f}), the candidate's "
        f"{verdict.median:.1f} against it: ratio {interval.ratio:.3f}, {interval.confidence:.0%} "
        f"interval [{interval.low:.3f}, {interval.high:.3f}]"
    )
    found = replace(verdict, baseline_after=again, confirmation=interval, baseline_moved_pct=moved)
    if decide(interval, threshold) == "regression":
        return replace(found, note=f"{verdict.note}; confirmed: {measured}")
    resolved = "kept" if on_drift == "keep" else "rolled back"
    note = (
        f"inconclusive: the baseline moved by {moved:+.1f}% ({measured}); {resolved} "
        f"(--on-drift {on_drift})"
    )
    return replace(found, decision="inconclusive", action=on_drift, note=note)


def run_gate(
    gate: GateKind, target: GateTarget, timeout_s: float, limits: Thresholds | None = None
) -> GateResult:
    """Run one gate against one instance; never raises for a failing server."""
    import httpx  # when a gate runs (see bench_samples)

    from llamanix.server.client import LlamaClient, NotServing  # httpx

    limits = limits or Thresholds()
    notes: list[str] = []
    tok_s: float | None = None
    verdict: BenchVerdict | None = None
    acceptance: float | None = None
    try:
        with LlamaClient(
            target.url,
            api_key=target.api_key,
            timeout_s=max(timeout_s, 30.0),
            connect_s=5.0,
            model=target.alias,
        ) as client:
            try:
                client.wait_healthy(timeout_s)
            except NotServing as err:
                raise GateFailed(str(err)) from None
            chat(client, target, 8)
            notes.append("health ok, chat ok")
            if gate == "smoke":
                extra = _smoke(client, target)
                if extra:
                    notes.append(extra)
        if gate == "bench":
            verdict, acceptance = _bench(target, limits)
            tok_s = verdict.median
            if verdict.action == "rollback":
                return GateResult(target.name, gate, False, verdict.note, tok_s, bench=verdict)
            notes.append(verdict.note)
    except GateFailed as err:
        return GateResult(target.name, gate, False, str(err), err.tok_s)
    except httpx.HTTPError as err:
        return GateResult(target.name, gate, False, f"{err.__class__.__name__}: {err}", tok_s)
    # The acceptance the generation is kept at: the exporter's alert compares the serving
    # acceptance with it.
    return GateResult(
        target.name, gate, True, "; ".join(notes), tok_s, bench=verdict, acceptance=acceptance
    )
