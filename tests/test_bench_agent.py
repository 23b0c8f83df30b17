"""Agent-shaped bench prompts (agent:N) against the real llama-server: prefix reuse, the wall
clock split, and old results still loading."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_run import invoke, server_argv
from click.testing import Result

from llamanix.bench.bench import planned_steps, run_bench
from llamanix.bench.bench_results import BenchSettings, load_result
from llamanix.bench.prompts import agent_messages, agent_prompt, load_prompts, parse_prompts
from llamanix.bench.streaming import ThinkingClock
from llamanix.core.errors import UserError
from llamanix.server.server_process import LlamaServer

if TYPE_CHECKING:
    from conftest import SynthModels

PREFIX = 2000


bench = partial(invoke, "bench")


# --- without a server ------------------------------------------------------------------------


def test_agent_prompt_shapes() -> None:
    (p,) = load_prompts("agent:1500")
    assert p.name == "agent-1500" and p.agent
    assert p.messages == agent_prompt(1500).messages  # same N, same text
    assert [m["role"] for m in p.messages] == ["system"] + ["user", "assistant"] * 4
    one = agent_messages(p, "aaaa", 1)
    two = agent_messages(p, "aaaa", 2)
    other = agent_messages(p, "bbbb", 1)
    # The shared prefix is identical within a session; only the last turn changes.
    assert one[:-1] == two[:-1] and one[-1] != two[-1] and one[-1]["role"] == "user"
    assert one[0]["content"].startswith("[session aaaa]")
    assert other[0]["content"] != one[0]["content"]
    assert p.messages[0]["content"] == one[0]["content"].removeprefix("[session aaaa]\n")
    # Prompts files: a generated prefix of N tokens, or your own messages as the prefix.
    gen, own = parse_prompts(
        [{"name": "gen", "agent": 800}, {"name": "own", "agent": True, "prompt": "Repo notes."}],
        "p.json",
    )
    assert gen.agent and gen.name == "gen" and gen.messages == agent_prompt(800).messages
    assert own.agent and agent_messages(own, "s", 0)[0] == {
        "role": "system",
        "content": "[session s]",
    }
    for bad in ([{"name": "x", "agent": 10}], [{"name": "x", "agent": "yes", "prompt": "p"}]):
        with pytest.raises(UserError):
            parse_prompts(bad, "p.json")


@pytest.mark.parametrize("spec", ["agent:", "agent:12", "agent:lots"])
def test_bad_agent_spec_is_one_line_exit_2(spec: str, tmp_path: Path) -> None:
    result = bench("--url", "http://127.0.0.1:1", "--prompts", spec, "-o", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    assert "--prompts" in result.stderr and "agent:N" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert not (tmp_path / "r").exists()


def test_thinking_clock() -> None:
    separated = ThinkingClock()
    for t, delta in enumerate(
        [{"reasoning_content": "hm"}, {"reasoning_content": "ok"}, {"content": "Answer"}]
    ):
        separated.see(delta, float(t))
    assert (separated.last, separated.chunks) == (1.0, 2)
    inline = ThinkingClock()
    for t, text in enumerate(["<think>", "let me", "see</think>", "The", "answer"]):
        inline.see({"content": text}, float(t))
    assert (inline.last, inline.chunks) == (2.0, 3)
    plain = ThinkingClock()
    plain.see({"content": "no thinking"}, 0.0)
    assert (plain.last, plain.chunks) == (None, 0)


# --- against the real server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_server(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("agent-server") / "server.log"
    argv = server_argv(llama_server_bin, synth_models.target, ctx=8192, parallel=2, threads=1)
    with LlamaServer(argv, log) as server:
        yield server


@pytest.fixture(scope="module")
def agent_run(
    agent_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Result, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("agent-out") / "agent.json"
    result = bench(
        "--url",
        agent_server.url,
        "--prompts",
        f"agent:{PREFIX}",
        "--max-tokens",
        "8,32",
        "--runs",
        "3",
        "--warmup",
        "1",
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text()), out


@pytest.mark.server
def test_agent_warm_runs_reuse_the_prefix(agent_run: tuple[Result, dict[str, Any], Path]) -> None:
    result, data, _ = agent_run
    runs = data["runs"]
    assert [(r["max_tokens"], r["run"], r["phase"]) for r in runs] == [
        (8, 0, "cold"),
        (8, 1, "warm"),
        (8, 2, "warm"),
        (32, 0, "cold"),
        (32, 1, "warm"),
        (32, 2, "warm"),
    ]
    for run in runs:
        (q,) = run["requests"]
        assert q["predicted_n"] == run["max_tokens"]
        if run["phase"] == "cold":
            # A new session marker: only the chat template's first tokens match any slot.
            assert q["cache_n"] < 32 and q["prompt_n"] >= 0.9 * PREFIX
        else:
            # The whole shared prefix comes from the cache; only the last turn is prefilled.
            assert q["cache_n"] >= 0.9 * PREFIX and q["prompt_n"] < 64
    # Per length the warm requests read the same prefix the cold one prefilled.
    for length in (8, 32):
        mine = [r["requests"][0] for r in runs if r["max_tokens"] == length]
        total = {q["cache_n"] + q["prompt_n"] for q in mine}
        assert len(total) == 1
    rows = {s["max_tokens"]: s["phases"] for s in data["summaries"]}
    assert set(rows) == {8, 32}
    for phases in rows.values():
        assert phases["cold"]["cache_n"]["n"] == 1 and phases["warm"]["cache_n"]["n"] == 2
        assert phases["warm"]["cache_n"]["min"] >= 0.9 * PREFIX
    assert "agent prompts" in result.stdout and "warm" in result.stdout


@pytest.mark.server
def test_agent_split_adds_up_to_wall_clock(agent_run: tuple[Result, dict[str, Any], Path]) -> None:
    _, data, _ = agent_run
    for run in data["runs"]:
        (q,) = run["requests"]
        parts = q["prefill_s"] + q["reasoning_s"] + q["decode_s"]
        assert parts == pytest.approx(q["wall_s"], abs=1e-9)
        assert q["prefill_s"] == q["ttft_s"]
        # The synthetic model does not think: no reasoning tokens, no reasoning time.
        assert q["reasoning_s"] == 0.0 and q["reasoning_n"] == 0
        assert q["decode_s"] > 0


@pytest.mark.server
def test_results_without_agent_fields_still_load(
    agent_run: tuple[Result, dict[str, Any], Path], tmp_path: Path
) -> None:
    """A result written before agent prompts (no split, no phases) loads and compares."""
    _, data, _ = agent_run
    old = json.loads(json.dumps(data))
    for run in old["runs"]:
        del run["phase"]
        for q in run["requests"]:
            for key in ("prefill_s", "reasoning_s", "decode_s", "reasoning_n"):
                del q[key]
    for s in old["summaries"]:
        del s["phases"]
        for key in ("cache_n", "prefill_s", "reasoning_s", "decode_s"):
            del s["stats"][key]
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = load_result(tmp_path / "old.json")
    assert loaded.runs[0].phase is None and loaded.runs[0].requests[0].prefill_s is None
    assert loaded.summaries[0].phases is None
    new = load_result(agent_run[2])
    assert new.runs[0].phase == "cold" and new.summaries[0].phases is not None
    assert new.to_json() == json.loads(agent_run[2].read_text())
    compared = bench("compare", str(tmp_path / "old.json"), str(agent_run[2]), "--json")
    assert compared.exit_code == 0, compared.output
    labels = json.loads(compared.stdout)["labels"]
    assert labels == [data["label"], data["label"] + "#2"]


@pytest.mark.server
def test_progress_reports_every_planned_step(agent_server: LlamaServer) -> None:
    settings = BenchSettings(url=agent_server.url, max_tokens=(4, 8), runs=2, warmup=1)
    prompts = load_prompts("agent:600")
    seen: list[str] = []
    run_bench(settings, prompts, progress=seen.append)
    assert len(seen) == planned_steps(settings, prompts) == 5
    assert seen[0] == "agent-600: warm-up" and seen[-1] == "agent-600: 8 tokens, run 2"
