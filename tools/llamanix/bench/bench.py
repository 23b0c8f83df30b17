"""Benchmark a running llama-server the way that does not mislead: streamed, warmed up, repeated.

This module runs the benchmark and summarises it; the prompts are in ``prompts``, the timed
request in ``streaming``, the records and their file format in ``bench_results``. /metrics is
read before and after every run so its counters can be compared with what the requests
reported.

Defaults: two warm-ups (CUDA JIT and first-use costs),
five runs (one run lies), temperature 0 with a fixed seed, prompt caching off (a repeated
prompt would otherwise be served from the KV cache and prefill would look free), and
``ignore_eos`` so every run generates exactly the requested length.

Agent-shaped prompts (``agent:N``): per output length the first request opens a new session
(nothing cached: the cold prefill); the following runs reuse the session's prefix with a new
last turn (warm: ``timings.cache_n`` tokens come from the cache). Cold and warm requests are
summarised apart.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime

import httpx

from llamanix import __version__
from llamanix.bench.bench_results import (
    PHASES,
    BenchMeta,
    BenchResult,
    BenchSettings,
    FieldStats,
    MachineInfo,
    Phase,
    RecordedSettings,
    RequestResult,
    RunResult,
    ServerProps,
    Stats,
    Summary,
)
from llamanix.bench.prompts import Prompt, new_session
from llamanix.bench.streaming import request_body, stream_completion
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_fields import integer as as_int
from llamanix.core.json_fields import text as as_str
from llamanix.core.json_value import JsonObject
from llamanix.model.ceiling import Ceiling
from llamanix.server.client import LlamaClient
from llamanix.server.metrics import MetricsSnapshot, metrics_delta

REQUEST_TIMEOUT_S = 3600.0
# The per-request figures summarised per prompt x length.
STAT_FIELDS = (
    "ttft_s",
    "wall_s",
    "server_prefill_tok_s",
    "client_prefill_tok_s",
    "server_decode_tok_s",
    "client_decode_tok_s",
    "prompt_n",
    "predicted_n",
    "acceptance",
    "cache_n",
    "prefill_s",
    "reasoning_s",
    "decode_s",
)
# The figures summarised separately for cold and warm requests of agent prompts.
PHASE_FIELDS = (
    "cache_n",
    "prompt_n",
    "ttft_s",
    "prefill_s",
    "reasoning_s",
    "decode_s",
    "wall_s",
    "reasoning_n",
)


def parse_lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UserError(
            Problem(
                "--max-tokens",
                "max-tokens",
                f"{text!r} is not a list of lengths",
                "write e.g. 100,500,1000,2000",
            )
        )
    return values


# --- the whole benchmark -------------------------------------------------------------------


def server_props(client: LlamaClient) -> ServerProps:
    """GET /props (build, model path, slots); fails with a clear line when nothing answers."""
    url = client.url
    try:
        resp = client.props()
    except httpx.TransportError as err:
        raise UserError(
            Problem(
                url,
                "--url",
                f"cannot connect ({err.__class__.__name__}: {err})",
                "start the server or fix --url",
            )
        ) from None
    if resp.status_code in (401, 403):
        raise UserError(
            Problem(
                url,
                "--url",
                f"HTTP {resp.status_code} from /props",
                "pass --api-key-file with the server's key",
            )
        )
    if resp.status_code != 200:
        return ServerProps()
    try:
        data = resp.json()
    except ValueError:
        return ServerProps()
    if not isinstance(data, dict):
        return ServerProps()
    settings = data.get("default_generation_settings")
    return ServerProps(
        build_info=as_str(data.get("build_info")),
        model_path=as_str(data.get("model_path")),
        model_alias=as_str(data.get("model_alias")),
        total_slots=as_int(data.get("total_slots")),
        model_ftype=as_str(data.get("model_ftype")),
        n_ctx=as_int(settings.get("n_ctx")) if isinstance(settings, dict) else None,
    )


def machine_info() -> MachineInfo:
    return MachineInfo(
        hostname=platform.node(),
        system=platform.system(),
        machine=platform.machine(),
        processor=platform.processor() or None,
        cpus=os.cpu_count(),
        python=platform.python_version(),
    )


def planned_steps(settings: BenchSettings, prompts: Sequence[Prompt]) -> int:
    """How many progress steps run_bench reports (warm-ups and runs)."""
    return sum(
        settings.warmup + settings.runs * len(p.lengths(settings.max_tokens)) for p in prompts
    )


def _field_stats(requests: Sequence[RequestResult], fields: Sequence[str]) -> FieldStats:
    return {
        name: Stats.of([getattr(q, name) for q in requests if getattr(q, name) is not None])
        for name in fields
    }


def summarise(runs: Sequence[RunResult], prompt: str, max_tokens: int) -> Summary:
    mine = [r for r in runs if r.prompt == prompt and r.max_tokens == max_tokens]
    requests = [q for r in mine for q in r.requests]
    stats = _field_stats(requests, STAT_FIELDS)
    agg = Stats.of([r.aggregate_decode_tok_s for r in mine if r.aggregate_decode_tok_s is not None])
    phases: dict[Phase, FieldStats] | None = None
    if any(r.phase is not None for r in mine):
        phases = {
            phase: _field_stats(
                [q for r in mine if r.phase == phase for q in r.requests], PHASE_FIELDS
            )
            for phase in PHASES
            if any(r.phase == phase for r in mine)
        }
    return Summary(
        prompt=prompt,
        max_tokens=max_tokens,
        stats=stats,
        aggregate_decode_tok_s=agg,
        phases=phases,
    )


ProgressHook = Callable[[str], None]


def cold_load(client: LlamaClient, model: str | None) -> float | None:
    """Behind a router whose ``model`` is not loaded: the seconds a one-token request takes,
    load included; None for a plain server or a model already loaded."""
    if not model:
        return None
    try:
        listing = client.models()
    except httpx.HTTPError:
        return None
    entry = next((m for m in listing if m.get("id") == model), None)
    status = entry.get("status") if entry else None
    if not isinstance(status, dict) or status.get("value") == "loaded":
        return None  # a plain server lists no status; a loaded member has nothing to load
    body: JsonObject = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
    }
    started = time.monotonic()
    resp = client.chat(body)
    took = time.monotonic() - started
    return took if resp.status_code == 200 else None


def run_bench(
    settings: BenchSettings,
    prompts: Sequence[Prompt],
    *,
    api_key: str | None = None,
    progress: ProgressHook | None = None,
) -> BenchResult:
    """Warm up, run, and summarise every prompt x length against ``settings.url``."""
    with LlamaClient(
        settings.url,
        api_key=api_key,
        timeout_s=REQUEST_TIMEOUT_S,
        max_connections=max(4, settings.concurrency * 2),
        model=settings.model,
    ) as client:
        cold_load_s = cold_load(client, settings.model)
        props = server_props(client)
        try:
            has_metrics = client.metrics() is not None
        except httpx.HTTPError:
            has_metrics = False
        runs: list[RunResult] = []
        with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
            for prompt in prompts:
                lengths = prompt.lengths(settings.max_tokens)
                # Warm-ups absorb first-use costs (CUDA JIT, allocations) once per prompt, at the
                # shortest length: later lengths reuse the same kernels.
                # Agent prompts warm up in a session of their own, so the measured sessions
                # still start cold.
                warm_body = request_body(prompt, min(lengths), settings, new_session())
                for _ in range(settings.warmup):
                    _warm_up(client, pool, settings, warm_body)
                    if progress:
                        progress(f"{prompt.name}: warm-up")
                for length in lengths:
                    # Agent prompts: one session per length, its first run cold, the rest warm.
                    session = new_session()
                    for run in range(settings.runs):
                        body = request_body(prompt, length, settings, session, run)
                        phase: Phase | None = None
                        if prompt.agent:
                            phase = "cold" if run == 0 else "warm"
                        result = _one_run(
                            client, pool, settings, prompt.name, length, run, body, has_metrics
                        )
                        runs.append(replace(result, phase=phase))
                        if progress:
                            progress(f"{prompt.name}: {length} tokens, run {run + 1}")
    label = settings.label or props.model_alias or "bench"
    meta = BenchMeta(
        url=settings.url,
        model=settings.model or props.model_alias,
        server=props,
        machine=machine_info(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        llamanix=__version__,
        metrics=has_metrics,
        settings=RecordedSettings.of(settings, [p.name for p in prompts]),
        cold_load_s=cold_load_s,
    )
    summaries = tuple(
        summarise(runs, p.name, n) for p in prompts for n in p.lengths(settings.max_tokens)
    )
    return BenchResult(label=label, meta=meta, ceiling=None, summaries=summaries, runs=tuple(runs))


def _warm_up(
    client: LlamaClient, pool: ThreadPoolExecutor, settings: BenchSettings, body: JsonObject
) -> None:
    list(pool.map(lambda _i: stream_completion(client, body), range(settings.concurrency)))


def _one_run(
    client: LlamaClient,
    pool: ThreadPoolExecutor,
    settings: BenchSettings,
    prompt: str,
    length: int,
    run: int,
    body: JsonObject,
    has_metrics: bool,
) -> RunResult:
    before: MetricsSnapshot | None = client.metrics() if has_metrics else None
    # All requests of a run start together; the barrier keeps thread start-up out of the window.
    barrier = threading.Barrier(settings.concurrency)

    def one(_i: int) -> RequestResult:
        barrier.wait()
        return stream_completion(client, body)

    t0 = time.perf_counter()
    requests = list(pool.map(one, range(settings.concurrency)))
    wall = time.perf_counter() - t0
    after = client.metrics() if has_metrics else None
    generated = sum(q.predicted_n or 0 for q in requests)
    return RunResult(
        prompt=prompt,
        max_tokens=length,
        run=run,
        wall_s=wall,
        aggregate_decode_tok_s=generated / wall if generated and wall > 0 else None,
        requests=tuple(requests),
        metrics_delta=metrics_delta(before, after) if before and after else None,
    )


def attach_ceiling(result: BenchResult, ceiling: Ceiling) -> BenchResult:
    """The result with the roofline and each row's share of it (median server decode /
    ceiling)."""
    limit = ceiling.tok_s

    def share(summary: Summary) -> float | None:
        decode = summary.median("server_decode_tok_s") or summary.median("client_decode_tok_s")
        return decode / limit if decode and limit > 0 else None

    return replace(
        result,
        ceiling=ceiling,
        summaries=tuple(replace(s, ceiling_share=share(s)) for s in result.summaries),
    )
