"""A unit only counts as started once its server serves.

The rendered unit runs `llamanix readiness` as ExecStartPost= (systemd, and so `nixos-rebuild
switch`, then report a backend that never serves as failed), and `llamanix up` runs it the same
way. Proven with the real CPU llama-server: a serving server passes, one whose model is missing
fails as soon as it exits, a wrong API key fails with one line, and `up` counts a start whose
ExecStartPost fails as a failed start.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_llamanix, server_argv

from llamanix.core.address import connect_url
from llamanix.core.readiness import BASE_S, PER_GIB_S, deadline_s, start_timeout_s
from llamanix.hosts.supervisor import ServiceRunner, load_specs
from llamanix.render.units import llamanix_command
from llamanix.server.server_process import free_port

pytestmark = pytest.mark.server


readiness = partial(run_llamanix, "readiness", timeout=120)


def test_deadline_grows_with_the_model_size(tmp_path: Path) -> None:
    assert deadline_s(0) == BASE_S
    assert deadline_s(2**30) == BASE_S + PER_GIB_S
    assert deadline_s(16 * 2**30 + 1) == BASE_S + 17 * PER_GIB_S
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 1024)
    assert start_timeout_s([str(model)]) == deadline_s(1024) + 30
    # Unreadable at render time (a NixOS build): sized for 64 GiB.
    assert start_timeout_s([str(tmp_path / "absent.gguf")]) == deadline_s(64 * 2**30) + 30


def test_readiness_url_reaches_the_server_on_loopback() -> None:
    assert connect_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert connect_url("::", 8080) == "http://[::1]:8080"
    assert connect_url("127.0.0.1", 11435) == "http://127.0.0.1:11435"
    assert connect_url("192.168.1.5", 80) == "http://192.168.1.5:80"


def test_a_serving_server_is_ready(
    server_factory: Any, synth_models: Any, llama_server_bin: Path
) -> None:
    server = server_factory(server_argv(llama_server_bin, synth_models.target, ctx=256, threads=1))
    proc = readiness(
        "--url", server.url, "--model", str(synth_models.target), "--pid", str(server.pid)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{server.url}: serving after ")


def test_a_server_whose_model_is_missing_fails_once_it_exits(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    port = free_port()
    server = subprocess.Popen(
        [str(llama_server_bin), "-m", str(tmp_path / "missing.gguf"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        started = time.monotonic()
        proc = readiness("--url", f"http://127.0.0.1:{port}", "--pid", str(server.pid))
        # Long before the deadline (BASE_S): the server's exit ends the wait.
        assert time.monotonic() - started < BASE_S / 2
    finally:
        server.kill()
        server.wait()
    assert proc.returncode == 1
    # What it saw last depends on when the server died: nothing yet, or a refused connection.
    [line] = proc.stderr.strip().splitlines()
    assert line in (
        f"llamanix readiness: llama-server (pid {server.pid}) exited before serving ({last})"
        for last in ("no answer yet", "ConnectError")
    )


def test_a_wrong_api_key_is_one_line(
    tmp_path: Path, server_factory: Any, synth_models: Any, llama_server_bin: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("s3cret-key-for-test\n")
    server = server_factory(
        server_argv(
            llama_server_bin, synth_models.target, "--api-key-file", str(key), ctx=256, threads=1
        )
    )
    assert readiness("--url", server.url, "--api-key-file", str(key)).returncode == 0
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-key\n")
    proc = readiness("--url", server.url, "--api-key-file", str(wrong), "--timeout", "30")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"llamanix readiness: {server.url}: a one-token completion answered 401: "
        "check the API key file"
    ]
    assert "s3cret" not in proc.stdout + proc.stderr


def render_dir(tmp_path: Path, llama_server_bin: Path, model: Path, port: int) -> Path:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{llama_server_bin}" }}\n'
        f'[instances.chat]\nmodel = "{model}"\nport = {port}\ncontext = 256\nthreads = 1\n'
    )
    out = tmp_path / "render"
    proc = subprocess.run(
        [sys.executable, "-m", "llamanix", "render", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_rendered_unit_runs_readiness_as_exec_start_post(
    tmp_path: Path, llama_server_bin: Path, synth_models: Any
) -> None:
    port = free_port()
    out = render_dir(tmp_path, llama_server_bin, synth_models.target, port)
    unit = (out / "llamanix-chat.service").read_text()
    post = [line for line in unit.splitlines() if line.startswith("ExecStartPost=")]
    assert post == [
        f"ExecStartPost={' '.join(llamanix_command())} readiness --url http://127.0.0.1:{port} "
        f"--model {synth_models.target} --pid $MAINPID"
    ]
    size = synth_models.target.stat().st_size
    assert f"\nTimeoutStartSec={deadline_s(size) + 30}\n" in unit
    spec = load_specs(out)["chat"]
    assert spec.start_timeout_s == deadline_s(size) + 30
    assert spec.start_post_argv(4242) == [
        [
            *llamanix_command(),
            "readiness",
            "--url",
            f"http://127.0.0.1:{port}",
            "--model",
            str(synth_models.target),
            "--pid",
            "4242",
        ]
    ]


def run_once(spec: Any, tmp_path: Path) -> ServiceRunner:
    """Run one instance under `up`'s runner until its first start attempt has settled."""
    settled = threading.Event()
    runner: ServiceRunner

    def changed() -> None:
        if runner.status.state in ("running", "restarting", "failed"):
            settled.set()

    runner = ServiceRunner(spec, tmp_path, 120.0, changed, lambda line: None)
    runner.start()
    assert settled.wait(180), "the start attempt did not settle"
    return runner


def test_up_counts_a_failed_exec_start_post_as_a_failed_start(
    tmp_path: Path, llama_server_bin: Path, synth_models: Any
) -> None:
    port = free_port()
    out = render_dir(tmp_path, llama_server_bin, synth_models.target, port)
    spec = load_specs(out)["chat"]

    good = run_once(spec, tmp_path)
    try:
        assert good.status.state == "running" and good.status.last_error is None
    finally:
        good.request_stop()
        good.join()

    # The same server, but its readiness check looks at a port nobody serves: the server is
    # healthy and yet the unit must not count as started.
    wrong = connect_url("127.0.0.1", free_port())
    argv = [w if w != f"http://127.0.0.1:{port}" else wrong for w in spec.start_post[0]]
    argv += ["--timeout", "3"]
    bad_spec = dataclasses.replace(spec, start_post=(tuple(argv),), restart="no")
    bad = run_once(bad_spec, tmp_path)
    try:
        assert bad.status.state == "failed"
        assert bad.status.last_error == (
            f"ExecStartPost exited with 1: llamanix readiness: {wrong} not serving after 3s "
            "(ConnectError)"
        )
        assert bad.status.pid is None
    finally:
        bad.request_stop()
        bad.join()
    assert os.path.exists(out / "manifest.json")
