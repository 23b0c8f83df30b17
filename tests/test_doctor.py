"""llamanix doctor: each finding from a real case, and silence on a healthy instance.

Servers are started from the config's own rendered command line (``llamanix.argv``), with the
instance's ``binary`` pointing at the real llama-server. journalctl and nvidia-smi cannot run
here: recording stand-ins on PATH check the exact command lines and replay recorded output.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cli_run import invoke, server_argv
from click.testing import CliRunner, Result
from standins import recorded_argv, stand_in
from test_inspect import qwen35_like

from llamanix.cli import main
from llamanix.config.argv import instance_argv
from llamanix.config.model import load_config
from llamanix.core.variants import VARIANTS
from llamanix.diagnose.doctor import parse_nvidia_smi
from llamanix.external.journalctl import journalctl_argv
from llamanix.external.llama_server import ServerStartError
from llamanix.external.nvidia import NVIDIA_SMI_ARGV
from llamanix.server.server_process import LlamaServer, free_port

if TYPE_CHECKING:
    from conftest import SynthModels

DATA = Path(__file__).parent / "data"


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # TOML strings, numbers, booleans and arrays read the same


def write_config(
    path: Path,
    host: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **instance: Any,
) -> Path:
    lines = ["[hosts.local]", 'kind = "systemd"']
    # A binary for every variant, where the test names none (its own, or the instance's).
    host = {"binaries": {v: f"/opt/{v}/bin/llama-server" for v in VARIANTS}, **(host or {})}
    lines += [f"{k} = {toml_value(v)}" for k, v in host.items()]
    lines += ["", "[instances.main]", 'host = "local"']
    lines += [f"{k} = {toml_value(v)}" for k, v in instance.items()]
    if spec:
        lines += ["", "[instances.main.speculative]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in spec.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


doctor = partial(invoke, "doctor")


def findings(result: Result) -> dict[str, dict[str, Any]]:
    data = json.loads(result.stdout)
    return {f["code"]: f for f in data["findings"]}


def server_from_config(config: Path, log: Path) -> LlamaServer:
    return LlamaServer(instance_argv(load_config(config), "main"), log)


def complete(url: str, tokens: int = 48) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": "Write a haiku about GPUs."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    resp.raise_for_status()
    timings: dict[str, Any] = resp.json()["timings"]
    return timings


def wait_for_timing_lines(server: LlamaServer) -> str:
    deadline = time.monotonic() + 10
    while "eval time" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.log_text()


def instance(models: SynthModels, binary: Path, **extra: Any) -> dict[str, Any]:
    return {
        "binary": str(binary),
        "model": str(models.target),
        "port": free_port(),
        "context": 2048,
        "parallel": 1,
        "threads": 1,
        **extra,
    }


GPU_HOST = {"gpu": "rtx3090", "cuda_archs": ["8.6"]}


# --- healthy -------------------------------------------------------------------------------


@pytest.mark.server
def test_healthy_instance_is_quiet(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "llamanix.toml",
        GPU_HOST,
        {"type": "draft", "draft_model": str(synth_models.target)},
        **instance(synth_models, llama_server_bin, variant="upstream"),
    )
    with server_from_config(config, tmp_path / "server.log") as server:
        timings = complete(server.url)
        assert timings["draft_n"] > 0  # really speculating
        log = tmp_path / "saved.log"
        log.write_text(wait_for_timing_lines(server))
        result = doctor(str(config), "main", "--log", str(log), "--url", server.url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # A synthetic model carries no chat template (llama-server falls back to chatml), which is
    # all doctor has to say, and only as a warning.
    assert [(f["code"], f["severity"]) for f in data["findings"]] == [
        ("no-chat-template", "warning")
    ]
    assert data["ok"] and data["checks"]["chat-template"] == "finding"
    for check in (
        "vocab",
        "vram",
        "flash-attn",
        "cuda-arch",
        "spec-log",
        "spec-probe",
        "acceptance",
    ):
        assert data["checks"][check] == "ok", (check, data["checks"])
    text = doctor(str(config), "main", "--log", str(log))
    assert text.exit_code == 0
    lines = text.stdout.strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("  fix: send raw text to /completion")
    assert lines[0].startswith("warning main: target.gguf has no chat template of its own")
    # A loopback instance needs no key: the key-file check says why it did not run.
    assert lines[2] == "key-file: skipped: no api_key_file"
    assert data["checks"]["key-file"] == "skipped: no api_key_file"


# --- each finding from a real case ---------------------------------------------------------


def test_vocabulary_mismatch_from_the_ggufs(synth_models: SynthModels, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.other_vocab_draft)},
        model=str(synth_models.target),
    )
    result = doctor(str(config), "--json")
    assert result.exit_code == 1
    found = findings(result)["vocab-mismatch"]
    assert found["severity"] == "error" and "tokenizer type differs" in found["message"]
    assert found["fix"]
    text = doctor(str(config))
    assert text.exit_code == 1 and "error main:" in text.stdout and "fix:" in text.stdout


@pytest.mark.server
def test_vocabulary_mismatch_from_the_log(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.other_vocab_draft)},
        **instance(synth_models, llama_server_bin),
    )
    with server_from_config(config, tmp_path / "server.log") as server:
        assert "draft_n" not in complete(server.url)
        log = tmp_path / "saved.log"
        log.write_text(wait_for_timing_lines(server))
    # The same config without the GGUF check (draft file gone): the log alone tells.
    missing_draft = tmp_path / "moved.gguf"
    config2 = write_config(
        tmp_path / "c2.toml",
        None,
        {"type": "draft", "draft_model": str(missing_draft)},
        model=str(synth_models.target),
    )
    result = doctor(str(config2), "main", "--log", str(log), "--json")
    assert result.exit_code == 1
    assert "not compatible" in findings(result)["vocab-mismatch"]["message"]


@pytest.mark.server
def test_loaded_but_not_drafting(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    """The nixpkgs variant's -md, run by an upstream binary: the draft loads and never drafts."""
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.target)},
        **instance(synth_models, llama_server_bin, variant="nixpkgs"),
    )
    assert "--spec-type" not in instance_argv(load_config(config), "main")
    with server_from_config(config, tmp_path / "server.log") as server:
        assert "draft_n" not in complete(server.url)
        log = tmp_path / "saved.log"
        log.write_text(wait_for_timing_lines(server))
        by_log = doctor(str(config), "main", "--log", str(log), "--json")
        by_probe = doctor(str(config), "main", "--url", server.url, "--json")
    for result in (by_log, by_probe):
        assert result.exit_code == 1
        found = findings(result)["spec-not-drafting"]
        assert found["severity"] == "error"
    assert "loaded" in findings(by_log)["spec-not-drafting"]["message"]
    assert "draft_n" in findings(by_probe)["spec-not-drafting"]["message"]


@pytest.mark.server
def test_unrelated_draft_low_acceptance(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.unrelated_draft), "p_min": 0.0},
        **instance(synth_models, llama_server_bin, variant="upstream"),
    )
    with server_from_config(config, tmp_path / "server.log") as server:
        result = doctor(str(config), "main", "--url", server.url, "--json")
    found = findings(result)["spec-low-acceptance"]
    assert found["severity"] == "warning"
    assert result.exit_code == 0  # a warning: it works, it just does not pay


def test_recorded_refusal(synth_models: SynthModels, tmp_path: Path) -> None:
    """A user's log line (b8770, hybrid model): speculation requested, refused at start-up."""
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.target)},
        model=str(synth_models.target),
        variant="nixpkgs",
    )
    result = doctor(str(config), "main", "--log", str(DATA / "seed000-b8770-refused.log"), "--json")
    assert result.exit_code == 1
    assert findings(result)["spec-refused"]["severity"] == "error"


def test_hybrid_model_on_a_variant_without_checkpoints(
    vocab_dir: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    hybrid = qwen35_like(tmp_path / "qwen35.gguf", vocab_dir / "ggml-vocab-llama-spm.gguf")
    spec = {"type": "draft", "draft_model": str(synth_models.target)}
    bad = write_config(tmp_path / "bad.toml", None, spec, model=str(hybrid), variant="nixpkgs")
    result = doctor(str(bad), "--json")
    assert result.exit_code == 1
    found = findings(result)["hybrid-no-checkpoint"]
    assert "qwen35" in found["message"] and "upstream" in found["fix"]
    good = write_config(tmp_path / "good.toml", None, spec, model=str(hybrid), variant="upstream")
    assert "hybrid-no-checkpoint" not in findings(doctor(str(good), "--json"))


def test_vram_budget_exceeds_the_gpu(synth_models: SynthModels, tmp_path: Path) -> None:
    # 2 KiB of f32 KV per token x 16M tokens = 33 GB, more than a 24 GiB RTX 3090.
    config = write_config(
        tmp_path / "c.toml",
        GPU_HOST,
        None,
        model=str(synth_models.target),
        context=16_000_000,
        cache_type_k="f32",
        cache_type_v="f32",
    )
    result = doctor(str(config), "--json")
    assert result.exit_code == 1
    found = findings(result)["vram"]
    assert found["severity"] == "error" and "24 GiB" in found["message"]
    # --gpu overrides the host's card: an H200 holds it.
    assert "vram" not in findings(doctor(str(config), "--gpu", "h200", "--json"))


def test_quantized_v_without_flash_attention(synth_models: SynthModels, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml",
        None,
        None,
        model=str(synth_models.target),
        cache_type_k="q4_0",
        cache_type_v="q4_0",
        extra_args=["-fa", "off"],
    )
    result = doctor(str(config), "--json")
    assert result.exit_code == 1
    assert findings(result)["quantized-v-without-fa"]["severity"] == "error"


@pytest.mark.server
def test_quantized_v_without_flash_attention_from_the_log(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    """The real server refuses to start; its log is what doctor reads."""
    log = tmp_path / "server.log"
    argv = server_argv(
        llama_server_bin, synth_models.target, "-ctv", "q4_0", "-fa", "off", ctx=512, threads=1
    )
    with pytest.raises(ServerStartError):
        LlamaServer(argv, log, start_timeout_s=60).start()
    config = write_config(tmp_path / "c.toml", None, None, model=str(synth_models.target))
    result = doctor(str(config), "main", "--log", str(log), "--json")
    assert result.exit_code == 1
    assert "quantized-v-without-fa" in findings(result)


@pytest.mark.server
def test_speculative_bench_slower_than_baseline(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    """A draft that is rarely accepted, asked for 16 tokens a step, costs many times what it
    saves: the gap is an order of magnitude, far outside the noise of a shared machine. Swept
    over two lengths, the crossover check says it loses at the length the requests average."""
    results = []
    for label, extra in (
        ("base", []),
        (
            "spec",
            [
                "--spec-type",
                "draft-simple",
                "--spec-draft-model",
                str(synth_models.unrelated_draft),
                "--spec-draft-n-max",
                "16",
                "--spec-draft-p-min",
                "0",
            ],
        ),
    ):
        argv = server_argv(
            llama_server_bin, synth_models.target, *extra, ctx=1024, parallel=1, threads=1
        )
        with LlamaServer(argv, tmp_path / f"{label}.log") as server:
            out = tmp_path / f"{label}.json"
            bench = CliRunner().invoke(
                main,
                [
                    "bench",
                    "--url",
                    server.url,
                    "--prompts",
                    "builtin:fibonacci",
                    "--max-tokens",
                    "32,96",
                    "--runs",
                    "3",
                    "--warmup",
                    "1",
                    "--label",
                    label,
                    "-o",
                    str(out),
                ],
            )
            assert bench.exit_code == 0, bench.output
            results.append(out)
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.target)},
        model=str(synth_models.target),
    )
    benches = ["--bench", str(results[0]), "--bench", str(results[1])]
    result = doctor(str(config), "main", *benches, "--json")
    found = findings(result)["spec-slower"]
    assert found["severity"] == "warning" and "spec vs base" in found["message"]
    # Decoding several times slower, the draft loses from a few tokens on (or at every length,
    # where its fixed cost is also higher): either way it loses at 500 tokens.
    result = doctor(str(config), "main", *benches, "--avg-output-tokens", "500", "--json")
    crossing = findings(result)["spec-crossover"]
    assert crossing["severity"] == "warning"
    assert crossing["message"].startswith(
        ("speculation wins only below ", "speculation never pays on wall clock")
    )
    assert "(fibonacci, spec vs base); your requests average 500" in crossing["message"]
    assert json.loads(result.stdout)["checks"]["spec-crossover"] == "finding"
    # Without --avg-output-tokens it compares with what the bench generated: (32 + 96) / 2.
    result = doctor(str(config), "main", *benches, "--json")
    assert "the benched requests average 64" in findings(result)["spec-crossover"]["message"]


def test_avg_output_tokens_must_be_positive(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", None, None, model="/nonexistent.gguf")
    result = doctor(str(config), "main", "--avg-output-tokens", "0")
    assert result.exit_code == 2 and result.stdout == ""
    assert "--avg-output-tokens" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --- external commands: exact argv, recorded output ----------------------------------------


def test_journal_reads_the_unit_log(synth_models: SynthModels, tmp_path: Path) -> None:
    record = stand_in(tmp_path / "bin", "journalctl", DATA / "seed000-b8770-refused.log")
    config = write_config(
        tmp_path / "c.toml",
        None,
        {"type": "draft", "draft_model": str(synth_models.target)},
        model=str(synth_models.target),
        variant="nixpkgs",
    )
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    result = doctor(str(config), "main", "--journal", "--json", env=env)
    assert recorded_argv(record) == [
        "journalctl",
        "-u",
        "llamanix-main.service",
        "-n",
        "500",
        "--no-pager",
        "-o",
        "cat",
    ]
    assert result.exit_code == 1 and "spec-refused" in findings(result)
    assert journalctl_argv("x.service", user=True)[:2] == ["journalctl", "--user"]


def test_journal_of_a_remote_host_is_refused(synth_models: SynthModels, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml", {"target": "root@gpu1"}, None, model=str(synth_models.target)
    )
    result = doctor(str(config), "main", "--journal")
    assert result.exit_code == 2
    assert "hosts.local.target" in result.stderr and "--log" in result.stderr


def test_nvidia_smi_compute_capability(synth_models: SynthModels, tmp_path: Path) -> None:
    smi_out = tmp_path / "smi.txt"
    smi_out.write_text("NVIDIA GeForce RTX 5090, 12.0, 32607 MiB\n")
    record = stand_in(tmp_path / "bin", "nvidia-smi", smi_out)
    # Built for Ampere only, running on Blackwell: PTX JIT on first use.
    config = write_config(
        tmp_path / "c.toml", {"cuda_archs": ["8.6"]}, None, model=str(synth_models.target)
    )
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    result = doctor(str(config), "--json", env=env)
    assert (
        recorded_argv(record)
        == list(NVIDIA_SMI_ARGV)
        == ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader"]
    )
    found = findings(result)["cuda-arch"]
    assert found["severity"] == "warning" and "12.0" in found["message"]
    assert '"12.0"' in found["fix"]
    # The card nvidia-smi named also sized the VRAM check.
    assert json.loads(result.stdout)["checks"]["vram"] == "ok"
    fixed = write_config(
        tmp_path / "fixed.toml",
        {"cuda_archs": ["8.6", "12.0"]},
        None,
        model=str(synth_models.target),
    )
    assert "cuda-arch" not in findings(doctor(str(fixed), "--json", env=env))


def test_parse_nvidia_smi() -> None:
    (a, b) = parse_nvidia_smi(
        "NVIDIA GeForce RTX 3090, 8.6, 24576 MiB\nNVIDIA H100 PCIe, 9.0, [N/A]\n"
    )
    assert (a.name, a.compute_capability, a.memory_mib) == ("NVIDIA GeForce RTX 3090", "8.6", 24576)
    assert b.memory_mib is None


# --- usage errors --------------------------------------------------------------------------


def test_usage_errors(synth_models: SynthModels, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", None, None, model=str(synth_models.target))
    two = tmp_path / "two.toml"
    two.write_text(
        config.read_text() + '\n[instances.other]\nhost = "local"\n'
        f'model = "{synth_models.target}"\nport = 8081\n'
    )
    for args in (
        [str(config), "nonesuch"],
        [str(two), "--log", str(DATA / "upstream-plain.log")],
        [str(config), "--log", str(tmp_path / "missing.log")],
        [str(config), "--log", str(DATA / "upstream-plain.log"), "--journal"],
        [str(config), "--gpu", "voodoo2"],
        [str(tmp_path / "missing.toml")],
    ):
        result = doctor(*args)
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
