"""The decode roofline and the VRAM budget: what physics allows before anything is measured.

Decode is bound by memory bandwidth: every generated token re-reads the weights, so
tok/s <= bandwidth / weight bytes read per token. The VRAM budget adds up what llama-server
allocates: weights, draft weights, KV cache (and recurrent state) for the configured context and
slots, and a margin for the CUDA context and compute buffers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from llamanix.core.errors import Problem, UserError
from llamanix.core.gpus import Gpu, load_gpus
from llamanix.core.json_codec import JsonRecord, JsonShape
from llamanix.model.gguf_info import GgufInfo

GB = 1_000_000_000
GIB = 1 << 30
MIB = 1 << 20
# The CUDA context, cuBLAS workspace and graph buffers that do not grow with the vocabulary:
# measured on an H100 (docs/gpu.md, the second run) at 725 to 749 MiB beyond weights and KV
# cache for an 8B-shaped model with a 600-token vocabulary, at contexts 8192 and 32768.
BASE_MARGIN_BYTES = 768 * MIB
# llama-server's default -ub: each model's compute buffer holds one ubatch of f32 logits, the
# part of it that grows with the vocabulary (about 250 MiB for a 128k-token one).
DEFAULT_UBATCH = 512
LOGIT_BYTES = 4
# The default KV cache type of every variant, and the draft's default (-ctkd/-ctvd).
DEFAULT_CACHE_TYPE = "f16"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, source: str = "llamanix model ceiling", field: str = "--bytes") -> int:
    """A byte count: ``15300000000``, ``15.3e9``, ``15.3GB`` (10^9) or ``14.25GiB`` (2^30)."""
    match = _BYTES_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise UserError(
            Problem(
                source,
                field,
                f"{text!r} is not a byte count",
                "write e.g. 15300000000, 15.3e9, 15.3GB or 14.25GiB",
            )
        )
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise UserError(
            Problem(source, field, f"{text!r} is not positive", "give the model's size in bytes")
        )
    return round(value)


def decode_ceiling_tok_s(bandwidth_gb_s: float, bytes_per_token: float) -> float:
    """Upper bound on decode tokens per second: bandwidth (10^9 B/s) over bytes read per token."""
    if bandwidth_gb_s <= 0 or bytes_per_token <= 0:
        raise ValueError("bandwidth and bytes per token must be positive")
    return bandwidth_gb_s * GB / bytes_per_token


def find_gpu(name: str, source: str = "llamanix", field: str = "--gpu") -> Gpu:
    """A GPU from the table by key (``rtx5090``) or label, case and punctuation ignored."""
    gpus = load_gpus()

    def norm(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower().replace("nvidia", "").replace("geforce", ""))

    wanted = norm(name)
    for gpu in gpus.values():
        if wanted in (norm(gpu.name), norm(gpu.label)):
            return gpu
    raise UserError(
        Problem(
            source,
            field,
            f"unknown GPU {name!r}",
            f"use one of {', '.join(gpus)} (llamanix model ceiling --list), or give --bandwidth",
        )
    )


@dataclass(frozen=True)
class Ceiling(JsonRecord):
    """One roofline figure and what it was computed from."""

    bandwidth_gb_s: float
    bytes_per_token: float
    tok_s: float
    gpu: str | None = None
    model: str | None = None
    active_fraction: float | None = None


def ceiling_for(
    bandwidth_gb_s: float,
    bytes_per_token: float,
    *,
    gpu: str | None = None,
    model: str | None = None,
    active_fraction: float | None = None,
) -> Ceiling:
    return Ceiling(
        bandwidth_gb_s=bandwidth_gb_s,
        bytes_per_token=bytes_per_token,
        tok_s=decode_ceiling_tok_s(bandwidth_gb_s, bytes_per_token),
        gpu=gpu,
        model=model,
        active_fraction=active_fraction,
    )


@dataclass(frozen=True)
class VramBudget(JsonRecord):
    """What llama-server allocates on the GPU, by part, in bytes; written with their total."""

    weights: int
    draft_weights: int
    kv_cache: int
    draft_kv_cache: int
    recurrent_state: int
    compute_margin: int

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.draft_weights
            + self.kv_cache
            + self.draft_kv_cache
            + self.recurrent_state
            + self.compute_margin
        )

    json_shape: ClassVar[JsonShape] = JsonShape(computed={"total": lambda b: b.total})


def vram_breakdown(
    model_info: GgufInfo,
    draft_info: GgufInfo | None,
    context: int,
    parallel: int = 1,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    ubatch: int | None = None,
) -> VramBudget:
    """The VRAM llama-server needs with every layer offloaded.

    ``context`` is llama-server's ``-c``: the KV cache holds that many tokens in total, shared by
    the ``parallel`` slots; recurrent state is kept once per slot. The draft gets a context of the
    same size with its default f16 cache.
    """
    ctk = cache_type_k or DEFAULT_CACHE_TYPE
    ctv = cache_type_v or DEFAULT_CACHE_TYPE
    draft_kv = 0.0
    draft_state = 0
    if draft_info is not None:
        draft_kv = draft_info.kv_bytes_per_token(DEFAULT_CACHE_TYPE, DEFAULT_CACHE_TYPE) * context
        draft_state = draft_info.recurrent_state_bytes * parallel
    return VramBudget(
        weights=model_info.tensor_bytes,
        draft_weights=draft_info.tensor_bytes if draft_info is not None else 0,
        kv_cache=round(model_info.kv_bytes_per_token(ctk, ctv) * context),
        draft_kv_cache=round(draft_kv),
        recurrent_state=model_info.recurrent_state_bytes * parallel + draft_state,
        compute_margin=compute_margin(
            [model_info.vocab_size, *([draft_info.vocab_size] if draft_info else [])], ubatch
        ),
    )


def compute_margin(vocab_sizes: list[int], ubatch: int | None = None) -> int:
    """What llama-server takes beyond weights, caches and state: the base, and one ubatch of
    logits for each model it loads (the target, and the draft when there is one)."""
    rows = ubatch or DEFAULT_UBATCH
    return BASE_MARGIN_BYTES + sum(v * rows * LOGIT_BYTES for v in vocab_sizes)


def vram_budget(
    model_info: GgufInfo,
    draft_info: GgufInfo | None,
    context: int,
    parallel: int = 1,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    ubatch: int | None = None,
) -> int:
    """Total bytes of :func:`vram_breakdown`."""
    return vram_breakdown(
        model_info, draft_info, context, parallel, cache_type_k, cache_type_v, ubatch
    ).total


def gpu_memory_bytes(gpu: Gpu) -> int:
    return round(gpu.memory_gib * GIB)
