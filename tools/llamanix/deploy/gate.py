"""The gate a switched instance must pass before its generation is kept.

- ``health``: GET /health answers 200 (polled until the deadline), then one chat completion.
- ``smoke``: health, plus /metrics parses as Prometheus text (when metrics are on) and, when
  speculation is configured, a completion reports ``draft_n > 0`` (the draft really drafts).
- ``bench``: health, plus a short decode measurement (``llamanix.measure.bench``, one prompt, one
  length, a warm-up and five runs) checked against ``--min-tok-s`` or against the instance's
  last successful bench (``--max-regression``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import httpx

from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.measure.bench import BenchSettings, builtin_prompts, run_bench
from llamanix.measure.client import LlamaClient, NotServing
from llamanix.measure.metrics import parse_metrics

GateKind = Literal["health", "smoke", "bench"]
GATES: tuple[GateKind, ...] = get_args(GateKind)
BENCH_MAX_TOKENS = 64
BENCH_RUNS = 5  # N >= 5 after a warm-up: fewer runs make a regression check noise
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
    baseline_tok_s: float | None = None


@dataclass
class GateResult:
    name: str
    gate: GateKind
    passed: bool
    detail: str
    tok_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "passed": self.passed,
            "detail": self.detail,
            "tok_s": self.tok_s,
            **self.extra,
        }


class GateFailed(Exception):
    def __init__(self, message: str, tok_s: float | None = None) -> None:
        super().__init__(message)
        self.tok_s = tok_s


def chat(client: LlamaClient, target: GateTarget, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if target.alias:
        body["model"] = target.alias
    resp = client.chat(body)
    if resp.status_code != 200:
        raise GateFailed(f"chat completion: HTTP {resp.status_code}: {resp.text[:200]}")
    data: Any = resp.json()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or "message" not in choices[0]:
        raise GateFailed(f"chat completion without a message: {str(data)[:200]}")
    return dict(data)


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
        data = chat(client, target, 64)
        draft_n = (data.get("timings") or {}).get("draft_n") or 0
        if draft_n <= 0:
            raise GateFailed(
                "speculation is configured but the server drafted nothing (timings.draft_n = 0)"
            )
        notes.append(f"draft_n {draft_n}")
    return ", ".join(notes)


def _bench(target: GateTarget, limits: Thresholds) -> tuple[float, str]:
    prompt = builtin_prompts()[0]
    settings = BenchSettings(
        url=target.url,
        model=target.alias,
        max_tokens=(BENCH_MAX_TOKENS,),
        runs=BENCH_RUNS,
        warmup=1,
        label=f"gate:{target.name}",
    )
    try:
        result = run_bench(settings, [prompt], api_key=target.api_key)
    except (UserError, ExternalCommandError, httpx.HTTPError) as err:
        raise GateFailed(f"bench: {err}") from None
    summary = result.summaries[0]
    tok_s = summary.median("server_decode_tok_s") or summary.median("client_decode_tok_s")
    if tok_s is None:
        raise GateFailed("bench: the server reported no decode rate")
    note = f"decode {tok_s:.1f} tok/s (median of {BENCH_RUNS}, {BENCH_MAX_TOKENS} tokens)"
    if limits.min_tok_s is not None and tok_s < limits.min_tok_s:
        raise GateFailed(f"{note} is below --min-tok-s {limits.min_tok_s:g}", tok_s)
    if limits.max_regression_pct is not None and limits.baseline_tok_s:
        drop = (limits.baseline_tok_s - tok_s) / limits.baseline_tok_s * 100
        if drop > limits.max_regression_pct:
            raise GateFailed(
                f"{note} is {drop:.1f}% below the last good bench "
                f"({limits.baseline_tok_s:.1f} tok/s; "
                f"--max-regression {limits.max_regression_pct:g})",
                tok_s,
            )
        note += f", {-drop:+.1f}% against the last good bench"
    elif limits.max_regression_pct is not None:
        note += ", no earlier bench to compare with (this one becomes the baseline)"
    return tok_s, note


def run_gate(
    gate: GateKind, target: GateTarget, timeout_s: float, limits: Thresholds | None = None
) -> GateResult:
    """Run one gate against one instance; never raises for a failing server."""
    limits = limits or Thresholds()
    notes: list[str] = []
    tok_s: float | None = None
    try:
        with LlamaClient(
            target.url, api_key=target.api_key, timeout_s=max(timeout_s, 30.0), connect_s=5.0
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
            tok_s, note = _bench(target, limits)
            notes.append(note)
    except GateFailed as err:
        return GateResult(target.name, gate, False, str(err), err.tok_s)
    except httpx.HTTPError as err:
        return GateResult(target.name, gate, False, f"{err.__class__.__name__}: {err}", tok_s)
    return GateResult(target.name, gate, True, "; ".join(notes), tok_s)
