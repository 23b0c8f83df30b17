"""llamanix inspect: what a GGUF holds, checked on synthetic models, vocab files and the server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
import pytest
from cli_run import invoke, server_argv

from llamanix.model.gguf_info import read_gguf, read_vocab, vocab_mismatch
from llamanix.server.server_log import parse_server_log
from llamanix.testbed.synth import SynthSpec, tokenizer_from

if TYPE_CHECKING:
    from conftest import ServerFactory, SynthModels


def write_arch_gguf(
    path: Path,
    arch: str,
    kv: dict[str, Any],
    tensors: dict[str, tuple[int, ...]],
    vocab: Path | None = None,
) -> Path:
    """A GGUF with real metadata and small real tensors (zeros): enough for inspect, not to run.

    ``kv`` keys may use ``{arch}``; ints become UINT32, lists of ints INT32 arrays.
    """
    writer = gguf.GGUFWriter(path, arch)
    for key, value in kv.items():
        key = key.replace("{arch}", arch)
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_string(key, str(value))
    if vocab is not None:
        for item in tokenizer_from(vocab):
            writer.add_key_value(item.key, item.value, item.type, sub_type=item.sub_type)
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def qwen35_like(path: Path, vocab: Path | None = None) -> Path:
    """A Qwen3.5/3.6-shaped hybrid: 7 trunk blocks (attention every 4th) and one MTP block."""
    tensors: dict[str, tuple[int, ...]] = {"token_embd.weight": (64, 16)}
    for i in range(8):
        tensors[f"blk.{i}.attn_norm.weight"] = (16,)
        tensors[f"blk.{i}.ffn_up_exps.weight"] = (4, 16, 16)
    for i in (0, 1, 2, 4, 5, 6):
        tensors[f"blk.{i}.ssm_conv1d.weight"] = (8, 4)
    tensors["blk.7.nextn.eh_proj.weight"] = (16, 32)
    tensors["output.weight"] = (64, 16)
    return write_arch_gguf(
        path,
        "qwen35",
        {
            "{arch}.block_count": 8,
            "{arch}.nextn_predict_layers": 1,
            "{arch}.full_attention_interval": 4,
            "{arch}.context_length": 262144,
            "{arch}.embedding_length": 1024,
            "{arch}.attention.head_count": 8,
            "{arch}.attention.head_count_kv": 2,
            "{arch}.attention.key_length": 128,
            "{arch}.attention.value_length": 128,
            "{arch}.ssm.conv_kernel": 4,
            "{arch}.ssm.inner_size": 2048,
            "{arch}.ssm.state_size": 128,
            "{arch}.ssm.group_count": 16,
            "{arch}.ssm.time_step_rank": 32,
            "{arch}.expert_count": 4,
            "{arch}.expert_used_count": 1,
        },
        tensors,
        vocab,
    )


def run(*args: str) -> tuple[int, str, str]:
    result = invoke(*args)
    return result.exit_code, result.stdout, result.stderr


def test_synthetic_model(synth_models: SynthModels) -> None:
    spec = SynthSpec()  # the shape the fixture's models use
    info = read_gguf(synth_models.target)
    assert info.architecture == "llama"
    assert info.block_count == spec.layers == info.attention_layers
    assert info.recurrent_layers == 0 and info.nextn_layers == 0
    assert not info.has_mtp and not info.is_hybrid
    assert (info.head_count, info.head_count_kv) == (spec.heads, spec.kv_heads)
    assert info.head_dim_k == info.head_dim_v == spec.head_dim
    assert info.vocab_size == 32000 and info.tokenizer_model == "llama"
    assert info.context_length == spec.context
    per_layer = (
        spec.embd * spec.embd * 2
        + 2 * spec.kv_heads * spec.head_dim * spec.embd
        + 3 * spec.embd * spec.ff
        + 2 * spec.embd
    )
    assert info.parameter_count == 2 * 32000 * spec.embd + spec.layers * per_layer + spec.embd
    assert info.file_bytes == synth_models.target.stat().st_size > info.tensor_bytes
    assert set(info.tensor_types) == {"F16", "F32"}
    # K and V of every layer: kv_heads x head_dim elements each, 2 bytes in f16.
    kv_f16 = spec.layers * 2 * spec.kv_heads * spec.head_dim * 2
    assert info.kv_bytes_per_token() == kv_f16
    assert info.kv_bytes_per_token("q8_0", "q8_0") == kv_f16 / 2 * 34 / 32
    assert info.kv_bytes_per_token("q4_0", "f16") == kv_f16 / 2 * (18 / 32 / 2 + 1)


def test_inspect_cli_table_and_json(synth_models: SynthModels) -> None:
    code, out, err = run("model", "inspect", str(synth_models.target))
    assert code == 0, err
    for text in ("llama", "32000", "KV bytes / token", "q8_0", "MTP (nextn) layers"):
        assert text in out
    code, out, _ = run("model", "inspect", str(synth_models.target), "--json")
    data = json.loads(out)
    for key in (
        "architecture",
        "parameter_count",
        "file_bytes",
        "tensor_types",
        "vocab_size",
        "context_length",
        "block_count",
        "head_count",
        "head_count_kv",
        "head_dim_k",
        "head_dim_v",
        "kv_bytes_per_token",
        "has_mtp",
        "is_hybrid",
        "is_recurrent",
    ):
        assert key in data
    assert set(data["kv_bytes_per_token"]) >= {"f16", "q8_0", "q4_0", "f32", "bf16"}


@pytest.mark.parametrize(
    ("name", "size", "model"),
    [
        ("ggml-vocab-llama-spm.gguf", 32000, "llama"),
        ("ggml-vocab-qwen2.gguf", 151936, "gpt2"),
        ("ggml-vocab-gpt-2.gguf", 50257, "gpt2"),
    ],
)
def test_vocab_files(vocab_dir: Path, name: str, size: int, model: str) -> None:
    info = read_gguf(vocab_dir / name)
    assert info.vocab_size == size
    assert info.tokenizer_model == model
    assert info.tensor_bytes == 0 and info.parameter_count == 0
    code, out, _ = run("model", "inspect", str(vocab_dir / name), "--json")
    assert code == 0 and json.loads(out)["vocab_size"] == size


def test_vocab_comparison_follows_llama_cpp(vocab_dir: Path, synth_models: SynthModels) -> None:
    spm = read_vocab(vocab_dir / "ggml-vocab-llama-spm.gguf")
    assert vocab_mismatch(spm, read_vocab(synth_models.target)) is None
    assert (
        vocab_mismatch(read_vocab(synth_models.target), read_vocab(synth_models.unrelated_draft))
        is None
    )
    why = vocab_mismatch(spm, read_vocab(synth_models.other_vocab_draft))
    assert why is not None and "tokenizer type" in why
    why = vocab_mismatch(
        read_vocab(vocab_dir / "ggml-vocab-qwen2.gguf"),
        read_vocab(vocab_dir / "ggml-vocab-llama-bpe.gguf"),
    )
    assert why is not None and "differ" in why


def test_hybrid_mtp_moe(tmp_path: Path) -> None:
    info = read_gguf(qwen35_like(tmp_path / "qwen35.gguf"))
    assert info.has_mtp and info.nextn_layers == 1
    assert info.is_hybrid and info.is_recurrent
    # Blocks 0-6 are the trunk; every 4th (block 3) is attention, block 7 is the MTP block.
    assert info.recurrent_layers == 6
    assert info.attention_layers == 2
    assert info.kv_bytes_per_token() == 2 * (2 * 128 + 2 * 128) * 2
    # Mamba-style state per recurrent block: conv (d_conv-1)(d_inner+2 groups d_state) + ssm.
    assert info.recurrent_state_bytes == 6 * 4 * (3 * (2048 + 2 * 16 * 128) + 128 * 2048)
    assert (info.expert_count, info.expert_used_count) == (4, 1)
    dense = info.tensor_bytes - info.token_embd_bytes - info.expert_tensor_bytes
    assert info.weight_bytes_per_token() == dense + info.expert_tensor_bytes / 4
    code, out, _ = run("model", "inspect", str(tmp_path / "qwen35.gguf"))
    assert code == 0 and "hybrid" in out and "1 MTP" in out and "1 of 4" in out


def test_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03\x00")
    for path in (tmp_path / "x.gguf", tmp_path / "missing.gguf"):
        code, out, err = run("model", "inspect", str(path))
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.server
@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_kv_bytes_match_the_server(
    llama_server_bin: Path,
    synth_models: SynthModels,
    server_factory: ServerFactory,
    cache_type: str,
) -> None:
    """The KV cache llama-server allocates is what inspect says one token costs x context."""
    context = 2048
    info = read_gguf(synth_models.target)
    server = server_factory(
        server_argv(
            llama_server_bin,
            synth_models.target,
            "-lv",
            "4",
            "-fa",
            "on",
            "-ctk",
            cache_type,
            "-ctv",
            cache_type,
            ctx=context,
            parallel=1,
            threads=1,
        )
    )
    log = parse_server_log(server.log_text())
    expected_mib = info.kv_bytes_per_token(cache_type, cache_type) * context / 2**20
    assert log.kv_buffer_mib == pytest.approx(expected_mib, rel=0.01)
    assert log.build is not None and "0c1e570" in log.build
