"""What a GGUF file holds, read with the gguf package: the facts sizing and doctor need.

Everything here comes from the file's metadata and tensor table; no weights are loaded. The
layer bookkeeping follows llama.cpp: ``block_count`` counts every block including MTP (nextn)
blocks, a hybrid model marks its recurrent (SSM / linear-attention) blocks, and only attention
blocks hold a KV cache.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.core.json_codec import JSON_SKIP, JsonRecord, JsonShape

if TYPE_CHECKING:
    # gguf brings numpy: imported where a file is read, so importing this module stays cheap.
    from gguf import GGUFReader

# The KV cache types llama-server accepts (-ctk/-ctv); ik adds q6_0 and q8_KV, which the gguf
# package does not know, so they are left out of the per-type table.
CACHE_TYPES: tuple[str, ...] = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "iq4_nl",
    "q5_0",
    "q5_1",
)

# llama.cpp's llm_arch_is_recurrent / llm_arch_is_hybrid (src/llama-arch.cpp, upstream 0c1e570).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
# qwen3next / qwen35 put a full-attention block every 4th block unless the file says otherwise.
DEFAULT_FULL_ATTENTION_INTERVAL = 4


def cache_type_bytes(cache_type: str) -> float:
    """Bytes per element of a KV cache type (block size over block bytes for quantized ones)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType[cache_type.upper()]
    except KeyError:
        raise UserError(
            Problem(
                "llamanix",
                "cache type",
                f"unknown cache type {cache_type!r}",
                f"use one of {', '.join(CACHE_TYPES)}",
            )
        ) from None
    block, size = GGML_QUANT_SIZES[qtype]
    return size / block


@dataclass(frozen=True)
class TensorTypeShare:
    """One tensor type's part of the file."""

    count: int
    parameters: int
    bytes: int


@dataclass(frozen=True)
class GgufInfo(JsonRecord):
    """The facts about one GGUF that inspect prints and sizing uses; written with the figures
    that follow from the fields, and without the per-layer KV widths."""

    path: str
    architecture: str
    name: str | None
    file_bytes: int
    tensor_bytes: int
    parameter_count: int
    tensor_types: dict[str, TensorTypeShare]
    vocab_size: int
    tokenizer_model: str | None
    context_length: int | None
    block_count: int
    nextn_layers: int
    attention_layers: int
    recurrent_layers: int
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    head_dim_k: int | None
    head_dim_v: int | None
    sliding_window: int | None
    expert_count: int
    expert_used_count: int
    expert_tensor_bytes: int
    token_embd_bytes: int
    output_tied: bool
    recurrent_state_bytes: int
    # Per-layer K and V widths (kv heads x head dim) of the blocks that hold a KV cache.
    kv_widths: tuple[tuple[int, int], ...] = field(repr=False, metadata=JSON_SKIP)

    json_shape: ClassVar[JsonShape] = JsonShape(
        computed={
            "has_mtp": lambda g: g.has_mtp,
            "is_hybrid": lambda g: g.is_hybrid,
            "is_recurrent": lambda g: g.is_recurrent,
            "kv_bytes_per_token": lambda g: {t: g.kv_bytes_per_token(t, t) for t in CACHE_TYPES},
            "weight_bytes_per_token": lambda g: g.weight_bytes_per_token(),
        }
    )

    @property
    def has_mtp(self) -> bool:
        return self.nextn_layers > 0

    @property
    def is_hybrid(self) -> bool:
        return self.recurrent_layers > 0 and self.attention_layers > 0

    @property
    def is_recurrent(self) -> bool:
        """Any recurrent (SSM) block: such a context cannot drop a rejected draft's tokens."""
        return self.recurrent_layers > 0

    def kv_bytes_per_token(self, cache_type_k: str = "f16", cache_type_v: str = "f16") -> float:
        """KV-cache bytes one token of context costs with these cache types."""
        bk = cache_type_bytes(cache_type_k)
        bv = cache_type_bytes(cache_type_v)
        return sum(k * bk + v * bv for k, v in self.kv_widths)

    def weight_bytes_per_token(self, active_fraction: float | None = None) -> float:
        """Weight bytes a decode step reads.

        All tensor data except the token embedding (a decode step reads one row of it, unless it
        doubles as the output matrix). MoE: only the routed experts' share of expert tensors, or
        ``active_fraction`` of everything when given.
        """
        base = float(self.tensor_bytes)
        if not self.output_tied:
            base -= self.token_embd_bytes
        if active_fraction is not None:
            return base * active_fraction
        if self.expert_count > 0 and self.expert_used_count > 0:
            dense = base - self.expert_tensor_bytes
            return dense + self.expert_tensor_bytes * self.expert_used_count / self.expert_count
        return base


@dataclass(frozen=True)
class Vocab:
    """The parts of a tokenizer llama.cpp compares before it lets a draft serve a target."""

    model: str | None
    size: int
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    tokens: tuple[str, ...] = field(repr=False)

    @property
    def digest(self) -> str:
        return hashlib.sha256("\0".join(self.tokens).encode()).hexdigest()[:16]


# llama.cpp's common_speculative_are_compatible: sizes may differ by this much, and token texts
# are compared from this id on (the first ids are control tokens that differ harmlessly).
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


def vocab_mismatch(target: Vocab, draft: Vocab) -> str | None:
    """Why llama.cpp would refuse this draft for this target, or None when it would accept it."""
    if target.model != draft.model:
        return f"tokenizer type differs (target {target.model}, draft {draft.model})"
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        return f"BOS token differs (target {target.bos}, draft {draft.bos})"
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        return f"EOS token differs (target {target.eos}, draft {draft.eos})"
    diff = abs(target.size - draft.size)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        return (
            f"vocabulary sizes differ by {diff} (target {target.size}, draft {draft.size}; "
            f"llama.cpp allows {VOCAB_MAX_SIZE_DIFFERENCE})"
        )
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(target.size, draft.size)):
        if target.tokens[i] != draft.tokens[i]:
            return f"token {i} differs (target {target.tokens[i]!r}, draft {draft.tokens[i]!r})"
    return None


class _Fields:
    """Typed access to a reader's metadata."""

    def __init__(self, reader: GGUFReader, arch: str) -> None:
        self.reader = reader
        self.arch = arch

    def raw(self, key: str) -> Any:
        fld = self.reader.fields.get(key.replace("{arch}", self.arch))
        return None if fld is None else fld.contents()

    def integer(self, key: str) -> int | None:
        value = self.raw(key)
        if value is None or isinstance(value, list):
            return None
        return int(value)

    def integers(self, key: str, n: int) -> list[int] | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, list):
            return [int(v) for v in value] + [0] * (n - len(value))
        return [int(value)] * n


def _open(path: Path) -> GGUFReader:
    try:
        with file_reader.open_regular(path, source=str(path), field="model") as fh:
            stat = os.fstat(fh.fileno())
    except file_reader.FileRefused as err:
        if err.errno != errno.ENOENT:
            raise
        raise UserError(
            Problem(str(path), "model", "no such file", "give the path of a .gguf file")
        ) from None
    return _open_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)


# Parsing the metadata of a 150k-token vocabulary takes seconds; doctor reads a model's info and
# its vocabulary, so one parse serves both (keyed on mtime and size to notice a replaced file).
@lru_cache(maxsize=8)
def _open_cached(path: Path, mtime_ns: int, size: int) -> GGUFReader:
    with file_reader.open_regular(path, source=str(path), field="model") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise UserError(
            Problem(
                str(path),
                "model",
                "not a GGUF file (no GGUF magic)",
                "give the path of a .gguf model file",
            )
        )
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError):
        raise UserError(
            Problem(
                str(path),
                "model",
                "truncated or corrupt GGUF file",
                "download or convert the model again",
            )
        ) from None


def _recurrent_flags(
    f: _Fields, arch: str, n_all: int, n_nextn: int, kv_heads: list[int] | None
) -> list[bool]:
    n_trunk = n_all - n_nextn
    if arch in RECURRENT_ARCHS:
        return [True] * n_all
    if arch not in HYBRID_ARCHS:
        return [False] * n_all
    explicit = f.raw("{arch}.attention.recurrent_layers")
    if isinstance(explicit, list):
        flags = [bool(v) for v in explicit]
        return flags + [False] * (n_all - len(flags))
    interval = f.integer("{arch}.full_attention_interval")
    if interval is not None or arch in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp"):
        step = interval or DEFAULT_FULL_ATTENTION_INTERVAL
        return [i < n_trunk and (i + 1) % step != 0 for i in range(n_all)]
    if kv_heads is not None:
        # jamba, granitehybrid, nemotron_h ...: blocks without KV heads are the recurrent ones.
        return [i < n_trunk and kv_heads[i] == 0 for i in range(n_all)]
    return [False] * n_all


def _recurrent_state_bytes(f: _Fields, n_recurrent: int) -> int:
    """f32 state one sequence keeps per recurrent block (llama_hparams::n_embd_r + n_embd_s)."""
    if n_recurrent == 0:
        return 0
    d_conv = f.integer("{arch}.ssm.conv_kernel") or 0
    d_inner = f.integer("{arch}.ssm.inner_size") or 0
    d_state = f.integer("{arch}.ssm.state_size") or 0
    n_group = f.integer("{arch}.ssm.group_count") or 0
    wkv = f.integer("{arch}.wkv.head_size") or 0
    n_embd = f.integer("{arch}.embedding_length") or 0
    if wkv:
        shift = f.integer("{arch}.token_shift_count") or 2
        per_layer = shift * n_embd + n_embd * wkv
    else:
        per_layer = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
    return per_layer * 4 * n_recurrent


@dataclass(frozen=True)
class _Tensors:
    """The tensor table's totals: each type's share (largest first), all the tensors' bytes and
    parameters, the experts' bytes, the token embedding's, and whether an output tensor of its
    own is there."""

    types: dict[str, TensorTypeShare]
    tensor_bytes: int
    parameters: int
    expert_bytes: int
    embd_bytes: int
    has_output: bool


def _tensor_totals(reader: GGUFReader) -> _Tensors:
    types: dict[str, list[int]] = {}
    tensor_bytes = params = expert_bytes = embd_bytes = 0
    has_output = False
    for t in reader.tensors:
        name = t.tensor_type.name
        share = types.setdefault(name, [0, 0, 0])
        share[0] += 1
        share[1] += int(t.n_elements)
        share[2] += int(t.n_bytes)
        tensor_bytes += int(t.n_bytes)
        params += int(t.n_elements)
        if "_exps" in t.name:
            expert_bytes += int(t.n_bytes)
        if t.name == "token_embd.weight":
            embd_bytes = int(t.n_bytes)
        if t.name == "output.weight":
            has_output = True
    return _Tensors(
        types={
            k: TensorTypeShare(count=v[0], parameters=v[1], bytes=v[2])
            for k, v in sorted(types.items(), key=lambda kv: -kv[1][2])
        },
        tensor_bytes=tensor_bytes,
        parameters=params,
        expert_bytes=expert_bytes,
        embd_bytes=embd_bytes,
        has_output=has_output,
    )


def read_gguf(path: Path) -> GgufInfo:
    """Read one GGUF's metadata and tensor table."""
    reader = _open(path)
    arch_value = reader.fields.get("general.architecture")
    if arch_value is None:
        raise UserError(
            Problem(
                str(path),
                "general.architecture",
                "missing",
                "the file is not a llama.cpp model GGUF",
            )
        )
    arch = str(arch_value.contents())
    f = _Fields(reader, arch)

    tensors = _tensor_totals(reader)

    n_all = f.integer("{arch}.block_count") or 0
    n_nextn = f.integer("{arch}.nextn_predict_layers") or 0
    n_head = f.integers("{arch}.attention.head_count", n_all)
    n_head_kv = f.integers("{arch}.attention.head_count_kv", n_all) or n_head
    n_embd = f.integer("{arch}.embedding_length")
    head0 = next((h for h in (n_head or []) if h > 0), None)
    default_dim = n_embd // head0 if n_embd and head0 else None
    dim_k = f.integer("{arch}.attention.key_length") or default_dim
    dim_v = f.integer("{arch}.attention.value_length") or default_dim
    recurrent = _recurrent_flags(f, arch, n_all, n_nextn, n_head_kv)
    kv_widths = tuple(
        (n_head_kv[i] * (dim_k or 0), n_head_kv[i] * (dim_v or 0))
        for i in range(n_all)
        if not recurrent[i] and n_head_kv is not None and n_head_kv[i] > 0
    )
    n_recurrent = sum(recurrent)

    tokens_field = reader.fields.get("tokenizer.ggml.tokens")
    vocab_size = f.integer("{arch}.vocab_size") or (len(tokens_field.data) if tokens_field else 0)
    tok_model = f.raw("tokenizer.ggml.model")

    return GgufInfo(
        path=str(path),
        architecture=arch,
        name=None if f.raw("general.name") is None else str(f.raw("general.name")),
        file_bytes=path.stat().st_size,
        tensor_bytes=tensors.tensor_bytes,
        parameter_count=tensors.parameters,
        tensor_types=tensors.types,
        vocab_size=vocab_size,
        tokenizer_model=None if tok_model is None else str(tok_model),
        context_length=f.integer("{arch}.context_length"),
        block_count=n_all,
        nextn_layers=n_nextn,
        attention_layers=len(kv_widths),
        recurrent_layers=n_recurrent,
        embedding_length=n_embd,
        head_count=head0,
        head_count_kv=max(n_head_kv) if n_head_kv else None,
        head_dim_k=dim_k,
        head_dim_v=dim_v,
        sliding_window=f.integer("{arch}.attention.sliding_window"),
        expert_count=f.integer("{arch}.expert_count") or 0,
        expert_used_count=f.integer("{arch}.expert_used_count") or 0,
        expert_tensor_bytes=tensors.expert_bytes,
        token_embd_bytes=tensors.embd_bytes,
        output_tied=bool(tensors.embd_bytes) and not tensors.has_output,
        recurrent_state_bytes=_recurrent_state_bytes(f, n_recurrent),
        kv_widths=kv_widths,
    )


def read_vocab(path: Path) -> Vocab:
    """The tokenizer facts of a GGUF (model or vocab-only file)."""
    reader = _open(path)
    fields = reader.fields

    def value(key: str) -> Any:
        fld = fields.get(key)
        return None if fld is None else fld.contents()

    tokens_field = fields.get("tokenizer.ggml.tokens")
    if tokens_field is None:
        raise UserError(
            Problem(
                str(path),
                "tokenizer.ggml.tokens",
                "the file has no vocabulary",
                "use a model GGUF with its tokenizer",
            )
        )
    tokens: Sequence[str] = tokens_field.contents()
    bos = value("tokenizer.ggml.bos_token_id")
    eos = value("tokenizer.ggml.eos_token_id")
    model = value("tokenizer.ggml.model")
    return Vocab(
        model=None if model is None else str(model),
        size=len(tokens),
        bos=None if bos is None else int(bos),
        eos=None if eos is None else int(eos),
        # llama.cpp's defaults when the keys are absent: BOS added for SPM vocabularies, EOS not.
        add_bos=bool(
            value("tokenizer.ggml.add_bos_token")
            if value("tokenizer.ggml.add_bos_token") is not None
            else model == "llama"
        ),
        add_eos=bool(value("tokenizer.ggml.add_eos_token") or False),
        tokens=tuple(tokens),
    )
