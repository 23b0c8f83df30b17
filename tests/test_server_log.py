"""Log-line parsing: recorded logs of the real binary, lines quoted from a user's report, a live
server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from cli_run import server_argv

from llamanix.server.server_log import parse_server_log

if TYPE_CHECKING:
    from conftest import ServerFactory, SynthModels

DATA = Path(__file__).parent / "data"


def test_plain_upstream_log() -> None:
    log = parse_server_log((DATA / "upstream-plain.log").read_text())
    assert len(log.prompt_timings) == 1 and len(log.eval_timings) == 1
    prompt, decode = log.prompt_timings[0], log.eval_timings[0]
    assert (prompt.ms, prompt.tokens, prompt.tok_s) == (3.39, 41, 12105.11)
    assert (decode.ms, decode.tokens, decode.tok_s) == (16.28, 20, 1167.15)
    assert (decode.slot, decode.task) == (0, 0)
    assert not log.draft_loaded and not log.drafted and not log.spec_refused
    assert log.acceptances == [] and log.overall_acceptance() is None


def test_speculation_with_the_target_as_draft() -> None:
    log = parse_server_log((DATA / "upstream-spec-same-draft.log").read_text())
    assert log.draft_model == "target.gguf"
    assert log.drafted
    (acc,) = log.acceptances
    assert (acc.rate, acc.accepted, acc.generated, acc.mean_len) == (1.0, 56, 56, 9.0)
    assert log.overall_acceptance() == 1.0


def test_draft_loaded_but_never_used() -> None:
    log = parse_server_log((DATA / "upstream-md-only.log").read_text())
    assert log.draft_loaded and not log.drafted
    assert len(log.eval_timings) == 1


def test_unrelated_draft_is_rejected() -> None:
    log = parse_server_log((DATA / "upstream-spec-unrelated-draft.log").read_text())
    (acc,) = log.acceptances
    assert (acc.accepted, acc.generated) == (0, 468)
    assert log.overall_acceptance() == 0.0


def test_other_vocabulary_draft() -> None:
    log = parse_server_log((DATA / "upstream-spec-other-vocab.log").read_text())
    assert log.vocab_incompatible
    assert log.spec_init_error is not None and "vocab" in log.spec_init_error
    assert not log.drafted


def test_field_report_refusal() -> None:
    """A user's report: b8770 on a hybrid model refuses speculation at start-up."""
    log = parse_server_log((DATA / "seed000-b8770-refused.log").read_text())
    assert log.spec_refused and not log.spec_initialized


def test_field_report_checkpoints_and_old_acceptance_format() -> None:
    log = parse_server_log((DATA / "seed000-upstream-checkpoints.log").read_text())
    assert log.spec_checkpoints and log.spec_initialized and not log.spec_refused
    (acc,) = log.acceptances
    assert (acc.rate, acc.accepted, acc.generated, acc.mean_len) == (1.0, 1369, 1369, None)


@pytest.mark.parametrize(
    ("line", "accepted", "generated"),
    [
        # b8770 / ik format (common/speculative.cpp of that era)
        ("draft acceptance rate = 0.57576 (   19 accepted /    33 generated)", 19, 33),
        # master, behind the slot prefix and a journald prefix
        (
            "Oct 01 12:00:00 gpu1 llama-server[812]: 0.01.2 I slot print_timing: id  0 | task 7 | "
            "draft acceptance = 0.12698 (    8 accepted /    63 generated), mean len =  1.13",
            8,
            63,
        ),
    ],
)
def test_acceptance_formats(line: str, accepted: int, generated: int) -> None:
    (acc,) = parse_server_log(line).acceptances
    assert (acc.accepted, acc.generated) == (accepted, generated)


def test_unprefixed_timing_lines() -> None:
    """b8770 and ik print the timing lines without the slot prefix."""
    text = (
        "prompt eval time =     123.45 ms /    24 tokens (    5.14 ms per token,   194.41 tokens "
        "per second)\n"
        "       eval time =   14990.00 ms /  1000 tokens (   14.99 ms per token,    66.71 tokens "
        "per second)\n"
        "      total time =   15113.45 ms /  1024 tokens\n"
    )
    log = parse_server_log(text)
    assert log.prompt_timings[0].tok_s == 194.41
    assert log.eval_timings[0].tok_s == 66.71 and log.eval_timings[0].slot is None


def test_cuda_lines() -> None:
    log = parse_server_log((DATA / "cuda-device-lines.log").read_text())
    (dev,) = log.cuda_devices
    assert (dev.index, dev.name, dev.compute_capability) == (0, "NVIDIA GeForce RTX 5090", "12.0")
    assert log.layers_offloaded == (65, 65)


def test_json_has_derived_fields() -> None:
    data = parse_server_log((DATA / "upstream-spec-same-draft.log").read_text()).to_json()
    assert data["draft_loaded"] and data["drafted"] and data["overall_acceptance"] == 1.0


@pytest.mark.server
def test_live_log_matches_the_response_timings(
    llama_server_bin: Path, synth_models: SynthModels, server_factory: ServerFactory
) -> None:
    server = server_factory(
        server_argv(
            llama_server_bin,
            synth_models.target,
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            str(synth_models.target),
            "--spec-draft-n-max",
            "4",
            ctx=1024,
            parallel=1,
            threads=1,
        )
    )
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0,
    }
    timings = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()[
        "timings"
    ]
    # The slot prints its timing lines right after the response; poll for them.
    deadline = time.monotonic() + 10
    log = parse_server_log(server.log_text())
    while not log.acceptances and time.monotonic() < deadline:
        time.sleep(0.05)
        log = parse_server_log(server.log_text())
    (decode,) = log.eval_timings
    assert decode.tokens == timings["predicted_n"] == 40
    assert decode.tok_s == pytest.approx(timings["predicted_per_second"], abs=0.01)
    assert log.prompt_timings[0].tokens == timings["prompt_n"]
    (acc,) = log.acceptances
    assert acc.generated == timings["draft_n"] and acc.accepted == timings["draft_n_accepted"]
    assert log.draft_model == str(synth_models.target)
