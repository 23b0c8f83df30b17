"""The records llamanix writes and reads back: each reads back exactly what it wrote, and reads
an older or half-understood record without failing.

The JSON below is what earlier versions wrote (``json.dumps`` with sorted keys), so a change to
a record's format shows up here before it reaches a host's state directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llamanix.bench.interval import RatioInterval
from llamanix.cli import main
from llamanix.core.json_codec import from_json_lenient, from_json_or_none
from llamanix.render.manifest import Manifest, ManifestInstance, Render, RenderedInstance
from llamanix.state.gate_records import Baseline, BaselineRecord, BenchVerdict, GateResult
from llamanix.state.generations import (
    GateRecord,
    GenerationRecord,
    HostState,
    InstanceSummary,
    ManagerRecord,
    RollbackRecord,
)


def stored(data: object) -> Any:
    """``data`` as a state file holds it and ``json.loads`` gives it back."""
    return json.loads(json.dumps(data, sort_keys=True))


# The llama-server a plain systemd host runs (a host names one per variant it serves).
BINARIES = 'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
BENCH_RESULT = {
    "bench": {
        "action": "keep",
        "baseline": {
            "date": "2025-01-01T00:00:00+00:00",
            "generation": None,
            "median": 41.0,
            "samples": [40.0, 41.0, 42.0],
            "source": "fresh",
        },
        "decision": "pass",
        "interval": {
            "confidence": 0.95,
            "high": 1.05,
            "low": 0.98,
            "method": "bootstrap percentile interval of median(candidate) / median(baseline)",
            "ratio": 1.01,
            "resamples": 2000,
            "seed": 13,
        },
        "max_regression_pct": 5.0,
        "max_tokens": 64,
        "median": 41.25,
        "prompts": "realtext:edit",
        "runs": 4,
        "samples": [41, 41.5, 42.25, 40.0],
        "threshold": 0.95,
    },
    "detail": "health ok, chat ok; decode 41.5 tok/s",
    "gate": "bench",
    "passed": True,
    "tok_s": 41.5,
}

# A generation as a passing bench switch leaves it, and the one found installed before it.
PASSED = {
    "changed": ["chat"],
    "date": "2025-01-01T00:00:01+00:00",
    "gaps": {
        "chat": {"drain_s": 0.05, "drained": True, "gap_s": 0.42, "in_flight": 0, "load_s": 0.31}
    },
    "gate": {"instances": {"chat": BENCH_RESULT}, "kind": "bench", "result": "passed"},
    "instances": {"chat": {"port": 8080, "source_revision": "abc123", "variant": "upstream"}},
    "manager": {"manager": "up", "units_dir": "/srv/up"},
    "number": 2,
    "removed": [],
}
FOUND = {
    "date": "2025-01-01T00:00:00+00:00",
    "gate": {"result": "unverified"},
    "instances": {"chat": {"port": None, "source_revision": None, "variant": None}},
    "note": "found installed before the first switch",
    "number": 1,
}
FAILED = {
    "changed": ["chat"],
    "date": "2025-01-01T00:00:02+00:00",
    "gate": {
        "instances": {
            "chat": {
                "bench": None,
                "detail": "did not start: exited",
                "gate": "health",
                "passed": False,
                "tok_s": None,
            }
        },
        "kind": "health",
        "result": "failed",
    },
    "instances": {"chat": {"port": 8080, "source_revision": None, "variant": "ik"}},
    "manager": {"flake": "/srv/flake", "manager": "nixos"},
    "number": 3,
    "removed": [],
    "rollback": {"serving_again": True},
    "activated_again": "2025-01-02T00:00:00+00:00",
}


@pytest.mark.parametrize("data", [PASSED, FOUND, FAILED], ids=["passed", "found", "failed"])
def test_a_generation_record_reads_back_as_written(data: dict[str, Any]) -> None:
    record = from_json_lenient(GenerationRecord, data)
    assert stored(record.to_json()) == data
    assert stored(from_json_lenient(GenerationRecord, stored(record.to_json())).to_json()) == data


def test_a_generation_record_is_typed() -> None:
    record = from_json_lenient(GenerationRecord, PASSED)
    assert record.outcome == "passed" and record.gate is not None
    assert record.instances["chat"] == InstanceSummary("upstream", "abc123", 8080)
    assert record.manager == ManagerRecord("up", units_dir="/srv/up")
    chat = (record.gate.instances or {})["chat"]
    assert chat.passed and chat.bench is not None and chat.bench.decision == "pass"
    assert chat.bench.interval == RatioInterval(0.98, 1.01, 1.05)
    assert from_json_lenient(GenerationRecord, FAILED).rollback == RollbackRecord(
        serving_again=True
    )


def test_what_the_gate_writes_is_what_a_generation_reads() -> None:
    baseline = Baseline((40.0, 41.0, 42.0), "fresh", None, "2025-01-01T00:00:00+00:00")
    verdict = BenchVerdict(
        (41, 41.5, 42.25, 40.0),
        "keep",
        "note",
        "pass",
        RatioInterval(0.98, 1.01, 1.05),
        0.95,
        5.0,
        baseline,
        "realtext:edit",
    )
    result = GateResult("chat", "bench", True, BENCH_RESULT["detail"], 41.5, verdict)  # type: ignore[arg-type]
    assert stored(result.to_json()) == BENCH_RESULT
    assert GateRecord("passed", "bench", {"chat": result}).to_json()["instances"]["chat"] == (
        result.to_json()
    )


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {},
        {"number": "two", "gate": "passed", "instances": [], "changed": "chat"},
        {"gate": {"result": "rollback target"}},
        {"gate": {"result": "passed", "instances": {"chat": {"gate": "fast"}, "b": 3}}},
    ],
)
def test_an_unreadable_record_reads_as_what_it_holds(data: object) -> None:
    record = from_json_or_none(GenerationRecord, data) or GenerationRecord()
    assert record.outcome in (None, "passed")
    assert record.number is None and record.instances == {}
    assert record.gate is None or record.gate.instances == {}


def test_a_gate_result_from_before_bench_verdicts_reads() -> None:
    old = {"detail": "health ok", "gate": "health", "passed": True, "tok_s": None}
    result = from_json_or_none(GateResult, old, name="chat")
    assert result == GateResult("chat", "health", True, "health ok")


def test_manager_records() -> None:
    assert from_json_or_none(ManagerRecord, {"manager": "up", "units_dir": "x"}) == ManagerRecord(
        "up", units_dir="x"
    )
    assert ManagerRecord("nixos", flake="/f").to_json() == {"manager": "nixos", "flake": "/f"}
    assert from_json_or_none(ManagerRecord, {"manager": "docker"}) is None
    assert from_json_or_none(ManagerRecord, None) is None


def test_baseline_records(tmp_path: Path) -> None:
    state = HostState(tmp_path, "dev")
    written = {
        "date": "d",
        "generation": 2,
        "samples": [41.0, 42.0, 40.5],
        "tok_s": 41.0,
        "variant": "upstream",
    }
    state.save_baseline("chat", from_json_lenient(BaselineRecord, written))
    assert json.loads((tmp_path / "bench" / "chat.json").read_text()) == written
    assert state.baseline("chat") == BaselineRecord((41.0, 42.0, 40.5), 41.0, 2, "upstream", "d")
    assert state.baseline("other") is None


def render() -> Render:
    return Render(
        host="dev",
        kind="systemd",
        config_hash="sha256:00",
        instances=(
            RenderedInstance(
                name="chat",
                unit="llamanix-chat.service",
                unit_text="[Service]\n",
                argv=("/bin/llama-server", "--port", "8080"),
                variant="upstream",
                source_revision=None,
                version="b1",
                environment={"A": "1"},
                listen="127.0.0.1",
                port=8080,
                alias=None,
                gpu=False,
            ),
        ),
    )


def test_the_manifest_reads_back_as_written() -> None:
    text = render().files()["manifest.json"]
    assert json.loads(text) == {
        "config_hash": "sha256:00",
        "host": "dev",
        "kind": "systemd",
        "instances": {
            "chat": {
                "unit": "llamanix-chat.service",
                "variant": "upstream",
                "source_revision": None,
                "version": "b1",
                "argv": ["/bin/llama-server", "--port", "8080"],
                "environment": {"A": "1"},
                "listen": "127.0.0.1",
                "port": 8080,
                "alias": None,
                "gpu": False,
            }
        },
    }
    assert Manifest.parse(text).text() == text
    assert Manifest.parse(text) == render().manifest()


def test_a_manifest_entry_without_a_unit_names_the_default_one() -> None:
    found = Manifest.parse('{"kind": "nixos", "instances": {"a": {}}}')
    assert found.instances == {"a": ManifestInstance("llamanix-a.service")}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"kind": "systemd"}',
        '{"kind": "x", "instances": {}}',
        '{"kind": "systemd", "instances": {"a": 1}}',
    ],
)
def test_what_is_not_a_manifest_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Manifest.parse(text)


def test_generations_lists_the_records_as_they_are_on_disk(tmp_path: Path) -> None:
    """The listing's JSON is the records' own, key order included."""
    config = tmp_path / "llamanix.toml"
    config.write_text(
        f'[hosts.dev]\nkind = "systemd"\n{BINARIES}\n[instances.chat]\nmodel = "/m.gguf"\n'
    )
    state = HostState.beside(config, "dev")
    state.root.mkdir(parents=True)
    (state.root / "manager.json").write_text(json.dumps({"manager": "up", "units_dir": "x"}))
    for data in (FOUND, PASSED, FAILED):
        folder = state.generations_dir / str(data["number"])
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    (state.root / "current").write_text("2\n")
    result = CliRunner().invoke(main, ["generations", str(config), "--json"])
    assert result.exit_code == 0, result.output
    expected = [
        {
            "number": data["number"],
            "current": data["number"] == 2,
            "date": data["date"],
            "instances": data["instances"],
            "gate": data["gate"],
            "rollback": data.get("rollback"),
            "gaps": data.get("gaps", {}),
            "warm": data.get("warm", {}),
            "not_serving_now": {},
        }
        for data in (FOUND, PASSED, FAILED)
    ]
    assert result.output == json.dumps(expected, indent=2) + "\n"
    table = CliRunner().invoke(main, ["generations", str(config)], env={"COLUMNS": "200"})
    assert "chat: pass 1.010 [0.980, 1.050]" in table.output
    assert "chat: did not start: exited" in table.output
    # The restart's gap next to the load time, as the switch recorded it.
    assert "chat: gap 0.42 s, load 0.31 s, drained in 0.05 s" in table.output
