"""Synthetic GGUF models: deterministic bytes, readable metadata, and a real server loads them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import gguf
import httpx
import numpy as np
import pytest
from cli_run import server_argv
from click.testing import CliRunner

from llamanix.cli import main
from llamanix.testbed.synth import SynthSpec, synth_model

if TYPE_CHECKING:
    from conftest import ServerFactory, SynthModels


def _field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    a = synth_model(SynthSpec(seed=7), tmp_path / "a.gguf")
    b = synth_model(SynthSpec(seed=7), tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()


def test_same_arguments_same_bytes_with_copied_vocab(tmp_path: Path, vocab_dir: Path) -> None:
    spm = vocab_dir / "ggml-vocab-llama-spm.gguf"
    a = synth_model(SynthSpec(vocab=spm, layers=1), tmp_path / "a.gguf")
    b = synth_model(SynthSpec(vocab=spm, layers=1), tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()


def test_other_seed_other_weights(tmp_path: Path) -> None:
    a = gguf.GGUFReader(synth_model(SynthSpec(seed=1), tmp_path / "a.gguf"))
    b = gguf.GGUFReader(synth_model(SynthSpec(seed=2), tmp_path / "b.gguf"))
    ta = {t.name: np.array(t.data) for t in a.tensors}
    tb = {t.name: np.array(t.data) for t in b.tensors}
    assert ta.keys() == tb.keys()
    assert not np.array_equal(ta["blk.0.attn_q.weight"], tb["blk.0.attn_q.weight"])
    # Norms are ones in both: only the random matrices depend on the seed.
    assert np.array_equal(ta["output_norm.weight"], tb["output_norm.weight"])


def test_metadata_and_shapes_read_back(tmp_path: Path, vocab_dir: Path) -> None:
    spm = vocab_dir / "ggml-vocab-llama-spm.gguf"
    spec = SynthSpec(layers=3, embd=128, ff=192, heads=4, kv_heads=2, context=2048, vocab=spm)
    reader = gguf.GGUFReader(synth_model(spec, tmp_path / "m.gguf"))
    source = gguf.GGUFReader(spm)

    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == 3
    assert _field(reader, "llama.embedding_length") == 128
    assert _field(reader, "llama.feed_forward_length") == 192
    assert _field(reader, "llama.attention.head_count") == 4
    assert _field(reader, "llama.attention.head_count_kv") == 2
    assert _field(reader, "llama.context_length") == 2048
    assert _field(reader, "llama.rope.dimension_count") == 32
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert tokens == _field(source, "tokenizer.ggml.tokens")
    assert _field(reader, "llama.vocab_size") == len(tokens) == 32000
    # Every tokenizer entry of the vocab file came along, values and all.
    copied = {k for k in reader.fields if k.startswith("tokenizer.")}
    assert copied == {k for k in source.fields if k.startswith("tokenizer.")}
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.pre"):
        assert _field(reader, key) == _field(source, key)

    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    # ggml order: (columns, rows)
    assert shapes["token_embd.weight"] == (128, 32000)
    assert shapes["output.weight"] == (128, 32000)
    assert shapes["blk.2.attn_k.weight"] == (128, 64)  # 2 kv heads x head dim 32
    assert shapes["blk.0.ffn_down.weight"] == (192, 128)
    assert len([n for n in shapes if n.startswith("blk.")]) == 3 * 9


def test_other_vocab_other_tokenizer(tmp_path: Path, vocab_dir: Path) -> None:
    spm = gguf.GGUFReader(
        synth_model(SynthSpec(vocab=vocab_dir / "ggml-vocab-llama-spm.gguf"), tmp_path / "a.gguf")
    )
    gpt2 = gguf.GGUFReader(
        synth_model(SynthSpec(vocab=vocab_dir / "ggml-vocab-gpt-2.gguf"), tmp_path / "b.gguf")
    )
    assert _field(spm, "tokenizer.ggml.model") == "llama"
    assert _field(gpt2, "tokenizer.ggml.model") == "gpt2"
    assert _field(gpt2, "llama.vocab_size") == 50257
    assert "tokenizer.ggml.merges" in gpt2.fields


def test_builtin_vocab_is_small_spm(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(synth_model(SynthSpec(), tmp_path / "m.gguf"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert "<0x41>" in tokens
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert len(tokens) < 1000


def test_q8_0_weights(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(synth_model(SynthSpec(type="q8_0"), tmp_path / "m.gguf"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["output.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert _field(reader, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q8_0)


def test_cli_writes_the_same_bytes_as_the_api(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["testbed", "synth-model", str(tmp_path / "cli.gguf"), "--layers", "1", "--seed", "5"]
    )
    assert result.exit_code == 0, result.output
    api = synth_model(SynthSpec(layers=1, seed=5), tmp_path / "api.gguf")
    assert (tmp_path / "cli.gguf").read_bytes() == api.read_bytes()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--heads", "3"], "--heads"),
        (["--kv-heads", "3", "--heads", "4"], "--kv-heads"),
        (["--type", "q8_0", "--ff", "100"], "--type"),
        (["--layers", "0"], "--layers"),
        (["--output-scale", "0"], "--output-scale"),
        (["--passthrough", "-1"], "--passthrough"),
        (["--vocab", "no-such-vocab"], "--vocab"),
        (["--vocab", "/nonexistent/vocab.gguf"], "--vocab"),
    ],
)
def test_bad_arguments_one_line_exit_2_nothing_written(
    tmp_path: Path, args: list[str], field: str
) -> None:
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(main, ["testbed", "synth-model", str(out), *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"llamanix testbed synth-model: {field}: ")
    assert "Traceback" not in result.output
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_not_a_gguf_vocab_is_a_user_error(tmp_path: Path) -> None:
    bogus = tmp_path / "vocab.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    result = CliRunner().invoke(
        main, ["testbed", "synth-model", str(tmp_path / "m.gguf"), "--vocab", str(bogus)]
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("llamanix testbed synth-model: --vocab: ")
    assert not (tmp_path / "m.gguf").exists()


# --- a target and a draft that agree: passthrough blocks ------------------------------------

SMALL_DRAFT = SynthSpec(layers=1, embd=128, ff=512, heads=2, kv_heads=2, seed=3, type="f32")
SMALL_TARGET = SynthSpec(
    layers=1, passthrough=5, embd=128, ff=512, heads=2, kv_heads=2, seed=3, type="f32"
)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


def test_passthrough_target_holds_the_draft_and_zeroed_blocks(tmp_path: Path) -> None:
    draft = _tensors(synth_model(SMALL_DRAFT, tmp_path / "draft.gguf"))
    target_path = synth_model(SMALL_TARGET, tmp_path / "target.gguf")
    target = _tensors(target_path)
    # Every tensor of the draft is in the target, the same numbers: embeddings, the real
    # block, the output head.
    for name, data in draft.items():
        assert np.array_equal(target[name], data), name
    extra = sorted({n.split(".")[1] for n in target.keys() - draft.keys()}, key=int)
    assert extra == ["1", "2", "3", "4", "5"]
    for i in extra:
        # Nothing added to the residual stream ...
        assert not target[f"blk.{i}.attn_output.weight"].any()
        assert not target[f"blk.{i}.ffn_down.weight"].any()
        # ... by blocks that still do real matmuls with real (random) weights.
        for part in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            assert np.abs(target[f"blk.{i}.{part}.weight"]).mean() > 0.01
    reader = gguf.GGUFReader(target_path)
    assert _field(reader, "llama.block_count") == 6
    assert _field(reader, "general.file_type") == int(gguf.LlamaFileType.ALL_F32)
    assert reader.tensors[1].tensor_type == gguf.GGMLQuantizationType.F32


def test_cli_passthrough_and_f32(tmp_path: Path) -> None:
    args = ["--layers", "1", "--embd", "128", "--ff", "512", "--seed", "3", "--type", "f32"]
    result = CliRunner().invoke(
        main, ["testbed", "synth-model", str(tmp_path / "t.gguf"), *args, "--passthrough", "5"]
    )
    assert result.exit_code == 0, result.output
    api = synth_model(SMALL_TARGET, tmp_path / "api.gguf")
    assert (tmp_path / "t.gguf").read_bytes() == api.read_bytes()


@pytest.mark.server
def test_passthrough_target_accepts_what_its_draft_drafts(
    llama_server_bin: Path, tmp_path: Path, server_factory: ServerFactory
) -> None:
    """Temperature 0: the draft predicts the target's own tokens, so nearly all are accepted."""
    draft = synth_model(SMALL_DRAFT, tmp_path / "draft.gguf")
    target = synth_model(SMALL_TARGET, tmp_path / "target.gguf")
    server = server_factory(
        server_argv(
            llama_server_bin,
            target,
            *("--spec-type", "draft-simple", "--spec-draft-model", str(draft)),
            *("--spec-draft-n-max", "8", "--spec-draft-p-min", "0.6"),
            ctx=1024,
            parallel=1,
            threads=2,
        )
    )
    reply = httpx.post(
        f"{server.url}/completion",
        json={"prompt": "hello world", "n_predict": 64, "temperature": 0},
        timeout=120,
    ).json()
    timings = reply["timings"]
    assert timings["predicted_n"] == 64
    assert timings["draft_n"] >= 32
    assert timings["draft_n_accepted"] / timings["draft_n"] >= 0.9


@pytest.mark.server
def test_default_shape_serves_with_quantized_kv_cache(
    llama_server_bin: Path, synth_models: SynthModels, server_factory: ServerFactory
) -> None:
    """head_dim 64 divides the q8_0/q4_0 block size, so quantized caches load."""
    server = server_factory(
        server_argv(
            llama_server_bin,
            synth_models.target,
            *("-fa", "on", "-ctk", "q8_0", "-ctv", "q4_0"),
            ctx=1024,
            parallel=1,
            threads=2,
        )
    )
    reply = httpx.post(
        f"{server.url}/completion",
        json={"prompt": "hello world", "n_predict": 8, "temperature": 0},
        timeout=60,
    ).json()
    assert reply["timings"]["predicted_n"] == 8


@pytest.mark.server
def test_builtin_vocab_model_serves(
    llama_server_bin: Path, synth_models: SynthModels, server_factory: ServerFactory
) -> None:
    server = server_factory(
        server_argv(llama_server_bin, synth_models.builtin_vocab, ctx=512, parallel=1, threads=2)
    )
    tokens = httpx.post(
        f"{server.url}/tokenize", json={"content": "hello world"}, timeout=30
    ).json()["tokens"]
    assert 1 <= len(tokens) <= 4  # "▁hello", "▁world" are pieces of the built-in vocab
    reply = httpx.post(
        f"{server.url}/completion",
        json={"prompt": "hello world", "n_predict": 8, "temperature": 0},
        timeout=60,
    ).json()
    assert reply["timings"]["predicted_n"] == 8


@pytest.mark.server
def test_q8_0_model_serves(
    llama_server_bin: Path, tmp_path: Path, server_factory: ServerFactory
) -> None:
    model = synth_model(SynthSpec(type="q8_0"), tmp_path / "q8.gguf")
    # --no-repack: this upstream build's AMX q8_0 kernel crashes on tiny matrices
    # (SIGSEGV in ggml_backend_amx_mul_mat on AMX CPUs); plain kernels are fine.
    server = server_factory(
        server_argv(llama_server_bin, model, "--no-repack", ctx=512, parallel=1, threads=2)
    )
    reply = httpx.post(
        f"{server.url}/completion", json={"prompt": "hi", "n_predict": 4}, timeout=60
    ).json()
    assert reply["timings"]["predicted_n"] == 4
