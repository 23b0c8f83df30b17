"""The bench gate tells noise from regression.

The statistics (``llamanix.bench.interval``) on given sample arrays; then ``llamanix switch``
with ``llamanix up`` as the manager and the real llama-server: the first bench stores its runs,
a change with no effect on speed records a baseline measured just before the switch, an interval
and the decision that interval and threshold imply, and a config an order of magnitude slower (a
draft model that is rarely accepted, asked for 16 tokens a step) is rolled back as a regression.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_deploy_e2e import DEADLINE_S, llamanix, serving, settled_files

from llamanix.bench.interval import MIN_SAMPLES, RatioInterval, decide, ratio_interval, threshold_of
from llamanix.core.json_codec import from_json_lenient
from llamanix.server.server_process import free_port
from llamanix.state.gate_records import Baseline, BaselineRecord, BenchVerdict
from llamanix.switch.gate import BASELINE_RUNS, BENCH_RUNS, confirm_regression, resolve
from llamanix.testbed.up_process import instance_status, running_up

if TYPE_CHECKING:
    from conftest import SynthModels

BASE = [100.0, 101.0, 99.0, 102.0, 98.0]

# --- the statistics ---------------------------------------------------------------------------


def test_same_samples_give_an_interval_around_one() -> None:
    found = ratio_interval(BASE, BASE)
    assert found.ratio == 1.0
    assert found.low < 1.0 < found.high
    # A resampled median is one of the samples: the ratio can never leave min/max bounds.
    assert found.low >= min(BASE) / max(BASE) and found.high <= max(BASE) / min(BASE)
    assert decide(found, threshold_of(5)) == "pass"  # 98/102 is within 5%


def test_the_interval_is_deterministic_per_seed() -> None:
    candidate = [97.0, 99.5, 93.0, 101.0, 96.0, 98.0]
    first = ratio_interval(BASE, candidate)
    assert ratio_interval(BASE, candidate) == first
    assert ratio_interval(list(reversed(BASE)), candidate).ratio == first.ratio
    assert first.to_json()["seed"] == first.seed and first.to_json()["resamples"] == 2000


def test_half_speed_is_a_regression() -> None:
    found = ratio_interval(BASE, [v / 2 for v in BASE])
    assert found.ratio == 0.5
    assert found.high < threshold_of(5)
    assert decide(found, threshold_of(5)) == "regression"


def test_a_small_drop_within_wide_noise_is_inconclusive() -> None:
    noisy = [100.0, 90.0, 110.0, 95.0, 105.0]
    found = ratio_interval(noisy, [v * 0.96 for v in noisy])
    assert found.ratio == pytest.approx(0.96)
    assert found.low < threshold_of(5) <= found.high
    assert decide(found, threshold_of(5)) == "inconclusive"


def test_constant_samples_give_a_point_interval() -> None:
    found = ratio_interval([50.0] * 4, [40.0] * 3)
    assert (found.low, found.ratio, found.high) == (0.8, 0.8, 0.8)


def test_decision_at_the_threshold() -> None:
    threshold = threshold_of(5)
    assert threshold == 0.95
    assert decide(RatioInterval(0.95, 0.97, 1.0), threshold) == "pass"  # low == threshold
    assert decide(RatioInterval(0.90, 0.93, 0.95), threshold) == "inconclusive"  # touches it
    assert decide(RatioInterval(0.90, 0.93, 0.9499), threshold) == "regression"


def test_what_a_decision_does() -> None:
    assert resolve("pass", "rollback") == "keep"
    assert resolve("regression", "keep") == "rollback"
    assert resolve("inconclusive", "keep") == "keep"
    assert resolve("inconclusive", "rollback") == "rollback"


@pytest.mark.parametrize(
    ("baseline", "candidate", "message"),
    [
        ([100.0], BASE, r"baseline: 1 sample\(s\)"),
        (BASE, [100.0, 99.0], r"candidate: 2 sample\(s\)"),
        (BASE, [100.0, 0.0, 99.0], "positive finite"),
        ([100.0, float("nan"), 99.0], BASE, "positive finite"),
    ],
)
def test_too_few_or_bad_samples_are_refused(
    baseline: list[float], candidate: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ratio_interval(baseline, candidate)


def stored(data: dict[str, Any]) -> Baseline | None:
    return Baseline.stored(from_json_lenient(BaselineRecord, data))


def test_stored_baselines() -> None:
    # Written before runs were kept: one median, no spread, so no baseline at all.
    assert stored({"tok_s": 41.5, "generation": 3}) is None
    assert Baseline.stored(None) is None
    assert stored({"samples": [41.0, 42.0]}) is None  # fewer than MIN_SAMPLES
    assert stored({"samples": [41.0, "fast", 40.0]}) is None
    assert stored({"samples": [41.0, 0, 40.0]}) is None
    found = stored({"samples": [41, 42.5, 40.0], "generation": 3, "date": "d"})
    assert found == Baseline((41.0, 42.5, 40.0), "stored", 3, "d")
    assert found.to_json()["median"] == 41.0


def regressed(candidate: list[float]) -> BenchVerdict:
    """A bench verdict as the gate records it: 5% tolerated, a fresh baseline (BASE twice)."""
    fresh = Baseline(tuple(BASE * 2), "fresh")
    interval = ratio_interval(fresh.samples, candidate)
    decision = decide(interval, threshold_of(5))
    return BenchVerdict(
        tuple(candidate),
        resolve(decision, "keep"),
        "",
        decision,
        interval,
        threshold_of(5),
        5.0,
        fresh,
    )


@pytest.mark.parametrize(
    ("again", "decision", "verdict"),
    [
        (BASE, "regression", "regression (confirmed)"),
        (
            [90.0, 91.0, 89.0, 92.0, 88.0],
            "inconclusive",
            "inconclusive: the baseline moved by -10.0%",
        ),
    ],
)
def test_check_comparison_follows_an_a_b_a_record(
    again: list[float], decision: str, verdict: str
) -> None:
    """The helper the real-server test below judges its records with, on records made by the
    gate's own functions: a regression confirmed, and one the baseline's move explains (what
    a busy machine gives the change with no effect on speed)."""
    candidate = [v * 0.9 for v in BASE]
    first = regressed(candidate)
    assert first.decision == "regression"
    found = confirm_regression(first, Baseline(tuple(again * 2), "fresh"), "keep")
    record = json.loads(json.dumps(found.to_json()))
    assert (record["decision"], record["verdict"]) == (decision, verdict)
    check_comparison(record, 5.0, 8)


def test_check_comparison_refuses_an_unchecked_regression() -> None:
    record = json.loads(json.dumps(regressed([v * 0.9 for v in BASE]).to_json()))
    with pytest.raises(AssertionError, match="measured again"):
        check_comparison(record, 5.0, 8)


# --- the gate on the real server --------------------------------------------------------------


@pytest.fixture
def gate_dir(tmp_path: Path, llama_server_bin: Path, synth_models: SynthModels) -> Path:
    (tmp_path / "llamanix.toml").write_text(
        '[hosts.dev]\nkind = "systemd"\n'
        f'binaries = {{ upstream = "{llama_server_bin}" }}\n'
        "\n[instances.chat]\n"
        f'model = "{synth_models.target}"\nport = {free_port()}\ncontext = 512\n'
        'threads = 1\nalias = "synthetic"\n'
    )
    return tmp_path


@pytest.fixture
def up(gate_dir: Path) -> Iterator[subprocess.Popen[str]]:
    with running_up(
        gate_dir / "llamanix.toml", "dev", "chat", subprocess.DEVNULL, deadline_s=DEADLINE_S
    ) as proc:
        yield proc


def switch_json(gate_dir: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """Run a switch with --json: exit code, the one host's outcome, stderr."""
    done = llamanix(
        "switch", "llamanix.toml", "--host", "dev", "--manager", "up", "--json", *args, cwd=gate_dir
    )
    assert "Traceback" not in done.stderr, done.stderr
    outcomes = json.loads(done.stdout)
    assert len(outcomes) == 1, outcomes
    return done.returncode, outcomes[0], done.stderr


def recorded_gate(gate_dir: Path, number: int) -> dict[str, Any]:
    listing = llamanix("generations", "llamanix.toml", "--host", "dev", "--json", cwd=gate_dir)
    gens = {g["number"]: g for g in json.loads(listing.stdout)}
    gate: dict[str, Any] = gens[number]["gate"]
    return gate


def check_comparison(
    bench: dict[str, Any], max_regression: float, max_runs: int, on_drift: str = "keep"
) -> None:
    """The recorded verdict follows from the recorded runs: same interval, same decision; a
    regression measured again (A, B, A) is confirmed or, the baseline having moved, inconclusive
    and resolved by --on-drift."""
    baseline, samples = bench["baseline"]["samples"], bench["samples"]
    assert bench["baseline"]["source"] == "fresh" and len(baseline) == BASELINE_RUNS
    assert MIN_SAMPLES <= len(samples) == bench["runs"] <= max_runs
    assert bench["median"] == statistics.median(samples)
    threshold = threshold_of(max_regression)
    assert bench["threshold"] == threshold and bench["max_regression_pct"] == max_regression
    again = ratio_interval(baseline, samples)
    recorded = bench["interval"]
    assert (recorded["low"], recorded["ratio"], recorded["high"]) == (
        again.low,
        again.ratio,
        again.high,
    )
    assert recorded["low"] <= recorded["ratio"] <= recorded["high"]
    first = decide(again, threshold)
    if "baseline_after" not in bench:
        assert first != "regression", "a regression is measured again (A, B, A)"
        assert bench["decision"] == first
        if first == "inconclusive":
            assert bench["runs"] == max_runs  # it asked for more runs until it could ask no more
        else:
            assert bench["action"] == ("keep" if first == "pass" else "rollback")
        return
    # A, B, A: the regression was checked against the baseline measured again after the
    # rollback. Not a regression against that: the machine moved (a busy CI machine does),
    # not the change, and the verdict is inconclusive with how far the baseline moved.
    assert first == "regression"
    after = bench["baseline_after"]["samples"]
    assert len(after) == BASELINE_RUNS
    confirmed = ratio_interval(after, samples)
    assert (bench["confirmation"]["low"], bench["confirmation"]["high"]) == (
        confirmed.low,
        confirmed.high,
    )
    moved = (statistics.median(after) / statistics.median(baseline) - 1) * 100
    assert bench["baseline_moved_pct"] == pytest.approx(moved)
    if decide(confirmed, threshold) == "regression":
        assert (bench["decision"], bench["verdict"]) == ("regression", "regression (confirmed)")
        assert bench["action"] == "rollback"
    else:
        assert bench["decision"] == "inconclusive" and bench["action"] == on_drift
        assert bench["verdict"] == f"inconclusive: the baseline moved by {moved:+.1f}%"


@pytest.mark.server
def test_bench_gate_keeps_runs_and_judges_by_interval(
    gate_dir: Path, up: subprocess.Popen[str], synth_models: SynthModels
) -> None:
    config = gate_dir / "llamanix.toml"
    state = gate_dir / ".llamanix-state" / "dev"
    chat = instance_status(state / "up", "chat")
    assert chat is not None and chat.url is not None
    url = chat.url

    # (a) The first bench: nothing to compare with, its runs are kept as the baseline.
    code, first, err = switch_json(
        gate_dir, "--set", "instances.chat.context=1024", "--gate", "bench"
    )
    assert code == 0, err
    assert first["result"] == "passed"
    bench = first["gate"]["chat"]["bench"]
    assert bench["decision"] is None and bench["baseline"] is None and bench["action"] == "keep"
    assert len(bench["samples"]) == bench["runs"] == BENCH_RUNS
    assert all(v > 0 for v in bench["samples"])
    stored = json.loads((state / "bench" / "chat.json").read_text())
    assert stored["samples"] == bench["samples"]
    assert stored["generation"] == first["generation"]
    assert recorded_gate(gate_dir, first["generation"])["instances"]["chat"]["bench"] == bench

    # (b) A change with no effect on speed (an environment variable restarts the server with
    # the same command line): a fresh baseline, an interval, and the decision they imply.
    good_config = config.read_text()
    code, same, err = switch_json(
        gate_dir,
        "--set",
        'instances.chat.environment={ LLAMANIX_NOTE = "no effect" }',
        "--max-regression",
        "5",
        "--max-runs",
        "8",
    )
    bench = same["gate"]["chat"]["bench"]
    check_comparison(bench, 5.0, 8)
    assert code == (0 if bench["action"] == "keep" else 1), err
    assert same["result"] == ("passed" if code == 0 else "failed")
    record = recorded_gate(gate_dir, same["generation"])
    assert record["kind"] == "bench" and record["instances"]["chat"]["bench"] == bench
    if code == 0:
        good_config = config.read_text()
        stored = json.loads((state / "bench" / "chat.json").read_text())
        assert stored["samples"] == bench["samples"]
    assert serving(url)

    # (c) An order of magnitude slower: a draft the target rarely accepts, 16 tokens a step.
    code, slow, err = switch_json(
        gate_dir,
        "--set",
        "instances.chat.speculative="
        f'{{ type = "draft", draft_model = "{synth_models.unrelated_draft}", '
        "n_max = 16, p_min = 0.0 }",
        "--max-regression",
        "5",
        "--max-runs",
        "8",
    )
    assert code == 1, f"{err}\n{slow}"
    bench = slow["gate"]["chat"]["bench"]
    # The runs on both sides, should the verdict not be the one expected.
    runs = f"baseline {bench['baseline']['samples']}, candidate {bench['samples']}"
    check_comparison(bench, 5.0, 8)
    assert (bench["decision"], bench["action"]) == ("regression", "rollback"), runs
    assert bench["interval"]["high"] < bench["threshold"]
    assert slow["result"] == "failed" and "regression" in slow["detail"]
    assert "previous generation serving again" in slow["detail"]
    assert recorded_gate(gate_dir, slow["generation"])["result"] == "failed"
    assert config.read_text() == good_config and serving(url)
    settled_files(gate_dir)


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--max-runs", "0", "--max-runs"),
        ("--inconclusive", "maybe", "--inconclusive"),
        ("--max-regression", "100", "--max-regression"),
    ],
)
def test_bad_gate_options_are_one_line_exit_2(
    tmp_path: Path, option: str, value: str, field: str
) -> None:
    config = tmp_path / "llamanix.toml"
    text = '[instances.chat]\nmodel = "/srv/models/chat.gguf"\nport = 8080\n'
    config.write_text(text)
    done = llamanix(
        "switch",
        "llamanix.toml",
        "--host",
        "local",
        "--max-regression",
        "5",
        option,  # a repeated option: click keeps the last
        value,
        "--set",
        "instances.chat.port=8081",
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f": {field}: " in lines[0], done.stderr
    assert config.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llamanix.toml"]
