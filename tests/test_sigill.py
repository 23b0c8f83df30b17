"""A server that dies of an illegal instruction is named as such, with its cause and fix.

A build for another CPU (``-march=native`` moved to another machine, or AVX-512/AMX code that a
VM advertises and cannot run) answers ``--help`` and dies on its first batch; the stand-in
(``standins.build_sigill_server``) does that with a real SIGILL from the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_run import server_argv
from click.testing import CliRunner
from standins import build_sigill_server

from llamanix.cli import main
from llamanix.core.process_end import describe_returncode, died_of
from llamanix.external.llama_server import ServerStartError
from llamanix.external.systemctl import UnitState
from llamanix.server.server_log import parse_server_log
from llamanix.server.server_process import LlamaServer

if TYPE_CHECKING:
    from conftest import SynthModels

SIGILL_LINE = "llama-server died: illegal instruction (SIGILL) — a build for another CPU"


@pytest.fixture
def sigill_server(llama_server_bin: Path, tmp_path: Path) -> Path:
    return build_sigill_server(str(llama_server_bin), tmp_path / "llama-server-other-cpu")


def test_a_signal_is_named_and_sigill_carries_its_fix() -> None:
    assert died_of(4).startswith(SIGILL_LINE + "; rebuild llama-server for this machine's CPU")
    assert died_of(11) == "llama-server died: segmentation fault (SIGSEGV)"
    assert describe_returncode(-4) == died_of(4)
    assert describe_returncode(1) == "llama-server exited with code 1"
    dumped = UnitState(
        "llamanix-chat.service", "failed", "failed", "core-dump", 0, 4, main_code="dumped"
    )
    assert dumped.killed_by == 4
    assert dumped.describe() == "llamanix-chat.service failed, not restarting (core-dump, SIGILL)"
    exited = UnitState(
        "llamanix-chat.service", "failed", "failed", "exit-code", 0, 4, main_code="exited"
    )
    assert exited.killed_by is None and "exit status 4" in exited.describe()


def test_the_journal_line_of_a_sigill_is_read() -> None:
    log = parse_server_log(
        "main: server is listening on http://127.0.0.1:8080\n"
        "llamanix-chat.service: Main process exited, code=dumped, status=4/ILL\n"
        "llamanix-chat.service: Failed with result 'core-dump'.\n"
    )
    assert log.killed_by == 4
    assert (
        parse_server_log("Main process exited, code=exited, status=1/FAILURE\n").killed_by is None
    )


@pytest.mark.server
def test_a_server_that_dies_of_sigill_is_named_not_waited_for(
    sigill_server: Path, synth_models: SynthModels, tmp_path: Path
) -> None:
    server = LlamaServer(
        server_argv(sigill_server, synth_models.target, ctx=512, threads=2),
        tmp_path / "server.log",
        start_timeout_s=120,
    )
    with pytest.raises(ServerStartError) as info:
        server.start()
    message = str(info.value)
    assert message.startswith(SIGILL_LINE), message
    assert "not healthy after" not in message


@pytest.mark.server
def test_smoke_names_the_sigill(sigill_server: Path, tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llamanix",
            "check",
            "smoke",
            "--binary",
            str(sigill_server),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    start = next(c for c in json.loads(out.read_text())["checks"] if c["name"] == "start")
    assert start["status"] == "fail"
    assert start["detail"].startswith(SIGILL_LINE), start


def test_doctor_names_a_sigill_in_the_log(tmp_path: Path) -> None:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/usr/local/bin/llama-server" }\n\n'
        '[instances.chat]\nvariant = "upstream"\nmodel = "/srv/models/m.gguf"\nport = 8080\n'
    )
    log = tmp_path / "journal.txt"
    log.write_text(
        "llamanix-chat.service: Main process exited, code=dumped, status=4/ILL\n"
        "llamanix-chat.service: Failed with result 'core-dump'.\n"
    )
    result = CliRunner().invoke(
        main, ["doctor", str(config), "chat", "--log", str(log), "--json"], catch_exceptions=False
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["checks"]["server-exit"] == "finding"
    (finding,) = [f for f in report["findings"] if f["code"] == "server-killed"]
    assert finding["message"] == SIGILL_LINE
    assert finding["fix"].startswith("rebuild llama-server for this machine's CPU")
