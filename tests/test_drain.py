"""The drain and the gap (llamanix.server.drain) against a real llama-server: the drain waits
for a streamed answer in flight and no longer, and the watch sees the server's answers."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import server_argv

from llamanix.server.drain import AnswerWatch, Drained, Endpoint, drain, gap_of, in_flight
from llamanix.testbed.synth import SynthSpec, synth_model

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's tiny model: a context long enough for an answer that outlasts a drain."""
    return synth_model(SynthSpec(seed=1), tmp_path_factory.mktemp("drain") / "tiny.gguf")


def _start(
    server_factory: Any, model: Path, llama_server_bin: Path, port: int | None = None
) -> Any:
    return server_factory(
        server_argv(
            llama_server_bin, model, "--metrics", ctx=16384, parallel=2, threads=1, port=port
        )
    )


def test_the_drain_waits_for_the_answer_in_flight_and_no_longer(
    server_factory: Any, model: Path, llama_server_bin: Path
) -> None:
    server = _start(server_factory, model, llama_server_bin)
    endpoint = Endpoint(server.url)
    with endpoint.client(timeout_s=5) as http:
        assert in_flight(http) == 0
    ended: list[float] = []

    def stream() -> None:
        body = {"prompt": "Once upon a time", "n_predict": 2000, "ignore_eos": True, "stream": True}
        with (
            httpx.Client(timeout=60) as c,
            c.stream("POST", server.url + "/completion", json=body) as r,
        ):
            for _ in r.iter_lines():
                pass
        ended.append(time.monotonic())

    worker = threading.Thread(target=stream)
    worker.start()
    with endpoint.client(timeout_s=5) as http:
        deadline = time.monotonic() + 10
        while in_flight(http) != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert in_flight(http) == 1
    started = time.monotonic()
    drained = drain(endpoint, timeout_s=60)
    worker.join()
    assert drained.idle and drained.in_flight == 0
    # It let go once the answer was done: after the stream's end, within a few polls.
    assert drained.last_answer is not None
    assert ended[0] - 0.05 <= drained.last_answer <= ended[0] + 0.5
    print(f"\ndrain: waited {drained.waited_s:.3f} s for one streamed answer")
    assert drained.waited_s <= time.monotonic() - started


def test_a_drain_that_times_out_says_how_many_were_left(
    server_factory: Any, model: Path, llama_server_bin: Path
) -> None:
    server = _start(server_factory, model, llama_server_bin)
    endpoint = Endpoint(server.url)
    body = {"prompt": "Once upon a time", "n_predict": 2000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", server.url + "/completion", json=body) as r,
        endpoint.client(timeout_s=5) as http,
    ):
        lines = r.iter_lines()
        next(lines)
        deadline = time.monotonic() + 10
        while in_flight(http) != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        drained = drain(endpoint, timeout_s=0.1)
        for _ in lines:
            pass
    assert not drained.idle
    assert drained.in_flight == 1
    assert 0.1 <= drained.waited_s < 1


def test_nothing_to_drain_where_nothing_answers(tmp_path: Path) -> None:
    drained = drain(Endpoint("http://127.0.0.1:9"), timeout_s=5)
    assert drained == Drained(drained.waited_s, False, None, None)
    assert drained.waited_s < 1


def test_the_watch_sees_the_answers_of_a_restart(
    server_factory: Any, model: Path, llama_server_bin: Path
) -> None:
    server = _start(server_factory, model, llama_server_bin)
    endpoint = Endpoint(server.url)
    with AnswerWatch([endpoint], poll_s=0.01) as watch:
        time.sleep(0.3)
        server.stop()
        stopped = time.monotonic()
        time.sleep(0.3)
        started = time.monotonic()
        _start(server_factory, model, llama_server_bin, server.port)
        deadline = time.monotonic() + 30
        while not any(t >= started for t in watch.answers()) and time.monotonic() < deadline:
            time.sleep(0.01)
    gap = gap_of(watch.answers(), started)
    assert gap.last_old is not None and gap.last_old <= stopped
    assert gap.first_new is not None and gap.first_new >= started
    assert gap.gap_s is not None and gap.load_s is not None
    # The gap holds the 0.3 s the server was down, and the new server's start.
    assert gap.gap_s >= 0.3 + gap.load_s
    print(f"\nwatch: gap {gap.gap_s:.3f} s, load {gap.load_s:.3f} s")


def test_the_gap_splits_answers_at_the_new_process_start() -> None:
    answers = [1.0, 1.5, 2.0, 3.2, 3.3]
    drained = Drained(0.1, True, 0, 2.1)
    gap = gap_of(answers, started=3.0, drained=drained)
    assert (gap.last_old, gap.first_new) == (2.1, 3.2)
    assert gap.gap_s == pytest.approx(1.1)
    assert gap.load_s == pytest.approx(0.2)
    assert gap_of([], started=3.0).gap_s is None
