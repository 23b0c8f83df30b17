"""LlamaServer against the real llama-server: start, health, answer, stop, fail fast."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from cli_run import server_argv

from llamanix.external.llama_server import ServerStartError
from llamanix.external.process import alive
from llamanix.server.server_process import (
    LlamaServer,
    free_port,
    processes_with_env,
    with_listen_address,
)

if TYPE_CHECKING:
    from conftest import ServerFactory, SynthModels


def test_listen_address_added_only_where_missing() -> None:
    added = with_listen_address(["llama-server", "-m", "m.gguf"])
    assert added[:3] == ["llama-server", "-m", "m.gguf"]
    assert added[3:5] == ["--host", "127.0.0.1"]
    assert added[5] == "--port" and int(added[6]) > 0
    kept = ["llama-server", "--host", "0.0.0.0", "--port", "8123"]
    assert with_listen_address(kept) == kept
    assert with_listen_address(["llama-server", "--port=9000"])[1:] == [
        "--port=9000",
        "--host",
        "127.0.0.1",
    ]


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.server
def test_starts_answers_and_stops(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    argv = server_argv(llama_server_bin, synth_models.target, ctx=1024, parallel=1, threads=2)
    server = LlamaServer(argv, tmp_path / "server.log")
    with server:
        assert server.url == f"http://127.0.0.1:{server.port}"
        health = httpx.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}
        reply = httpx.post(
            f"{server.url}/completion",
            json={"prompt": "the quick brown fox", "n_predict": 16, "temperature": 0},
            timeout=60,
        )
        assert reply.status_code == 200
        body = reply.json()
        assert body["timings"]["predicted_n"] == 16
        assert body["content"]
        pid = server.pid
        assert pid is not None and alive(pid)
    assert server.process is not None and server.process.returncode is not None
    assert not alive(pid)
    assert "print_timing" in server.log_text()


@pytest.mark.server
def test_explicit_port_is_used(
    llama_server_bin: Path, synth_models: SynthModels, server_factory: ServerFactory
) -> None:
    port = free_port()
    server = server_factory(
        server_argv(
            llama_server_bin, synth_models.target, ctx=512, parallel=1, threads=2, port=port
        )
    )
    assert server.url == f"http://127.0.0.1:{port}"
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


@pytest.mark.server
def test_stopped_even_when_the_block_raises(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    server = LlamaServer(
        server_argv(llama_server_bin, synth_models.target, ctx=512, parallel=1, threads=2),
        tmp_path / "server.log",
    )
    with pytest.raises(RuntimeError, match="test body failed"), server:
        raise RuntimeError("test body failed")
    assert server.pid is not None and not alive(server.pid)


@pytest.mark.server
def test_bad_model_path_fails_fast_with_log_tail(llama_server_bin: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    server = LlamaServer(
        [str(llama_server_bin), "-m", str(missing), "-t", "2"],
        tmp_path / "server.log",
        start_timeout_s=120,
    )
    with pytest.raises(ServerStartError) as info:
        server.start()
    message = str(info.value)
    # It saw the exit, it did not wait out the deadline.
    assert "exited with code" in message
    assert "not healthy after" not in message
    assert str(missing) in message  # the log tail names the model it could not load
    assert server.pid is not None and not alive(server.pid)


@pytest.mark.server
def test_not_healthy_by_the_deadline_is_stopped(
    llama_server_bin: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    # Loading takes far longer than a millisecond, so the deadline passes first.
    server = LlamaServer(
        server_argv(llama_server_bin, synth_models.target, ctx=512, threads=2),
        tmp_path / "server.log",
        start_timeout_s=0.001,
    )
    with pytest.raises(ServerStartError, match="not healthy after"):
        server.start()
    assert server.pid is not None and not alive(server.pid)


def test_processes_with_env_finds_tagged_children(tmp_path: Path) -> None:
    import subprocess
    import sys

    tag = f"tag-{os.getpid()}"
    env = {**os.environ, "LLAMANIX_TEST_PROBE": tag}
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env=env,
    )
    try:
        assert processes_with_env("LLAMANIX_TEST_PROBE", tag) == [child.pid]
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    assert processes_with_env("LLAMANIX_TEST_PROBE", tag) == []
