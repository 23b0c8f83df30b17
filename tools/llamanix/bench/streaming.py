"""One streamed completion against llama-server, timed on both clocks.

A chat prompt goes to ``/v1/chat/completions``; a raw-text prompt (a base model without a chat
template) to llama-server's own ``/completion``, whose events carry the same ``timings``.

Every request streams, so time to first token is read off the client's clock instead of being
guessed. Each request keeps both views of decode speed: the server's own ``timings`` (what
llama-server measured between the first and the last generated token) and the client's clock
over the same span, ``(predicted_n - 1) / (t_last - t_first)``. Speculation is checked on every
request (``draft_n``, ``draft_n_accepted``). The wall clock is split into prefill (time to the
first streamed token), reasoning (up to the last ``reasoning_content`` or ``<think>`` token,
zero when the model does not think) and decode (the rest).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from llamanix.bench.bench_results import BenchSettings, RequestResult
from llamanix.bench.prompts import Prompt, agent_messages, new_session
from llamanix.core import json_fields as jf
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_fields import integer as as_int
from llamanix.core.json_fields import real as as_float
from llamanix.core.json_value import JsonObject
from llamanix.server.client import LlamaClient, error_message


def request_body(
    prompt: Prompt,
    max_tokens: int,
    settings: BenchSettings,
    session: str | None = None,
    turn: int = 0,
) -> JsonObject:
    """The streamed request; agent prompts get ``session``'s prefix and a new last turn. A
    raw-text prompt's body is /completion's (``prompt``, ``n_predict``), which is how
    ``stream_completion`` tells the two apart."""
    if prompt.text is not None:
        return _completion_body(prompt.text, max_tokens, settings)
    if prompt.agent:
        messages = agent_messages(prompt, session or new_session(), turn)
    else:
        messages = list(prompt.messages)
    body: JsonObject = {
        "messages": [*messages],
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
        body["tools"] = [*prompt.tools]
    return body


def _completion_body(text: str, max_tokens: int, settings: BenchSettings) -> JsonObject:
    body: JsonObject = {
        "prompt": text,
        "n_predict": max_tokens,
        "stream": True,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "cache_prompt": settings.cache_prompt,
    }
    if settings.ignore_eos:
        body["ignore_eos"] = True
    if settings.model:
        body["model"] = settings.model
    return body


def is_raw(body: Mapping[str, object]) -> bool:
    """A /completion body (raw text) rather than a chat one."""
    return "prompt" in body and "messages" not in body


def _sse_events(lines: Iterator[str]) -> Iterator[Mapping[str, object]]:
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


def stream_completion(client: LlamaClient, body: JsonObject) -> RequestResult:
    """POST one streaming chat completion and time it."""
    url = client.url
    t0 = time.perf_counter()
    raw = is_raw(body)
    opened = client.stream_complete(body) if raw else client.stream_chat(body)
    with opened as resp:
        if resp.status_code != 200:
            raise _http_error(url, resp.status_code, resp.read().decode(errors="replace"))
        stream = _read_stream(url, resp.iter_lines(), raw)
    t_end = time.perf_counter()
    return _request_result(stream, t0, t_end)


@dataclass
class _Stream:
    """What a streamed answer brought, as it came: when its first and last chunks arrived
    (``time.perf_counter``), the server's timings and token counts, the stop reason, the
    number of chunks, the reasoning's clock and the text."""

    thinking: ThinkingClock
    t_first: float | None = None
    t_last: float | None = None
    timings: dict[str, object] = field(default_factory=dict)
    usage: dict[str, object] = field(default_factory=dict)
    finish: str | None = None
    chunks: int = 0
    text: list[str] = field(default_factory=list)

    def _chunk(self, now: float) -> None:
        self.chunks += 1
        if self.t_first is None:
            self.t_first = now
        self.t_last = now

    def see_completion(self, event: Mapping[str, object], now: float) -> None:
        """One /completion event."""
        piece, reason, usage_now = _completion_event(event)
        if usage_now:
            self.usage = usage_now
        if piece is not None:
            self._chunk(now)
            self.text.append(piece)
        if reason:
            self.finish = reason

    def see_chat(self, event: Mapping[str, object], now: float) -> None:
        """One chat completion event."""
        choices = event.get("choices")
        if isinstance(choices, list) and choices:
            # llama-server sends the first chunk (the assistant role) with the first token.
            self._chunk(now)
            choice = jf.table(choices[0])
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self.thinking.see(delta, now)
                content = delta.get("content")
                if isinstance(content, str):
                    self.text.append(content)
            stopped = choice.get("finish_reason")
            if stopped:
                self.finish = str(stopped)
        sent_usage = event.get("usage")
        if isinstance(sent_usage, dict):
            self.usage = sent_usage


def _read_stream(url: str, lines: Iterator[str], raw: bool) -> _Stream:
    """The server-sent events of one answer, each timed as it arrives; an error event is
    refused."""
    stream = _Stream(ThinkingClock())
    for event in _sse_events(lines):
        now = time.perf_counter()
        if "error" in event:
            raise ExternalCommandError(f"{url}: stream error: {event['error']}")
        if raw:
            stream.see_completion(event, now)
        else:
            stream.see_chat(event, now)
        sent_timings = event.get("timings")
        if isinstance(sent_timings, dict):
            stream.timings = sent_timings
    return stream


def _request_result(stream: _Stream, t0: float, t_end: float) -> RequestResult:
    """The request's figures from both clocks: the server's timings (or its token counts) and
    the client's, from ``t0`` (sent) to ``t_end`` (the stream closed)."""
    timings, usage = stream.timings, stream.usage
    t_first, t_last, thinking = stream.t_first, stream.t_last, stream.thinking
    prompt_n = as_int(timings.get("prompt_n"))
    if prompt_n is None:
        prompt_n = as_int(usage.get("prompt_tokens"))
    predicted_n = as_int(timings.get("predicted_n"))
    if predicted_n is None:
        predicted_n = as_int(usage.get("completion_tokens"))
    ttft = t_first - t0 if t_first is not None else None
    client_decode = None
    if predicted_n is not None and predicted_n > 1 and t_first is not None and t_last is not None:
        span = t_last - t_first
        client_decode = (predicted_n - 1) / span if span > 0 else None
    draft_n = as_int(timings.get("draft_n"))
    draft_acc = as_int(timings.get("draft_n_accepted"))
    server_decode = as_float(timings.get("predicted_per_second"))
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
        cache_n=as_int(timings.get("cache_n")),
        predicted_n=predicted_n,
        server_prefill_tok_s=as_float(timings.get("prompt_per_second")),
        # llama-server reports 0 when fewer than two tokens were generated: no rate, not zero.
        server_decode_tok_s=server_decode if server_decode and (predicted_n or 0) > 1 else None,
        server_prompt_ms=as_float(timings.get("prompt_ms")),
        server_predicted_ms=as_float(timings.get("predicted_ms")),
        client_prefill_tok_s=(prompt_n / ttft) if prompt_n and ttft else None,
        client_decode_tok_s=client_decode,
        draft_n=draft_n,
        draft_n_accepted=draft_acc,
        acceptance=(draft_acc / draft_n) if draft_n and draft_acc is not None else None,
        finish_reason=stream.finish,
        chunks=stream.chunks,
        prefill_s=prefill_s,
        reasoning_s=reasoning_s,
        decode_s=decode_s,
        reasoning_n=thinking.chunks,
        text="".join(stream.text),
    )


def _completion_event(
    event: Mapping[str, object],
) -> tuple[str | None, str | None, dict[str, object]]:
    """One /completion event: (the streamed piece, or None for the closing event; the stop
    reason once stopped; token counts as usage). Every event before the last is a token."""
    if event.get("stop") is True:
        usage: dict[str, object] = {
            "prompt_tokens": event.get("tokens_evaluated"),
            "completion_tokens": event.get("tokens_predicted"),
        }
        reason = event.get("stop_type")
        # /completion says "limit" where the chat endpoint says "length".
        finish = {"limit": "length", "eos": "stop", "word": "stop"}.get(str(reason), str(reason))
        return None, finish, usage
    content = event.get("content")
    return (content if isinstance(content, str) else ""), None, {}


class ThinkingClock:
    """When the model last streamed a reasoning token: ``reasoning_content`` deltas (servers
    that separate thinking) or content between ``<think>`` and ``</think>`` (those that do not)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.chunks = 0
        self._inside = False

    def see(self, delta: Mapping[str, object], now: float) -> None:
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
