"""The figures a live view wants, from llama-server's own counters: decode and prefill rates,
draft acceptance, cache reuse, and the time to the first token of a 1,000-token prompt.

Each rate is a ratio of two counters' increments between two scrapes, so any number of readers
may scrape the same server: the gauges llama-server computes itself
(``predicted_tokens_seconds`` ...) are averaged "since the previous /metrics call", which every
other reader's call resets, so they are not used. Where a window saw no activity of its kind
(an idle server between two scrapes, or a first look), the figure is the same ratio since the
server started: the rate the server reached the last time it worked.

The decode rate is tokens predicted / seconds spent predicting, summed over requests: with one
request at a time it is what ``llamanix bench`` reports as the server's decode tok/s (its
``timings.predicted_per_second``), and with speculation it counts accepted draft tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llamanix.server.metrics import MetricsSnapshot

# Where a figure comes from: the window between two scrapes, or everything since the server
# started (no activity of its kind in the window, or no window yet).
Basis = Literal["window", "since start"]


@dataclass(frozen=True)
class Counters:
    """What one scrape says, by name (llama-server's, without its prefix)."""

    prompt_tokens: float | None
    prompt_cached: float | None
    prompt_seconds: float | None
    predicted_tokens: float | None
    predicted_seconds: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    in_flight: float | None
    deferred: float | None

    @staticmethod
    def of(snapshot: MetricsSnapshot) -> Counters:
        get = snapshot.get
        return Counters(
            prompt_tokens=get("prompt_tokens_total"),
            prompt_cached=get("prompt_tokens_cached_total"),
            prompt_seconds=get("prompt_seconds_total"),
            predicted_tokens=get("tokens_predicted_total"),
            predicted_seconds=get("tokens_predicted_seconds_total"),
            draft_tokens=get("spec_decode_num_draft_tokens_total"),
            accepted_tokens=get("spec_decode_num_accepted_tokens_total"),
            in_flight=get("requests_processing"),
            deferred=get("requests_deferred"),
        )

    def restarted_since(self, before: Counters) -> bool:
        """Whether a counter went down: the server restarted between the two scrapes."""
        pairs = (
            (self.prompt_tokens, before.prompt_tokens),
            (self.predicted_tokens, before.predicted_tokens),
            (self.predicted_seconds, before.predicted_seconds),
        )
        return any(a is not None and b is not None and a < b for a, b in pairs)


@dataclass(frozen=True)
class Figures:
    in_flight: float | None
    deferred: float | None
    decode_tok_s: float | None
    decode_basis: Basis | None
    prefill_tok_s: float | None
    acceptance: float | None
    acceptance_basis: Basis | None
    cache_reuse: float | None  # share of prompt tokens taken from the cache
    tokens_predicted: float | None  # since the server started
    ttft_1k_s: float | None  # see ttft_1k

    def ceiling_share(self, ceiling_tok_s: float | None) -> float | None:
        if ceiling_tok_s is None or ceiling_tok_s <= 0 or self.decode_tok_s is None:
            return None
        return self.decode_tok_s / ceiling_tok_s


def _ratio(
    num_after: float | None,
    den_after: float | None,
    num_before: float | None,
    den_before: float | None,
    windowed: bool,
) -> tuple[float | None, Basis | None]:
    """num/den over the window when the window saw some of den, else since start."""
    if num_after is None or den_after is None:
        return None, None
    if windowed and num_before is not None and den_before is not None:
        dn, dd = num_after - num_before, den_after - den_before
        if dd > 0 and dn >= 0:
            return dn / dd, "window"
    if den_after > 0:
        return num_after / den_after, "since start"
    return None, None


def figures(after: Counters, before: Counters | None = None) -> Figures:
    """The figures of ``after``, over the window since ``before`` where there is one."""
    windowed = before is not None and not after.restarted_since(before)
    b = before if before is not None else after
    decode, decode_basis = _ratio(
        after.predicted_tokens,
        after.predicted_seconds,
        b.predicted_tokens,
        b.predicted_seconds,
        windowed,
    )
    prefill, _ = _ratio(
        after.prompt_tokens, after.prompt_seconds, b.prompt_tokens, b.prompt_seconds, windowed
    )
    acceptance, acceptance_basis = _ratio(
        after.accepted_tokens, after.draft_tokens, b.accepted_tokens, b.draft_tokens, windowed
    )
    reuse = None
    if after.prompt_cached is not None and after.prompt_tokens is not None:
        total = after.prompt_cached + after.prompt_tokens
        reuse = after.prompt_cached / total if total > 0 else None
    return Figures(
        in_flight=after.in_flight,
        deferred=after.deferred,
        decode_tok_s=decode,
        decode_basis=decode_basis,
        prefill_tok_s=prefill,
        acceptance=acceptance,
        acceptance_basis=acceptance_basis,
        cache_reuse=reuse,
        tokens_predicted=after.predicted_tokens,
        ttft_1k_s=ttft_1k(prefill),
    )


def ttft_1k(prefill_tok_s: float | None) -> float | None:
    """Seconds the server takes to the first token of a 1,000-token prompt it has not cached,
    at the prefill rate. llama-server counts prompt tokens and prompt seconds but not requests,
    so a mean time per request cannot be taken from /metrics; a prompt of a fixed length can.
    Queueing and HTTP are left out, as in bench's server prompt time."""
    if prefill_tok_s is None or prefill_tok_s <= 0:
        return None
    return 1000 / prefill_tok_s
