"""The crossover length: pure arithmetic on given numbers, then a real sweep of two
configurations against the real llama-server, checked against a hand calculation."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_run import invoke, server_argv

from llamanix.bench.crossover import Line, crossover, fit_line
from llamanix.server.server_process import LlamaServer

if TYPE_CHECKING:
    from conftest import SynthModels

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LENGTHS = (32, 256, 1024)


bench = partial(invoke, "bench")


# --- the arithmetic -------------------------------------------------------------------------


def line(a: float, b: float) -> Line:
    return Line(intercept_s=a, slope_s_per_token=b, points=2)


def test_fit_line_recovers_a_line() -> None:
    fitted = fit_line([(100, 1.5), (500, 3.5), (1000, 6.0)])  # 1.0 + 0.005 n
    assert fitted is not None
    assert fitted.intercept_s == pytest.approx(1.0)
    assert fitted.slope_s_per_token == pytest.approx(0.005)
    assert fitted.decode_tok_s == pytest.approx(200.0)
    assert fit_line([(100, 1.0), (100, 2.0)]) is None  # one length: no line


def test_crossover_outcomes() -> None:
    base = line(1.0, 1 / 50)  # 1 s fixed, 50 tok/s
    # MTP-like: 2.8 s more fixed cost, 60 tok/s: 2.8 / (1/50 - 1/60) = 840 tokens.
    above = crossover(base, line(3.8, 1 / 60))
    assert above.outcome == "above" and above.tokens == pytest.approx(840.0)
    assert above.prefill_tax_s == pytest.approx(2.8)
    assert "pays only above 840 output tokens" in above.sentence("mtp", "base")
    assert crossover(base, line(0.9, 1 / 60)).outcome == "always"
    never = crossover(base, line(1.2, 1 / 40))
    assert never.outcome == "never" and never.tokens is None
    below = crossover(base, line(0.5, 1 / 40))  # 0.5 / (1/40 - 1/50) = 100 tokens
    assert below.outcome == "below" and below.tokens == pytest.approx(100.0)
    assert crossover(base, line(1.5, 1 / 50)).outcome == "never"
    assert crossover(base, line(1.0, 1 / 50)).outcome == "same"


# --- a real sweep ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path]]:
    """Baseline and n-gram speculation on the confident synthetic model, whose greedy output
    falls into a cycle: n-gram drafts start only once the text repeats (a fixed cost), then
    nearly every drafted token is kept (faster decode)."""
    out = tmp_path_factory.mktemp("sweep")
    for label, extra in (("base", []), ("ngram", ["--spec-type", "ngram-simple"])):
        argv = server_argv(
            llama_server_bin, synth_models.target, *extra, ctx=4096, parallel=1, threads=1
        )
        with LlamaServer(argv, out / f"{label}.log") as server:
            result = bench(
                "--url",
                server.url,
                "--prompts",
                "builtin:fibonacci,latency",
                "--max-tokens",
                ",".join(map(str, LENGTHS)),
                "--runs",
                "3",
                "--warmup",
                "1",
                "--label",
                label,
                "-o",
                str(out / f"{label}.json"),
            )
            assert result.exit_code == 0, result.output
    yield out / "base.json", out / "ngram.json"


def hand_line(data: dict[str, Any]) -> tuple[float, float]:
    """Intercept and slope of median wall clock on median output tokens, fibonacci rows,
    by the textbook sums."""
    xs, ys = [], []
    for s in data["summaries"]:
        if s["prompt"] == "fibonacci":
            xs.append(s["stats"]["predicted_n"]["median"])
            ys.append(s["stats"]["wall_s"]["median"])
    n = len(xs)
    sx, sy = sum(xs), sum(ys)
    sxx = sum(x * x for x in xs)
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - slope * sx) / n, slope


@pytest.mark.server
def test_crossover_of_a_real_sweep_matches_the_hand_calculation(
    sweep: tuple[Path, Path], tmp_path: Path
) -> None:
    base_file, ngram_file = sweep
    base, ngram = (json.loads(f.read_text()) for f in sweep)
    assert any(q["draft_n"] for r in ngram["runs"] for q in r["requests"])
    for data in (base, ngram):
        lengths = [s["max_tokens"] for s in data["summaries"] if s["prompt"] == "fibonacci"]
        assert lengths == list(LENGTHS)

    a_base, b_base = hand_line(base)
    a_ngram, b_ngram = hand_line(ngram)
    tax = a_ngram - a_base
    saved = b_base - b_ngram  # = 1/r_base - 1/r_ngram
    hand_tokens = tax / saved
    if saved > 0:
        hand_outcome = "above" if tax > 0 else "always"
    else:
        hand_outcome = "below" if tax < 0 else "never"

    result = bench("compare", str(base_file), str(ngram_file), "--json")
    assert result.exit_code == 0, result.output
    (found,) = json.loads(result.stdout)["crossover"]  # latency has one length: no line
    assert (found["prompt"], found["baseline_label"], found["candidate_label"]) == (
        "fibonacci",
        "base",
        "ngram",
    )
    assert found["outcome"] == hand_outcome
    assert found["prefill_tax_s"] == pytest.approx(tax, rel=1e-9)
    assert found["baseline"]["intercept_s"] == pytest.approx(a_base, rel=1e-9)
    assert found["candidate"]["slope_s_per_token"] == pytest.approx(b_ngram, rel=1e-9)
    assert found["candidate"]["decode_tok_s"] == pytest.approx(1 / b_ngram, rel=1e-9)
    if hand_outcome in ("above", "below"):
        assert found["tokens"] == pytest.approx(hand_tokens, rel=1e-9)
    else:
        assert found["tokens"] is None
    # Printed by `pytest -s`: the figures of this sweep, for the docs.
    print(
        f"\ncrossover: {found['outcome']} {found['tokens']}; hand {hand_tokens:.1f} "
        f"(tax {tax:.4f} s, base {1 / b_base:.1f} tok/s, ngram {1 / b_ngram:.1f} tok/s)"
    )

    table = bench("compare", str(base_file), str(ngram_file))
    assert table.exit_code == 0, table.output
    assert "crossover: fibonacci: ngram " in table.stdout

    plotted = bench("compare", str(base_file), str(ngram_file), "--plot", str(tmp_path / "x.png"))
    assert plotted.exit_code == 0, plotted.output
    assert (tmp_path / "x.png").read_bytes().startswith(PNG_MAGIC)

    unknown = bench("compare", str(base_file), str(ngram_file), "--prompt", "nonesuch")
    assert unknown.exit_code == 2 and "--prompt" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and unknown.stdout == ""


@pytest.mark.server
def test_plot_without_matplotlib_is_one_line(
    sweep: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "x.png"
    result = bench("compare", *map(str, sweep), "--plot", str(out))
    assert result.exit_code == 2 and not out.exists() and result.stdout == ""
    assert "matplotlib is not installed" in result.stderr and "--plot" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    # With --json the same line is the error of a JSON object on stdout, for scripts.
    result = bench("compare", *map(str, sweep), "--json", "--plot", str(out))
    assert result.exit_code == 2 and not out.exists()
    error = json.loads(result.stdout)
    assert error["exit_code"] == 2 and error["problems"] == [error["error"]]
    assert "matplotlib is not installed" in error["error"] and "--plot" in error["error"]
