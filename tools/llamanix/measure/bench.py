"""Benchmark a running llama-server the way the seeds learned to: streamed, warmed up, repeated.

Every request streams, so time to first token is read off the client's clock instead of being
guessed. Each request keeps both views of decode speed: the server's own ``timings`` (what
llama-server measured between the first and the last generated token) and the client's clock
over the same span, ``(predicted_n - 1) / (t_last - t_first)``. Speculation is checked on every
request (``draft_n``, ``draft_n_accepted``), and /metrics is read before and after every run so
its counters can be compared with what the requests reported.

Defaults follow the lessons of the field reports: two warm-ups (CUDA JIT and first-use costs),
five runs (one run lies), temperature 0 with a fixed seed, prompt caching off (a repeated
prompt would otherwise be served from the KV cache and prefill would look free), and
``ignore_eos`` so every run generates exactly the requested length.

Agent-shaped prompts (``agent:N``) measure what dominates an agent's wall clock: a long shared
prefix (system prompt, tool definitions, history) that the server can reuse from its KV cache,
and a last turn that changes every request. Per output length the first request opens a new
session (a random marker at the very start makes the prefix unique, so nothing is cached: the
cold prefill); the following runs reuse the session's prefix with a new last turn (warm:
``timings.cache_n`` tokens come from the cache). Every request's wall clock is split into
prefill (time to the first streamed token), reasoning (up to the last ``reasoning_content`` or
``<think>`` token, zero when the model does not think) and decode (the rest).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import httpx

from llamanix import __version__
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.measure.client import LlamaClient, error_message
from llamanix.measure.metrics import MetricsSnapshot, metrics_delta

DEFAULT_MAX_TOKENS = (100, 500, 1000, 2000)
DEFAULT_RUNS = 5
DEFAULT_WARMUP = 2
DEFAULT_SEED = 42
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
# Old results (before agent prompts) lack the new fields and still load: the format only grows.
RESULT_FORMAT = "llamanix-bench/1"
Phase = Literal["cold", "warm"]
AGENT_MIN_TOKENS = 512  # the fixed part alone is about 420
AGENT_MAX_TOKENS = 1_000_000


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: chat messages, optional tools, optional fixed length."""

    name: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None  # fixed output length (the one-token probe); None: --max-tokens
    # `llamanix lossless` exits 1 when two servers answer this prompt differently; bench ignores it.
    must_match: bool = False
    # Agent-shaped: ``messages`` are the shared prefix; each request gets a session marker in
    # front and a new last turn behind (see agent_messages).
    agent: bool = False

    def lengths(self, requested: Sequence[int]) -> list[int]:
        return [self.max_tokens] if self.max_tokens is not None else list(requested)


def _prompt_problem(source: str, where: str, message: str, fix: str) -> UserError:
    return UserError(Problem(source, where, message, fix))


def parse_prompts(data: Any, source: str) -> list[Prompt]:
    """Prompts from JSON: a list (or ``{"prompts": [...]}``) of
    ``{"name", "messages" | "prompt", "tools"?, "max_tokens"?, "must_match"?}``."""
    items = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise _prompt_problem(
            source,
            "prompts",
            "expected a non-empty list of prompts",
            'write [{"name": "x", "prompt": "..."}]',
        )
    out: list[Prompt] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"prompts[{i}]"
        if not isinstance(item, dict):
            raise _prompt_problem(
                source, where, "must be an object", 'write {"name": ..., "prompt": ...}'
            )
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise _prompt_problem(
                source, f"{where}.name", "missing or not a string", "give every prompt a name"
            )
        if name in seen:
            raise _prompt_problem(
                source, f"{where}.name", f"duplicate name {name!r}", "names must be unique"
            )
        seen.add(name)
        agent = item.get("agent", False)
        if isinstance(agent, int) and not isinstance(agent, bool):
            if not AGENT_MIN_TOKENS <= agent <= AGENT_MAX_TOKENS:
                raise _prompt_problem(
                    source,
                    f"{where}.agent",
                    f"{agent} is not a prefix length in tokens",
                    f"give {AGENT_MIN_TOKENS} to {AGENT_MAX_TOKENS}, or true with your messages",
                )
            out.append(agent_prompt(agent, name))
            continue
        if not isinstance(agent, bool):
            raise _prompt_problem(
                source,
                f"{where}.agent",
                "must be true (messages are the shared prefix) or a prefix length in tokens",
                'write "agent": true or "agent": 8000',
            )
        messages = item.get("messages")
        if messages is None and isinstance(item.get("prompt"), str):
            messages = [{"role": "user", "content": item["prompt"]}]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m for m in messages)
        ):
            raise _prompt_problem(
                source,
                f"{where}.messages",
                "needs 'prompt' (a string) or 'messages' (chat messages)",
                'write "prompt": "..." or "messages": [{"role": "user", ...}]',
            )
        tools = item.get("tools")
        if tools is not None and (
            not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
        ):
            raise _prompt_problem(
                source,
                f"{where}.tools",
                "must be a list of tool objects",
                "use the OpenAI tools format",
            )
        max_tokens = item.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise _prompt_problem(
                source,
                f"{where}.max_tokens",
                "must be a positive integer",
                "remove it to use --max-tokens",
            )
        must_match = item.get("must_match", False)
        if not isinstance(must_match, bool):
            raise _prompt_problem(
                source,
                f"{where}.must_match",
                f"must be true or false, not {must_match!r}",
                'write "must_match": true',
            )
        out.append(
            Prompt(
                name=name,
                messages=tuple(messages),
                tools=tuple(tools) if tools is not None else None,
                max_tokens=max_tokens,
                must_match=must_match,
                agent=agent,
            )
        )
    return out


# --- agent-shaped prompts --------------------------------------------------------------------

# Common short English words: about one token each in the llama, GPT-2 and Qwen vocabularies,
# so N words of filler come to roughly N tokens (the server's prompt_n is the exact count).
_FILLER_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "be",
    "are",
    "was",
    "or",
    "an",
    "not",
    "but",
    "all",
    "can",
    "has",
    "have",
    "will",
    "one",
    "new",
    "file",
    "test",
    "code",
    "line",
    "read",
    "write",
    "call",
    "value",
    "list",
    "name",
    "type",
    "data",
    "run",
    "set",
    "get",
    "add",
    "make",
    "use",
    "error",
    "path",
    "user",
    "time",
    "model",
    "server",
    "config",
    "build",
    "check",
    "state",
    "return",
]
_AGENT_SYSTEM = (
    "You are a coding agent working in a software repository. Use the tools to read and "
    "change files and to run commands. Keep answers short and exact.\n\nTools:\n"
)
_AGENT_TOOLS = (
    ("read_file", "Read a file of the repository.", "path"),
    ("write_file", "Replace a file of the repository.", "path"),
    ("run_command", "Run a shell command in the repository and return its output.", "command"),
    ("search", "Search the repository for a regular expression.", "pattern"),
    ("list_dir", "List the files of a directory.", "path"),
)
_HISTORY_PAIRS = 4
_AGENT_FIXED_TOKENS = 420


def _filler(rng: random.Random, words: int) -> str:
    out: list[str] = []
    for i in range(words):
        out.append(rng.choice(_FILLER_WORDS))
        if i % 12 == 11:
            out.append(".\n" if i % 48 == 47 else ".")
    return " ".join(out).replace(" .", ".")


def agent_prompt(prefix_tokens: int, name: str | None = None) -> Prompt:
    """An agent-shaped prompt of about ``prefix_tokens`` shared tokens: a system prompt with
    tool definitions, then a history of tool calls and their output. Same N, same text."""
    rng = random.Random(f"llamanix-agent:{prefix_tokens}")
    tools = "".join(
        json.dumps(
            {
                "name": tool,
                "description": what,
                "parameters": {"type": "object", "properties": {arg: {"type": "string"}}},
            }
        )
        + "\n"
        for tool, what, arg in _AGENT_TOOLS
    )
    # Measured with the llama SentencePiece vocabulary: the fixed text (instructions, tool
    # definitions, chat template, history requests) comes to about 420 tokens and each filler
    # word to 1.1 (the full stops); other vocabularies land within a few percent.
    budget = max(int((prefix_tokens - _AGENT_FIXED_TOKENS) / 1.1), _HISTORY_PAIRS * 16)
    system_words = budget // 4
    # Each history pair: a user request (about 12 tokens with the template) and the output.
    output_words = (budget - system_words) // _HISTORY_PAIRS - 12
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _AGENT_SYSTEM + tools + "\n" + _filler(rng, system_words)}
    ]
    for turn in range(_HISTORY_PAIRS):
        messages.append({"role": "user", "content": f"Read src/module_{turn}.py and check it."})
        messages.append({"role": "assistant", "content": _filler(rng, output_words)})
    return Prompt(
        name=name or f"agent-{prefix_tokens}",
        messages=tuple(messages),
        agent=True,
    )


def new_session() -> str:
    """A marker no earlier request can have cached: random, not seeded, so that a second bench
    against the same server still starts cold."""
    return secrets.token_hex(8)


def agent_messages(prompt: Prompt, session: str, turn: int) -> list[dict[str, Any]]:
    """The shared prefix behind a session marker, then a last turn that differs per request."""
    messages = [dict(m) for m in prompt.messages]
    marker = f"[session {session}]\n"
    first = messages[0]
    if first.get("role") == "system" and isinstance(first.get("content"), str):
        first["content"] = marker + first["content"]
    else:
        messages.insert(0, {"role": "system", "content": marker.strip()})
    messages.append(
        {
            "role": "user",
            "content": f"Turn {turn}: run the tests again and say which of them fail and why.",
        }
    )
    return messages


def builtin_prompts() -> list[Prompt]:
    text = resources.files("llamanix").joinpath("data/prompts.json").read_text()
    return parse_prompts(json.loads(text), "llamanix/data/prompts.json")


def load_prompts(spec: str) -> list[Prompt]:
    """``builtin``, ``builtin:NAME[,NAME]``, ``agent:N`` or a JSON file."""
    if spec.startswith("agent:"):
        text = spec.split(":", 1)[1]
        n = int(text) if text.isdigit() else 0
        if not AGENT_MIN_TOKENS <= n <= AGENT_MAX_TOKENS:
            raise UserError(
                Problem(
                    "--prompts",
                    spec,
                    f"{text!r} is not a shared-prefix length in tokens",
                    f"write agent:N with N from {AGENT_MIN_TOKENS} to {AGENT_MAX_TOKENS}, "
                    "e.g. agent:8000",
                )
            )
        return [agent_prompt(n)]
    if spec == "builtin" or spec.startswith("builtin:"):
        prompts = builtin_prompts()
        if spec == "builtin":
            return prompts
        wanted = [w for w in spec.split(":", 1)[1].split(",") if w]
        by_name = {p.name: p for p in prompts}
        unknown = [w for w in wanted if w not in by_name]
        if unknown or not wanted:
            raise UserError(
                Problem(
                    "--prompts",
                    "builtin",
                    f"unknown built-in prompt(s) {unknown}",
                    f"choose from {', '.join(by_name)}",
                )
            )
        return [by_name[w] for w in wanted]
    data = _read_json(
        spec, "--prompts", "give a JSON prompts file or 'builtin'", "fix the JSON syntax"
    )
    return parse_prompts(data, spec)


def _read_json(source: str, field: str, missing_fix: str, syntax_fix: str) -> Any:
    """A user-named JSON file, or one UserError line naming it as the user wrote it."""
    try:
        return json.loads(Path(source).read_text())
    except FileNotFoundError:
        raise UserError(Problem(source, field, "no such file", missing_fix)) from None
    except json.JSONDecodeError as err:
        raise UserError(
            Problem(source, field, f"not JSON ({err.msg} at line {err.lineno})", syntax_fix)
        ) from None


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


@dataclass(frozen=True)
class BenchSettings:
    url: str
    model: str | None = None
    max_tokens: tuple[int, ...] = DEFAULT_MAX_TOKENS
    runs: int = DEFAULT_RUNS
    warmup: int = DEFAULT_WARMUP
    concurrency: int = 1
    temperature: float = 0.0
    seed: int = DEFAULT_SEED
    ignore_eos: bool = True
    cache_prompt: bool = False
    label: str | None = None


@dataclass
class RequestResult:
    """One streamed completion, both the server's and the client's view of it."""

    wall_s: float
    ttft_s: float | None
    prompt_n: int | None
    cache_n: int | None
    predicted_n: int | None
    server_prefill_tok_s: float | None
    server_decode_tok_s: float | None
    server_prompt_ms: float | None
    server_predicted_ms: float | None
    client_prefill_tok_s: float | None
    client_decode_tok_s: float | None
    draft_n: int | None
    draft_n_accepted: int | None
    acceptance: float | None
    finish_reason: str | None
    chunks: int
    # The wall clock split (added with agent prompts; None in older results): prefill is the
    # time to the first streamed token, reasoning runs to the last thinking token, decode is
    # the rest, so the three add up to wall_s.
    prefill_s: float | None = None
    reasoning_s: float | None = None
    decode_s: float | None = None
    reasoning_n: int | None = None  # streamed chunks of reasoning_content or <think> text


@dataclass
class RunResult:
    prompt: str
    max_tokens: int
    run: int
    wall_s: float
    aggregate_decode_tok_s: float | None
    requests: list[RequestResult]
    metrics_delta: dict[str, float] | None = None
    phase: Phase | None = None  # agent prompts: cold (new session) or warm (prefix cached)


@dataclass(frozen=True)
class Stats:
    min: float
    median: float
    max: float
    stdev: float | None
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> Stats | None:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return None
        return Stats(
            min=min(vals),
            median=statistics.median(vals),
            max=max(vals),
            stdev=statistics.stdev(vals) if len(vals) > 1 else None,
            n=len(vals),
        )

    def overlaps(self, other: Stats) -> bool:
        return self.min <= other.max and other.min <= self.max


@dataclass
class Summary:
    prompt: str
    max_tokens: int
    stats: dict[str, Stats | None]
    aggregate_decode_tok_s: Stats | None
    ceiling_share: float | None = None
    # Agent prompts: PHASE_FIELDS summarised for "cold" and "warm" requests apart.
    phases: dict[str, dict[str, Stats | None]] | None = None

    def median(self, name: str) -> float | None:
        st = self.stats.get(name)
        return st.median if st is not None else None


@dataclass
class BenchResult:
    """Everything one ``llamanix bench`` produced: what --json writes and compare reads."""

    label: str
    meta: dict[str, Any]
    runs: list[RunResult]
    summaries: list[Summary]
    ceiling: dict[str, Any] | None = None
    format: str = RESULT_FORMAT

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "label": self.label,
            "meta": self.meta,
            "ceiling": self.ceiling,
            "summaries": [asdict(s) for s in self.summaries],
            "runs": [asdict(r) for r in self.runs],
        }


def _stats_from_json(data: Any) -> Stats | None:
    if data is None:
        return None
    return Stats(
        min=float(data["min"]),
        median=float(data["median"]),
        max=float(data["max"]),
        stdev=None if data.get("stdev") is None else float(data["stdev"]),
        n=int(data["n"]),
    )


def _phases_from_json(data: Any) -> dict[str, dict[str, Stats | None]] | None:
    if data is None:
        return None
    return {
        str(phase): {k: _stats_from_json(v) for k, v in stats.items()}
        for phase, stats in data.items()
    }


def _phase_from_json(value: Any) -> Phase | None:
    if value is None:
        return None
    if value == "cold":
        return "cold"
    if value == "warm":
        return "warm"
    raise ValueError(f"unknown phase {value!r}")


def load_result(path: Path) -> BenchResult:
    """Read a file ``bench --json`` wrote."""
    source = str(path)
    fix = "give a file written by bench --json"
    data = _read_json(source, "", fix, fix)
    if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT:
        raise UserError(
            Problem(
                source,
                "format",
                f"not a {RESULT_FORMAT} result",
                "give a file written by llamanix bench --json",
            )
        )
    try:
        summaries = [
            Summary(
                prompt=s["prompt"],
                max_tokens=int(s["max_tokens"]),
                stats={k: _stats_from_json(v) for k, v in s["stats"].items()},
                aggregate_decode_tok_s=_stats_from_json(s.get("aggregate_decode_tok_s")),
                ceiling_share=s.get("ceiling_share"),
                phases=_phases_from_json(s.get("phases")),
            )
            for s in data["summaries"]
        ]
        runs = [
            RunResult(
                prompt=r["prompt"],
                max_tokens=int(r["max_tokens"]),
                run=int(r["run"]),
                wall_s=float(r["wall_s"]),
                aggregate_decode_tok_s=r["aggregate_decode_tok_s"],
                requests=[RequestResult(**q) for q in r["requests"]],
                metrics_delta=r.get("metrics_delta"),
                phase=_phase_from_json(r.get("phase")),
            )
            for r in data["runs"]
        ]
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            Problem(
                source,
                "summaries",
                f"malformed result ({err})",
                "give a file written by llamanix bench --json",
            )
        ) from None
    return BenchResult(
        label=str(data.get("label")),
        meta=dict(data.get("meta") or {}),
        runs=runs,
        summaries=summaries,
        ceiling=data.get("ceiling"),
    )


# --- one request ---------------------------------------------------------------------------


def request_body(
    prompt: Prompt,
    max_tokens: int,
    settings: BenchSettings,
    session: str | None = None,
    turn: int = 0,
) -> dict[str, Any]:
    """The streamed chat request; agent prompts get ``session``'s prefix and a new last turn."""
    if prompt.agent:
        messages = agent_messages(prompt, session or new_session(), turn)
    else:
        messages = list(prompt.messages)
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": settings.temperature,
        "seed": settings.seed,
        # Agent prompts measure prefix reuse, so they always ask for it; cold requests are made
        # cold by a new session marker, not by turning the cache off.
        "cache_prompt": settings.cache_prompt or prompt.agent,
    }
    if settings.ignore_eos:
        body["ignore_eos"] = True
    if settings.model:
        body["model"] = settings.model
    if prompt.tools:
        body["tools"] = list(prompt.tools)
    return body


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event


def _http_error(url: str, status: int, text: str) -> Exception:
    message = error_message(text)
    if status in (400, 401, 403, 404):
        fix = {
            401: "pass --api-key-file",
            403: "pass --api-key-file",
            404: "check --url and --model",
        }.get(status, "check --model and the prompts")
        return UserError(Problem(url, "request", f"HTTP {status}: {message}", fix))
    return ExternalCommandError(f"{url}: HTTP {status}: {message}")


def stream_completion(client: LlamaClient, body: dict[str, Any]) -> RequestResult:
    """POST one streaming chat completion and time it."""
    url = client.url
    t0 = time.perf_counter()
    t_first: float | None = None
    t_last: float | None = None
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    finish: str | None = None
    chunks = 0
    thinking = ThinkingClock()
    with client.stream_chat(body) as resp:
        if resp.status_code != 200:
            raise _http_error(url, resp.status_code, resp.read().decode(errors="replace"))
        for event in _sse_events(resp.iter_lines()):
            now = time.perf_counter()
            if "error" in event:
                raise ExternalCommandError(f"{url}: stream error: {event['error']}")
            choices = event.get("choices") or []
            if choices:
                chunks += 1
                # llama-server sends the first chunk (the assistant role) with the first token.
                if t_first is None:
                    t_first = now
                t_last = now
                delta = choices[0].get("delta")
                if isinstance(delta, dict):
                    thinking.see(delta, now)
                reason = choices[0].get("finish_reason")
                if reason:
                    finish = str(reason)
            if isinstance(event.get("timings"), dict):
                timings = event["timings"]
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
    t_end = time.perf_counter()

    prompt_n = _int(timings.get("prompt_n"))
    if prompt_n is None:
        prompt_n = _int(usage.get("prompt_tokens"))
    predicted_n = _int(timings.get("predicted_n"))
    if predicted_n is None:
        predicted_n = _int(usage.get("completion_tokens"))
    ttft = t_first - t0 if t_first is not None else None
    client_decode = None
    if predicted_n is not None and predicted_n > 1 and t_first is not None and t_last is not None:
        span = t_last - t_first
        client_decode = (predicted_n - 1) / span if span > 0 else None
    draft_n = _int(timings.get("draft_n"))
    draft_acc = _int(timings.get("draft_n_accepted"))
    server_decode = _num(timings.get("predicted_per_second"))
    wall = t_end - t0
    prefill_s = reasoning_s = decode_s = None
    if t_first is not None:
        prefill_s = t_first - t0
        reasoning_s = thinking.last - t_first if thinking.last is not None else 0.0
        decode_s = wall - prefill_s - reasoning_s
    return RequestResult(
        wall_s=t_end - t0,
        ttft_s=ttft,
        prompt_n=prompt_n,
        cache_n=_int(timings.get("cache_n")),
        predicted_n=predicted_n,
        server_prefill_tok_s=_num(timings.get("prompt_per_second")),
        # llama-server reports 0 when fewer than two tokens were generated: no rate, not zero.
        server_decode_tok_s=server_decode if server_decode and (predicted_n or 0) > 1 else None,
        server_prompt_ms=_num(timings.get("prompt_ms")),
        server_predicted_ms=_num(timings.get("predicted_ms")),
        client_prefill_tok_s=(prompt_n / ttft) if prompt_n and ttft else None,
        client_decode_tok_s=client_decode,
        draft_n=draft_n,
        draft_n_accepted=draft_acc,
        acceptance=(draft_acc / draft_n) if draft_n and draft_acc is not None else None,
        finish_reason=finish,
        chunks=chunks,
        prefill_s=prefill_s,
        reasoning_s=reasoning_s,
        decode_s=decode_s,
        reasoning_n=thinking.chunks,
    )


class ThinkingClock:
    """When the model last streamed a reasoning token: ``reasoning_content`` deltas (servers
    that separate thinking) or content between ``<think>`` and ``</think>`` (those that do not)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.chunks = 0
        self._inside = False

    def see(self, delta: dict[str, Any], now: float) -> None:
        reasoning = delta.get("reasoning_content")
        content = delta.get("content")
        text = content if isinstance(content, str) else ""
        if isinstance(reasoning, str) and reasoning:
            thought = True
        elif "<think>" in text:
            self._inside = "</think>" not in text.split("<think>", 1)[1]
            thought = True
        elif self._inside:
            self._inside = "</think>" not in text
            thought = True
        else:
            thought = False
        if thought:
            self.last = now
            self.chunks += 1


# --- the whole benchmark -------------------------------------------------------------------


def server_props(client: LlamaClient) -> dict[str, Any]:
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
        return {}
    try:
        data = resp.json()
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    keep = ("build_info", "model_path", "model_alias", "total_slots", "model_ftype")
    out = {k: data[k] for k in keep if k in data}
    settings = data.get("default_generation_settings")
    if isinstance(settings, dict) and "n_ctx" in settings:
        out["n_ctx"] = settings["n_ctx"]
    return out


def machine_info() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "system": platform.system(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def planned_steps(settings: BenchSettings, prompts: Sequence[Prompt]) -> int:
    """How many progress steps run_bench reports (warm-ups and runs)."""
    return sum(
        settings.warmup + settings.runs * len(p.lengths(settings.max_tokens)) for p in prompts
    )


def _field_stats(
    requests: Sequence[RequestResult], fields: Sequence[str]
) -> dict[str, Stats | None]:
    return {
        name: Stats.of([getattr(q, name) for q in requests if getattr(q, name) is not None])
        for name in fields
    }


def summarise(runs: Sequence[RunResult], prompt: str, max_tokens: int) -> Summary:
    mine = [r for r in runs if r.prompt == prompt and r.max_tokens == max_tokens]
    requests = [q for r in mine for q in r.requests]
    stats = _field_stats(requests, STAT_FIELDS)
    agg = Stats.of([r.aggregate_decode_tok_s for r in mine if r.aggregate_decode_tok_s is not None])
    phases: dict[str, dict[str, Stats | None]] | None = None
    if any(r.phase is not None for r in mine):
        phases = {
            phase: _field_stats(
                [q for r in mine if r.phase == phase for q in r.requests], PHASE_FIELDS
            )
            for phase in ("cold", "warm")
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
    ) as client:
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
                        result.phase = phase
                        runs.append(result)
                        if progress:
                            progress(f"{prompt.name}: {length} tokens, run {run + 1}")
    label = settings.label or str(props.get("model_alias") or "bench")
    meta = {
        "url": settings.url,
        "model": settings.model or props.get("model_alias"),
        "server": props,
        "machine": machine_info(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "llamanix": __version__,
        "metrics": has_metrics,
        "settings": {
            "prompts": [p.name for p in prompts],
            "max_tokens": list(settings.max_tokens),
            "runs": settings.runs,
            "warmup": settings.warmup,
            "concurrency": settings.concurrency,
            "temperature": settings.temperature,
            "seed": settings.seed,
            "ignore_eos": settings.ignore_eos,
            "cache_prompt": settings.cache_prompt,
        },
    }
    summaries = [
        summarise(runs, p.name, n) for p in prompts for n in p.lengths(settings.max_tokens)
    ]
    return BenchResult(label=label, meta=meta, runs=runs, summaries=summaries)


def _warm_up(
    client: LlamaClient, pool: ThreadPoolExecutor, settings: BenchSettings, body: dict[str, Any]
) -> None:
    list(pool.map(lambda _i: stream_completion(client, body), range(settings.concurrency)))


def _one_run(
    client: LlamaClient,
    pool: ThreadPoolExecutor,
    settings: BenchSettings,
    prompt: str,
    length: int,
    run: int,
    body: dict[str, Any],
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
        requests=requests,
        metrics_delta=metrics_delta(before, after) if before and after else None,
    )


def attach_ceiling(result: BenchResult, ceiling: dict[str, Any]) -> None:
    """Record the roofline and each row's share of it (median server decode / ceiling)."""
    result.ceiling = ceiling
    limit = float(ceiling["tok_s"])
    for summary in result.summaries:
        decode = summary.median("server_decode_tok_s") or summary.median("client_decode_tok_s")
        summary.ceiling_share = decode / limit if decode and limit > 0 else None


def csv_rows(result: BenchResult) -> list[dict[str, Any]]:
    """One row per request, for --csv."""
    rows: list[dict[str, Any]] = []
    for run in result.runs:
        for i, q in enumerate(run.requests):
            rows.append(
                {
                    "label": result.label,
                    "prompt": run.prompt,
                    "max_tokens": run.max_tokens,
                    "run": run.run,
                    "request": i,
                    **asdict(q),
                }
            )
    return rows


__all__ = [
    "BenchResult",
    "BenchSettings",
    "Prompt",
    "RequestResult",
    "RunResult",
    "Stats",
    "Summary",
    "ThinkingClock",
    "agent_messages",
    "agent_prompt",
    "attach_ceiling",
    "builtin_prompts",
    "csv_rows",
    "load_prompts",
    "load_result",
    "parse_lengths",
    "parse_prompts",
    "run_bench",
    "stream_completion",
]
