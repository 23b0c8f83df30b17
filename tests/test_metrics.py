"""/metrics parsing with prometheus-client's parser: recorded scrapes and a live server."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_run import server_argv

from llamanix.server.client import LlamaClient
from llamanix.server.metrics import MetricsSnapshot, metrics_delta, parse_metrics

if TYPE_CHECKING:
    from conftest import ServerFactory, SynthModels

DATA = Path(__file__).parent / "data"


def test_recorded_scrape() -> None:
    snap = parse_metrics((DATA / "upstream-metrics-spec.txt").read_text())
    assert snap.values["tokens_predicted_total"] == 32
    assert snap.values["spec_decode_num_draft_tokens_total"] == 45
    assert snap.values["spec_decode_num_accepted_tokens_total"] == 19
    assert snap.values['spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == 7
    assert snap.values["predicted_tokens_seconds"] == pytest.approx(445.223)
    assert "tokens_predicted_total" in snap.counters
    assert "predicted_tokens_seconds" not in snap.counters
    # Declared a counter, but a running maximum: kept under its own name, never subtracted.
    assert snap.values["n_tokens_max"] == 60 and "n_tokens_max" not in snap.counters
    assert not any(k.startswith("llamacpp:") for k in snap.values)


def test_delta_subtracts_counters_keeps_gauges() -> None:
    before = MetricsSnapshot(
        {"tokens_predicted_total": 10.0, "predicted_tokens_seconds": 5.0},
        frozenset({"tokens_predicted_total"}),
    )
    after = parse_metrics((DATA / "upstream-metrics-spec.txt").read_text())
    delta = metrics_delta(before, after)
    assert delta["tokens_predicted_total"] == 22
    assert delta["spec_decode_num_drafts_total"] == 12  # absent before: counted from zero
    assert delta["predicted_tokens_seconds"] == pytest.approx(445.223)


@pytest.mark.server
def test_live_delta_matches_the_request(
    llama_server_bin: Path, synth_models: SynthModels, server_factory: ServerFactory
) -> None:
    server = server_factory(
        server_argv(
            llama_server_bin, synth_models.target, "--metrics", ctx=1024, parallel=1, threads=1
        )
    )
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 24,
        "ignore_eos": True,
        "temperature": 0,
        "cache_prompt": False,
    }
    with LlamaClient(server.url, timeout_s=120) as client:
        client.chat(body).raise_for_status()
        before = client.metrics()
        timings = client.chat(body).json()["timings"]
        after = client.metrics()
    assert before is not None and after is not None
    delta = metrics_delta(before, after)
    assert delta["tokens_predicted_total"] == timings["predicted_n"] == 24
    assert delta["prompt_tokens_total"] == timings["prompt_n"]
    assert delta["tokens_predicted_seconds_total"] == pytest.approx(
        timings["predicted_ms"] / 1000, abs=1e-3
    )
    assert delta["spec_decode_num_draft_tokens_total"] == 0


@pytest.mark.server
def test_no_metrics_flag_means_none(
    llama_server_bin: Path, synth_models: SynthModels, server_factory: ServerFactory
) -> None:
    server = server_factory(
        server_argv(llama_server_bin, synth_models.target, ctx=512, parallel=1, threads=1)
    )
    with LlamaClient(server.url, timeout_s=30) as client:
        assert client.metrics() is None
