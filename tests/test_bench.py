"""llamanix bench and bench compare against the real llama-server with synthetic models."""

from __future__ import annotations

import csv
import importlib.util
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cli_run import invoke, server_argv
from click.testing import Result

from llamanix.bench.bench_results import load_result
from llamanix.bench.prompts import builtin_prompts, parse_prompts
from llamanix.core.errors import UserError
from llamanix.core.gpus import load_gpus
from llamanix.model.gguf_info import read_gguf
from llamanix.server.server_process import LlamaServer, free_port
from llamanix.testbed.synth import SynthSpec, synth_model

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


bench = partial(invoke, "bench")


# --- without a server ------------------------------------------------------------------------


def test_builtin_prompts() -> None:
    prompts = {p.name: p for p in builtin_prompts()}
    assert set(prompts) == {"fibonacci", "code-long", "chat-short", "tool-call", "latency"}
    assert prompts["fibonacci"].messages[-1]["content"] == (
        "Write a Python function that computes the Fibonacci sequence."
    )
    tools = prompts["tool-call"].tools
    assert tools and tools[0]["function"]["name"] == "get_weather"
    assert prompts["latency"].lengths([100, 500]) == [1]
    assert prompts["fibonacci"].lengths([100, 500]) == [100, 500]
    assert len(prompts["code-long"].messages[-1]["content"]) > 2000


def test_prompt_file_shapes() -> None:
    (p,) = parse_prompts([{"name": "a", "prompt": "hi"}], "f.json")
    assert p.messages == ({"role": "user", "content": "hi"},)
    for bad in (
        [],
        [{"prompt": "x"}],
        [{"name": "a"}],
        [{"name": "a", "prompt": "x"}] * 2,
        [{"name": "a", "prompt": "x", "max_tokens": 0}],
        [{"name": "a", "prompt": "x", "tools": "nope"}],
    ):
        with pytest.raises(UserError):
            parse_prompts(bad, "f.json")


@pytest.mark.parametrize(
    "args",
    [
        [],  # no --url
        ["--url", "not-a-url"],
        ["--url", "http://127.0.0.1:1", "--max-tokens", "ten"],
        ["--url", "http://127.0.0.1:1", "--runs", "0"],
        ["--url", "http://127.0.0.1:1", "--prompts", "builtin:nonesuch"],
        ["--url", "http://127.0.0.1:1", "--prompts", "/nonexistent/prompts.json"],
        ["--url", "http://127.0.0.1:1", "--gpu", "voodoo2"],
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = bench(*args, "-o", str(out))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_nothing_listening_is_one_line_exit_2(tmp_path: Path) -> None:
    port = free_port()
    result = bench("--url", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "r.json"))
    assert result.exit_code == 2
    assert "cannot connect" in result.stderr and "--url" in result.stderr
    assert not (tmp_path / "r.json").exists()


def test_compare_needs_two_results(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{}")
    result = bench("compare", str(tmp_path / "x.json"), str(tmp_path / "x.json"))
    assert result.exit_code == 2 and "not a llamanix-bench/1 result" in result.stderr


def _minimal_result() -> dict[str, Any]:
    """The smallest file bench --json writes: one request, a one-token run."""
    request = {"wall_s": 0.5, "ttft_s": 0.5, "predicted_n": 1, "chunks": 1}
    return {
        "format": "llamanix-bench/1",
        "label": "x",
        "meta": {
            "url": "http://127.0.0.1:8080",
            "model": None,
            "server": {"build_info": "b1"},
            "machine": {
                "hostname": "h",
                "system": "Linux",
                "machine": "x86_64",
                "processor": None,
                "cpus": 2,
                "python": "3.11.2",
            },
            "date": "2026-01-01T00:00:00+00:00",
            "llamanix": "0.1.0",
            "metrics": False,
            "settings": {
                "prompts": ["latency"],
                "max_tokens": [1],
                "runs": 1,
                "warmup": 0,
                "concurrency": 1,
                "temperature": 0.0,
                "seed": 42,
                "ignore_eos": True,
                "cache_prompt": False,
            },
        },
        "ceiling": None,
        "summaries": [],
        "runs": [
            {
                "prompt": "latency",
                "max_tokens": 1,
                "run": 0,
                "wall_s": 0.5,
                "aggregate_decode_tok_s": None,
                "requests": [request],
            }
        ],
    }


def test_result_fields_are_read_typed(tmp_path: Path) -> None:
    """Fields a file lacks read as None; a field of the wrong type is one line naming it."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_minimal_result()))
    loaded = load_result(path)
    assert loaded.meta.server.build_info == "b1" and loaded.meta.server.model_path is None
    (run,) = loaded.runs
    assert run.phase is None and run.metrics_delta is None
    assert run.requests[0].server_decode_tok_s is None and run.requests[0].chunks == 1
    broken = _minimal_result()
    broken["runs"][0]["requests"][0]["chunks"] = "one"
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match=r"runs\[0\]\.requests\[0\]\.chunks: expected an integer"):
        load_result(path)
    broken = _minimal_result()
    broken["runs"][0]["phase"] = "tepid"
    path.write_text(json.dumps(broken))
    result = bench("compare", str(path), str(path))
    assert result.exit_code == 2 and "unknown phase 'tepid'" in result.stderr


# --- against the real server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def slower_model(vocab_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Big enough (a few ms per token on one thread) that both clocks see a real span."""
    spec = SynthSpec(
        layers=4,
        embd=512,
        ff=1024,
        heads=8,
        kv_heads=8,
        vocab=vocab_dir / "ggml-vocab-llama-spm.gguf",
        seed=11,
    )
    return synth_model(spec, tmp_path_factory.mktemp("bench") / "slower.gguf")


@pytest.fixture(scope="module")
def base_server(
    llama_server_bin: Path, slower_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("bench-server") / "server.log"
    argv = server_argv(llama_server_bin, slower_model, "--metrics", ctx=4096, parallel=2, threads=1)
    with LlamaServer(argv, log) as server:
        yield server


@pytest.fixture(scope="module")
def base_run(
    base_server: LlamaServer, slower_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("bench-out")
    result = bench(
        "--url",
        base_server.url,
        "--prompts",
        "builtin:fibonacci,tool-call,latency",
        "--max-tokens",
        "48,160",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--label",
        "base",
        "-o",
        str(out / "base.json"),
        "--csv",
        str(out / "base.csv"),
        "--gpu",
        "rtx3090",
        "--gguf",
        str(slower_model),
    )
    return result, out


@pytest.mark.server
def test_bench_decode_agrees_with_server_timings(base_run: tuple[Result, Path]) -> None:
    result, out = base_run
    assert result.exit_code == 0, result.output
    data = json.loads((out / "base.json").read_text())
    requests = [(run, q) for run in data["runs"] for q in run["requests"]]
    assert len(requests) == 2 * 5  # (fibonacci, tool-call) x (48, 160) + latency x 1, 2 runs
    for run, q in requests:
        assert q["predicted_n"] == run["max_tokens"]  # ignore_eos: exactly the asked length
        assert 0 < q["ttft_s"] < q["wall_s"]
        assert q["prompt_n"] > 0 and q["cache_n"] == 0  # prompt caching off: prefill measured
        if run["max_tokens"] == 1:
            assert q["server_decode_tok_s"] is None and q["client_decode_tok_s"] is None
            continue
        server, client = q["server_decode_tok_s"], q["client_decode_tok_s"]
        assert abs(client - server) / server < 0.05, (run["prompt"], run["max_tokens"], q)
        # Without speculation there is nothing to accept.
        assert q["draft_n"] is None and q["acceptance"] is None


@pytest.mark.server
def test_bench_metrics_deltas_match_requests(base_run: tuple[Result, Path]) -> None:
    _, out = base_run
    data = json.loads((out / "base.json").read_text())
    assert data["meta"]["metrics"] is True
    for run in data["runs"]:
        (q,) = run["requests"]
        delta = run["metrics_delta"]
        assert delta["tokens_predicted_total"] == q["predicted_n"]
        assert delta["prompt_tokens_total"] == q["prompt_n"]


@pytest.mark.server
def test_bench_summary_meta_and_outputs(base_run: tuple[Result, Path], slower_model: Path) -> None:
    result, out = base_run
    data = json.loads((out / "base.json").read_text())
    assert data["label"] == "base"
    meta = data["meta"]
    assert "0c1e570" in meta["server"]["build_info"]
    assert meta["settings"]["runs"] == 2 and meta["settings"]["temperature"] == 0.0
    assert meta["machine"]["cpus"] and meta["date"]
    rows = {(s["prompt"], s["max_tokens"]): s for s in data["summaries"]}
    assert set(rows) == {
        ("fibonacci", 48),
        ("fibonacci", 160),
        ("tool-call", 48),
        ("tool-call", 160),
        ("latency", 1),
    }
    for s in rows.values():
        st = s["stats"]["ttft_s"]
        assert st["n"] == 2 and st["min"] <= st["median"] <= st["max"]
        assert st["stdev"] is not None
    # The roofline: rtx3090 bandwidth over the weights one decode step reads.
    info = read_gguf(slower_model)
    ceiling = data["ceiling"]
    assert ceiling["tok_s"] == pytest.approx(
        load_gpus()["rtx3090"].bandwidth_gb_s * 1e9 / info.weight_bytes_per_token()
    )
    fib = rows[("fibonacci", 160)]
    assert fib["ceiling_share"] == pytest.approx(
        fib["stats"]["server_decode_tok_s"]["median"] / ceiling["tok_s"]
    )
    # The terminal table, without a progress bar (CliRunner is not a TTY).
    assert "fibonacci" in result.stdout and "decode tok/s" in result.stdout
    assert "warmup" not in result.stdout
    with (out / "base.csv").open() as fh:
        csv_rows = list(csv.DictReader(fh))
    assert len(csv_rows) == 10 and {"ttft_s", "server_decode_tok_s"} <= set(csv_rows[0])
    loaded = load_result(out / "base.json")
    assert loaded.summaries[0].stats["wall_s"] is not None
    # One reader, one writer: what was read writes back the same.
    assert loaded.to_json() == data


@pytest.mark.server
def test_bench_concurrency(base_server: LlamaServer, tmp_path: Path) -> None:
    result = bench(
        "--url",
        base_server.url,
        "--prompts",
        "builtin:chat-short",
        "--max-tokens",
        "32",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--concurrency",
        "2",
        "--json",
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]  # "--json": the JSON instead of the table
    assert len(run["requests"]) == 2
    assert run["metrics_delta"]["tokens_predicted_total"] == 64
    assert run["aggregate_decode_tok_s"] > 0


@pytest.mark.server
def test_compare_and_plot_real_results(
    base_run: tuple[Result, Path],
    llama_server_bin: Path,
    slower_model: Path,
    tmp_path: Path,
) -> None:
    """A speculative configuration (the model as its own draft) against the baseline."""
    _, out = base_run
    argv = server_argv(
        llama_server_bin,
        slower_model,
        "--metrics",
        "--spec-type",
        "draft-simple",
        "--spec-draft-model",
        str(slower_model),
        "--spec-draft-n-max",
        "4",
        ctx=4096,
        parallel=1,
        threads=1,
    )
    with LlamaServer(argv, tmp_path / "spec.log") as server:
        result = bench(
            "--url",
            server.url,
            "--prompts",
            "builtin:fibonacci,tool-call,latency",
            "--max-tokens",
            "48,160",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--label",
            "spec",
            "-o",
            str(tmp_path / "spec.json"),
        )
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "spec.json").read_text())
    drafted = [q for run in spec["runs"] for q in run["requests"] if q["draft_n"]]
    assert drafted and all(0 <= q["acceptance"] <= 1 for q in drafted)
    assert any(
        run["metrics_delta"]["spec_decode_num_draft_tokens_total"] > 0 for run in spec["runs"]
    )

    files = [str(out / "base.json"), str(tmp_path / "spec.json")]
    table = bench("compare", *files)
    assert table.exit_code == 0, table.output
    assert "base" in table.stdout and "spec" in table.stdout and "decode tok/s" in table.stdout
    assert "inside the noise" in table.stdout
    as_json = bench("compare", *files, "--json")
    data = json.loads(as_json.stdout)
    assert data["labels"] == ["base", "spec"]
    decode = [r for r in data["rows"] if r["metric"] == "server_decode_tok_s"]
    assert len(decode) == 4  # the one-token probe has no decode rate
    base = load_result(out / "base.json")
    for row in decode:
        a = next(
            s
            for s in base.summaries
            if (s.prompt, s.max_tokens) == (row["prompt"], row["max_tokens"])
        )
        values = row["values"]
        assert values["base"]["median"] == a.median("server_decode_tok_s")
        assert values["spec"]["ratio"] == pytest.approx(
            values["spec"]["median"] / values["base"]["median"]
        )
        assert isinstance(values["spec"]["inside_noise"], bool)

    if not HAS_MATPLOTLIB:
        pytest.skip("matplotlib is not installed (pip install 'llamanix[plot]')")
    plotted = bench("compare", *files, "--plot", str(tmp_path / "cmp.png"))
    assert plotted.exit_code == 0, plotted.output
    assert (tmp_path / "cmp.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.server
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_bench_plot(base_server: LlamaServer, tmp_path: Path) -> None:
    result = bench(
        "--url",
        base_server.url,
        "--prompts",
        "builtin:fibonacci",
        "--max-tokens",
        "16,48",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--plot",
        str(tmp_path / "p.png"),
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)
