"""Synthetic llama-architecture GGUF models: tiny, random, deterministic.

Tests, the demo and smoke runs need models a real llama-server loads in a second on a CPU.
Weights are seeded random numbers (the text is noise); the tokenizer is copied from a
vocab-only GGUF (llama.cpp ships ``models/ggml-vocab-*.gguf``) or, without one, a small
built-in SentencePiece-style vocabulary with byte fallback.

Two properties decide what a synthetic model is good for:
- Quantized KV caches need head_dim (embd / heads) to be a multiple of 32, the q8_0/q4_0
  block size; the default 128 / 2 = 64 works.
- A draft only proposes tokens it is sure of (``p_min``). With every weight at std 0.02 the
  model is unsure of everything and a draft never drafts, even draft = target. Scaling the
  output projection to std 1.0 (``output_scale``, the default) makes it confident, so
  draft = target drafts and is accepted.
- A draft and a target that agree: ``passthrough`` adds blocks after the ``layers`` real ones
  whose output projections (attn_output, ffn_down) are exactly zero. Each still runs its full
  attention and FFN matmuls, so it costs compute, but adds nothing to the residual stream:
  the logits are those of the first ``layers`` blocks alone. The real blocks, embeddings and
  output head come from the same random stream whatever ``passthrough`` is, so
  ``SynthSpec(layers=1)`` is a draft that predicts exactly what
  ``SynthSpec(layers=1, passthrough=11)`` would, at a twelfth of the block compute.
- n-gram drafters (ngram-simple, -mod, -cache, -map-k) only draft when the text repeats.
  Token embeddings at std 1.0 (``embd_scale``, the default) drown out the small attention
  and FFN contributions, so the next token depends almost only on the current one: greedy
  output falls into a cycle (84 tokens long for the defaults) within a few hundred tokens,
  and a prompt made of that output gives every n-gram drafter something to match.

Same arguments, same bytes: nothing depends on time, paths or the machine.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

from llamanix.core import file_reader
from llamanix.core.errors import Problem, UserError
from llamanix.external.files import atomic_write

ARCH = "llama"
WEIGHT_STD = 0.02
TYPES = ("f16", "q8_0", "f32")
FILE_TYPES = {
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "f32": gguf.LlamaFileType.ALL_F32,
}
QUANT_BLOCK = 32  # q8_0 block size, also what quantized KV caches need head_dim to divide by


@dataclass(frozen=True)
class SynthSpec:
    """Everything that decides the bytes of a synthetic model."""

    layers: int = 2
    passthrough: int = 0  # extra blocks that cost compute and change nothing (see above)
    embd: int = 128
    ff: int = 256
    heads: int = 2
    kv_heads: int = 2
    context: int = 4096
    vocab: Path | None = None
    seed: int = 0
    type: str = "f16"
    output_scale: float = 1.0
    embd_scale: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.embd // self.heads

    @property
    def blocks(self) -> int:
        """Blocks in the file: the real ones, then the passthrough ones."""
        return self.layers + self.passthrough


def _bad(field: str, message: str, fix: str) -> UserError:
    return UserError(Problem("llamanix testbed synth-model", field, message, fix))


def check_spec(spec: SynthSpec) -> None:
    for name in ("layers", "embd", "ff", "heads", "kv_heads", "context"):
        if getattr(spec, name) < 1:
            flag = "--" + name.replace("_", "-")
            got = getattr(spec, name)
            raise _bad(flag, f"must be at least 1, got {got}", f"pass {flag} 1 or more")
    if spec.passthrough < 0:
        raise _bad(
            "--passthrough", f"must be 0 or more, got {spec.passthrough}", "pass --passthrough 0"
        )
    if spec.embd % spec.heads:
        raise _bad("--heads", f"{spec.heads} does not divide --embd {spec.embd}", "pick a divisor")
    if spec.heads % spec.kv_heads:
        raise _bad(
            "--kv-heads", f"{spec.kv_heads} does not divide --heads {spec.heads}", "pick a divisor"
        )
    if spec.head_dim % 2:
        raise _bad("--heads", f"head dim {spec.head_dim} is odd", "RoPE needs an even head dim")
    if spec.type not in TYPES:
        raise _bad("--type", f"unknown type {spec.type!r}", f"use one of {', '.join(TYPES)}")
    if spec.type == "q8_0" and (spec.embd % QUANT_BLOCK or spec.ff % QUANT_BLOCK):
        raise _bad(
            "--type",
            f"q8_0 needs --embd and --ff to be multiples of {QUANT_BLOCK}",
            f"got embd {spec.embd}, ff {spec.ff}",
        )
    for name in ("output_scale", "embd_scale"):
        if not getattr(spec, name) > 0:
            flag = "--" + name.replace("_", "-")
            raise _bad(flag, f"must be positive, got {getattr(spec, name)}", "try 1.0")
    if spec.vocab is not None and not spec.vocab.exists():
        raise _bad("--vocab", f"{spec.vocab} does not exist", "pass a GGUF with tokenizer.* keys")
    if spec.vocab is not None:
        with file_reader.open_regular(spec.vocab, source=str(spec.vocab), field="--vocab"):
            pass  # a regular file: not a directory, a FIFO (GGUFReader would wait) or a device


# --- tokenizer ------------------------------------------------------------------------------

# SentencePiece token types as llama.cpp reads them.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_BYTE = 6

_BUILTIN_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we can their has been if more when "
    "will would who so no hello world model token server draft speculative decoding llama "
    "test fast slow quick brown fox jumps over lazy dog"
)
_BUILTIN_WORDS = tuple(_BUILTIN_TEXT.split(" "))


@dataclass(frozen=True)
class KeyValue:
    """One GGUF metadata entry, typed as the writer needs it."""

    key: str
    value: Any
    type: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


def builtin_tokenizer() -> list[KeyValue]:
    """A small SPM vocabulary: control tokens, 256 byte-fallback tokens, ASCII, some words."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TOKEN_BYTE] * 256
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)]
    pieces += ["\u2581" + chr(c) for c in range(33, 127)]
    # SPM merges pairs of pieces it knows, so a word needs all its prefixes as pieces too.
    for word in _BUILTIN_WORDS:
        for end in range(2, len(word) + 1):
            piece = "\u2581" + word[:end]
            if piece not in pieces:
                pieces.append(piece)
    tokens += pieces
    types += [TOKEN_NORMAL] * len(pieces)
    # SPM merges by score: longer pieces first, so words win over letter-by-letter.
    scores = [0.0] * 259 + [float(len(p)) - 100.0 for p in pieces]
    t = gguf.GGUFValueType
    return [
        KeyValue("tokenizer.ggml.model", "llama", t.STRING),
        KeyValue("tokenizer.ggml.pre", "default", t.STRING),
        KeyValue("tokenizer.ggml.tokens", tokens, t.ARRAY, t.STRING),
        KeyValue("tokenizer.ggml.scores", scores, t.ARRAY, t.FLOAT32),
        KeyValue("tokenizer.ggml.token_type", types, t.ARRAY, t.INT32),
        KeyValue("tokenizer.ggml.bos_token_id", 1, t.UINT32),
        KeyValue("tokenizer.ggml.eos_token_id", 2, t.UINT32),
        KeyValue("tokenizer.ggml.unknown_token_id", 0, t.UINT32),
        KeyValue("tokenizer.ggml.add_bos_token", True, t.BOOL),
        KeyValue("tokenizer.ggml.add_eos_token", False, t.BOOL),
    ]


def tokenizer_from(path: Path) -> list[KeyValue]:
    """Every ``tokenizer.*`` entry of a GGUF, in file order."""
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as err:
        raise _bad(
            "--vocab", f"{path} is not a readable GGUF ({err})", "pass a .gguf file"
        ) from err
    out: list[KeyValue] = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if main == gguf.GGUFValueType.ARRAY else None
        out.append(KeyValue(key, field.contents(), main, sub))
    if not any(kv.key == "tokenizer.ggml.tokens" for kv in out):
        raise _bad("--vocab", f"{path} has no tokenizer.ggml.tokens", "pass a vocab GGUF")
    return out


def vocab_size(tokenizer: list[KeyValue]) -> int:
    for kv in tokenizer:
        if kv.key == "tokenizer.ggml.tokens":
            return len(kv.value)
    raise ValueError("tokenizer without tokenizer.ggml.tokens")


# --- weights --------------------------------------------------------------------------------


def tensor_shapes(spec: SynthSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Llama tensors in numpy order (rows = outputs); the writer reverses to ggml order."""
    kv_dim = spec.kv_heads * spec.head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, spec.embd))]
    for i in range(spec.blocks):
        b = f"blk.{i}"
        shapes += [
            (f"{b}.attn_norm.weight", (spec.embd,)),
            (f"{b}.attn_q.weight", (spec.embd, spec.embd)),
            (f"{b}.attn_k.weight", (kv_dim, spec.embd)),
            (f"{b}.attn_v.weight", (kv_dim, spec.embd)),
            (f"{b}.attn_output.weight", (spec.embd, spec.embd)),
            (f"{b}.ffn_norm.weight", (spec.embd,)),
            (f"{b}.ffn_gate.weight", (spec.ff, spec.embd)),
            (f"{b}.ffn_up.weight", (spec.ff, spec.embd)),
            (f"{b}.ffn_down.weight", (spec.embd, spec.ff)),
        ]
    shapes += [("output_norm.weight", (spec.embd,)), ("output.weight", (n_vocab, spec.embd))]
    return shapes


# The projections a block adds to the residual stream with; zero in a passthrough block.
RESIDUAL_OUTPUTS = ("attn_output.weight", "ffn_down.weight")


def is_passthrough(name: str, spec: SynthSpec) -> bool:
    """Whether tensor ``name`` belongs to one of the passthrough blocks."""
    if not name.startswith("blk."):
        return False
    return int(name.split(".")[1]) >= spec.layers


def _weights(
    rng: np.random.Generator, name: str, shape: tuple[int, ...], spec: SynthSpec
) -> npt.NDArray[np.float32]:
    if len(shape) == 1:  # norms: identity scale, the usual initialisation
        return np.ones(shape, dtype=np.float32)
    if is_passthrough(name, spec) and name.endswith(RESIDUAL_OUTPUTS):
        return np.zeros(shape, dtype=np.float32)
    std = {"output.weight": spec.output_scale, "token_embd.weight": spec.embd_scale}.get(
        name, WEIGHT_STD
    )
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _add_tensor(
    writer: gguf.GGUFWriter, name: str, data: npt.NDArray[np.float32], spec: SynthSpec
) -> None:
    if data.ndim == 1:
        writer.add_tensor(name, data)
    elif spec.type == "q8_0":
        qtype = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    elif spec.type == "f32":
        writer.add_tensor(name, data)
    else:
        writer.add_tensor(name, data.astype(np.float16))


def _write(spec: SynthSpec, tokenizer: list[KeyValue], path: Path) -> None:
    n_vocab = vocab_size(tokenizer)
    writer = gguf.GGUFWriter(path, ARCH)
    blocks = f"L{spec.layers}+{spec.passthrough}" if spec.passthrough else f"L{spec.layers}"
    writer.add_name(
        f"llamanix-synth {blocks} E{spec.embd} F{spec.ff} H{spec.heads}/{spec.kv_heads} "
        f"seed {spec.seed} {spec.type} embd x{spec.embd_scale:g} out x{spec.output_scale:g}"
    )
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.embd)
    writer.add_block_count(spec.blocks)
    writer.add_feed_forward_length(spec.ff)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(int(FILE_TYPES[spec.type]))
    for kv in tokenizer:
        writer.add_key_value(kv.key, kv.value, kv.type, sub_type=kv.sub_type)
    rng = np.random.default_rng(spec.seed)
    # A stream of its own for the passthrough blocks: the real blocks and the output head
    # draw the same numbers with or without them, which is what makes a draft agree.
    passthrough_rng = np.random.default_rng([spec.seed, 1])
    for name, shape in tensor_shapes(spec, n_vocab):
        stream = passthrough_rng if is_passthrough(name, spec) else rng
        _add_tensor(writer, name, _weights(stream, name, shape, spec), spec)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def synth_model(spec: SynthSpec, out: Path) -> Path:
    """Write the model described by ``spec`` to ``out`` (atomically) and return ``out``."""
    check_spec(spec)
    tokenizer = tokenizer_from(spec.vocab) if spec.vocab is not None else builtin_tokenizer()
    with tempfile.TemporaryDirectory(prefix="llamanix-synth.") as tmp:
        staged = Path(tmp) / "model.gguf"
        _write(spec, tokenizer, staged)
        atomic_write(out, staged.read_bytes())
    return out
