"""``llamanix demo`` end to end: the real llama-server, ``llamanix up`` and ``llamanix switch``.

What is asserted is behaviour, not speed: the synthetic pair's acceptance (a property of the
models at temperature 0), the designed compute ratio read back from the GGUFs, the rows and
keys of the output, and the bench gate's verdicts (keep the good draft, roll back the bad).
The speed-up itself is printed by the demo, never asserted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gguf
import pytest
from cli_run import run_llamanix
from rich.console import Console

from llamanix.bench.interval import RatioInterval
from llamanix.state.up_status import read_status
from llamanix.testbed import demo, real_text

pytestmark = pytest.mark.server


llamanix = partial(run_llamanix, timeout=600)


def matmul_weights(path: Path) -> int:
    """Weights multiplied per decoded token: every 2-D tensor but the embedding lookup."""
    return sum(
        int(t.n_elements)
        for t in gguf.GGUFReader(path).tensors
        if len(t.shape) == 2 and t.name != "token_embd.weight"
    )


@dataclass(frozen=True)
class DemoRun:
    figures: dict[str, Any]
    keep: Path
    stderr: str


@pytest.fixture(scope="module")
def demo_run(
    llama_server_bin: Path, real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> DemoRun:
    keep = tmp_path_factory.mktemp("demo")
    out = keep / "figures.json"
    result = llamanix(
        *(
            "testbed",
            "demo",
            "--binary",
            str(llama_server_bin),
            "--keep",
            str(keep),
            "--synthetic-gate",
        ),
        *("--tokens", "16", "--runs", "1", "--json", "-o", str(out)),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)  # stdout holds the JSON alone
    assert json.loads(out.read_text()) == figures
    return DemoRun(figures, keep, result.stderr)


def test_json_has_both_rows_the_acceptance_and_the_speedup(demo_run: DemoRun) -> None:
    figures = demo_run.figures
    print(f"\ndemo speed-up (printed, not asserted): {figures['speedup']:.2f}x")
    rows = {row["instance"]: row for row in figures["rows"]}
    assert set(rows) == {"plain", "speculative"}
    for row in rows.values():
        assert row["server_decode_tok_s"] > 0 and row["wall_s"] > 0
    assert rows["plain"]["speculation"] == "none"
    assert rows["plain"]["drafted"] == 0 and rows["plain"]["acceptance"] is None
    spec = rows["speculative"]
    assert spec["speculation"] == "draft: 1-block, n_max 8, p_min 0.6"
    # The draft is the target's real block without the passthrough ones: at temperature 0
    # it proposes the target's own tokens.
    assert spec["drafted"] > 0
    assert spec["accepted"] / spec["drafted"] >= 0.9
    assert figures["acceptance"] == spec["acceptance"]
    assert figures["speedup"] == pytest.approx(
        spec["server_decode_tok_s"] / rows["plain"]["server_decode_tok_s"]
    )
    assert (figures["tokens"], figures["runs"]) == (16, 1)


def test_real_text_rows_per_speculation_and_workload(demo_run: DemoRun) -> None:
    real = demo_run.figures["real_text"]
    assert real["model"] == "gemma-3-270m-q4_k_m.gguf"
    rows = real["rows"]
    print()
    for r in rows:
        speedup = r["speedup"]
        print(
            f"{r['speculation']:<24} {r['workload']:<6} {speedup['ratio']:.2f}x "
            f"[{speedup['low']:.2f}, {speedup['high']:.2f}] accepted {r['accepted']}/"
            f"{r['drafted']}, same text {r['identical']}/{r['prompts']}"
        )
    # The test bed's build takes a chain: three speculations, two workloads each.
    assert [(r["speculation"], r["workload"]) for r in rows] == [
        (s, w)
        for s in ("ngram-mod", "ngram-map-k4v", "ngram-mod+ngram-map-k4v")
        for w in ("edit", "prose")
    ]
    for r in rows:
        assert r["prompts"] == demo.REAL_PROMPTS_PER_WORKLOAD
        assert r["identical"] + len(r["edit_distances"]) == r["prompts"]
        assert r["speedup"]["low"] <= r["speedup"]["ratio"] <= r["speedup"]["high"]
        assert r["accepted"] <= r["drafted"]
    # An edit is mostly the prompt again: ngram-mod finds it there and drafts.
    edit = next(r for r in rows if (r["speculation"], r["workload"]) == ("ngram-mod", "edit"))
    assert edit["drafted"] > 0


def test_the_real_text_gates_run_on_their_workloads(demo_run: DemoRun) -> None:
    real = [g for g in demo_run.figures["gate"] if g["expected"] is None]
    assert [g["step"] for g in real] == ["ngram-mod, edit", "ngram-mod, prose"]
    # What the gate decides on real text is this machine's: printed, not asserted.
    for g in real:
        print(f"\n{g['step']}: {g['outcome']}: {g['detail']}")
        assert g["outcome"] in ("kept", "rolled back")
        assert "against" in g["detail"] and "interval" in g["detail"]
    switch_log = (demo_run.keep / "deploy" / "switch.log").read_text()
    assert "--gate-prompts realtext:edit" in switch_log
    assert "--gate-prompts realtext:prose" in switch_log
    # Each switch restarted and gated only the instance it changed.
    assert "local: switching edit via up" in switch_log
    assert "local: switching prose via up" in switch_log


def test_the_bench_gate_keeps_the_good_draft_and_rolls_back_the_bad(demo_run: DemoRun) -> None:
    gate = [g for g in demo_run.figures["gate"] if g["expected"] is not None]
    assert [(g["step"], g["outcome"]) for g in gate] == [
        ("baseline", "kept"),
        ("good draft", "kept"),
        ("bad draft", "rolled back"),
    ]
    assert all(g["outcome"] == g["expected"] for g in gate)
    # The gate's own wording is switch.gate's business; the demo only passes it on.
    assert all(g["detail"] for g in gate)

    # The switches really went through the deploy machinery: generations, gate verdicts,
    # and the config put back to the good draft after the rollback. One `up` served the real
    # model's two instances and the synthetic one; the real switches came first.
    deploy = demo_run.keep / "deploy"
    listing = llamanix("generations", str(deploy / "llamanix.toml"), "--host", "local", "--json")
    assert listing.returncode == 0, listing.stderr
    gens = json.loads(listing.stdout)
    real = [g for g in demo_run.figures["gate"] if g["expected"] is None]
    verdicts = {"kept": "passed", "rolled back": "failed"}
    assert [(g["gate"].get("kind"), g["gate"]["result"]) for g in gens] == [
        (None, "unverified"),
        *(("bench", verdicts[g["outcome"]]) for g in real),
        ("bench", "passed"),
        ("bench", "passed"),
        ("bench", "failed"),
    ]
    assert [g["current"] for g in gens][-3:] == [False, True, False]
    config = (deploy / "llamanix.toml").read_text()
    assert str(demo_run.keep / "draft.gguf") in config
    assert "unrelated-draft" not in config
    # `up` ran from the state directory and was stopped at the end.
    units = deploy / ".llamanix-state" / "local" / "up"
    assert sorted(p.name for p in units.glob("llamanix-*.service")) == [
        "llamanix-chat.service",
        "llamanix-edit.service",
        "llamanix-prose.service",
    ]
    assert read_status(units) is None


def test_target_costs_the_designed_multiple_of_the_draft(demo_run: DemoRun) -> None:
    target, draft = demo_run.keep / "target.gguf", demo_run.keep / "draft.gguf"
    blocks = {
        p.name: gguf.GGUFReader(p).fields["llama.block_count"].contents() for p in (target, draft)
    }
    assert blocks == {"target.gguf": 1 + demo.PASSTHROUGH, "draft.gguf": 1}
    # 12 blocks against 1, and one shared output head over a small vocabulary.
    ratio = matmul_weights(target) / matmul_weights(draft)
    assert 8 <= ratio <= 12
    assert target.stat().st_size / draft.stat().st_size >= 8
    # The speculative instance was rendered with the draft as its draft model.
    argv = json.loads((demo_run.keep / "render" / "speculative.argv.json").read_text())
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("--spec-draft-model") + 1] == str(draft)
    assert "draft acceptance" in (demo_run.keep / "speculative.log").read_text()


def test_table_without_the_gate(llama_server_bin: Path, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    result = llamanix(
        *("testbed", "demo", "--binary", str(llama_server_bin), "--keep", str(tmp_path)),
        *("--tokens", "16", "--runs", "1", "--no-gate", "--no-real"),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = {
        cells[0]: cells
        for line in result.stdout.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip("│").split("│")]]
    }
    assert set(rows) == {"plain", "speculative"}, result.stdout
    assert "real text" not in result.stdout
    # instance, speculation, tok/s, client, TTFT ms, wall s, accepted/drafted, acceptance
    assert rows["plain"][1] == "none" and rows["plain"][7] == "-"
    accepted, drafted = (int(n) for n in rows["speculative"][6].split("/"))
    assert drafted > 0 and accepted / drafted >= 0.9
    assert "x the plain decode rate" in result.stdout
    assert "bench gate" not in result.stdout
    assert not (tmp_path / "deploy").exists()


def test_bad_binary_is_one_line_exit_2(tmp_path: Path) -> None:
    result = llamanix(
        "testbed", "demo", "--binary", str(tmp_path / "nope"), "--keep", str(tmp_path / "k")
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"llamanix testbed demo: --binary: {tmp_path / 'nope'} is not an executable file "
        "(give the path of a llama-server binary)\n"
    )
    assert not (tmp_path / "k").exists()


def test_the_real_text_table_prints_every_row(demo_run: DemoRun) -> None:
    """What `llamanix demo` prints of the real-text rows (the JSON run above carries them)."""
    rows = [
        real_text.WorkloadRow(
            speculation=r["speculation"],
            workload=r["workload"],
            prompts=r["prompts"],
            speedup=RatioInterval(r["speedup"]["low"], r["speedup"]["ratio"], r["speedup"]["high"]),
            drafted=r["drafted"],
            accepted=r["accepted"],
            identical=r["identical"],
            edit_distances=tuple(r["edit_distances"]),
        )
        for r in demo_run.figures["real_text"]["rows"]
    ]
    console = Console(record=True, width=200)
    console.print(demo.real_table(rows))
    text = console.export_text()
    assert "real text: gemma-3-270m-q4_k_m.gguf (a base model)" in text
    for row in rows:
        line = next(
            ln for ln in text.splitlines() if f" {row.speculation} " in ln and row.workload in ln
        )
        assert row.speedup is not None and row.speedup.text() in line
        assert f"{row.identical}/{row.prompts}" in line


def test_a_confirmed_regression_is_shown_once() -> None:
    """The switch says the bench gate's verdict, then again once the baseline measured after the
    rollback confirms it (that line repeats the first): the demo's table shows the last one."""
    output = (
        "  gate health chat: passed: health ok, chat ok\n"
        "  gate bench chat: regression: decode 35.9 tok/s against 129.7: ratio 0.277\n"
        "  chat: confirming the regression: the baseline measured again\n"
        "  gate bench chat: regression: decode 35.9 tok/s against 129.7: ratio 0.277; "
        "confirmed: the baseline measured again after the rollback: decode 131.1 tok/s\n"
    )
    assert demo._gate_detail(output) == (
        "health ok, chat ok; decode 35.9 tok/s against 129.7: ratio 0.277; "
        "confirmed: the baseline measured again after the rollback: decode 131.1 tok/s"
    )
