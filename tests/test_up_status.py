"""``llamanix up``'s status file (state/up_status.py): what the supervisor writes is what the
managers, ``plan`` and a second ``up`` read back; a file whose ``up`` is gone is ignored; one
that a live ``up`` wrote but that does not read as a status is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

from cli_run import run_llamanix

from llamanix.state.up_status import STATUS, UpInstance, UpStatus, read_status, write_status
from llamanix.testbed.up_process import instance_state, up_units

# The llama-server a plain systemd host runs (a host names one per variant it serves).
BINARIES = 'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
RUNNING = UpInstance("k1", "running", 4242, "http://127.0.0.1:9001", 2, None)
FAILED = UpInstance("k2", "failed", None, None, 5, "exit status 1")


llamanix = partial(run_llamanix, timeout=120)


def host_config(tmp_path: Path) -> Path:
    config = tmp_path / "llamanix.toml"
    config.write_text(
        f'[hosts.dev]\nkind = "systemd"\n{BINARIES}\n'
        '[instances.chat]\nmodel = "/srv/models/chat.gguf"\n'
    )
    return config


def test_the_status_reads_back_as_the_supervisor_wrote_it(tmp_path: Path) -> None:
    status = UpStatus(os.getpid(), "ab" * 32, {"chat": RUNNING, "other": FAILED})
    write_status(tmp_path, status)
    assert read_status(tmp_path) == status
    assert instance_state(tmp_path, "other") == "failed"
    assert instance_state(tmp_path, "missing") is None
    # The file's shape is what the demo and the tests read: keys in this order.
    data = json.loads((tmp_path / STATUS).read_text())
    assert list(data) == ["pid", "manifest", "instances"]
    assert data["pid"] == os.getpid() and data["manifest"] == "ab" * 32
    assert list(data["instances"]) == ["chat", "other"]
    assert data["instances"]["other"] == {
        "key": "k2",
        "state": "failed",
        "pid": None,
        "url": None,
        "starts": 5,
        "last_error": "exit status 1",
    }
    assert list(data["instances"]["chat"]) == list(data["instances"]["other"])


def test_a_status_whose_up_is_gone_is_ignored(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    write_status(tmp_path, UpStatus(int(gone.stdout), None, {"chat": RUNNING}))
    assert read_status(tmp_path) is None
    assert instance_state(tmp_path, "chat") is None
    # Nor is a file that is not JSON at all (up writes it atomically: never half a file).
    (tmp_path / STATUS).write_text("{")
    assert read_status(tmp_path) is None


def test_a_second_up_for_the_directory_is_refused(tmp_path: Path) -> None:
    config = host_config(tmp_path)
    units = up_units(config, "dev")
    units.mkdir(parents=True)
    write_status(units, UpStatus(os.getpid(), None, {}))
    done = llamanix("up", "llamanix.toml", "--host", "dev", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"{units}: llamanix up (pid {os.getpid()}) already manages this directory "
        "(stop that one first)"
    ]


def test_a_live_status_this_version_cannot_read_is_one_line(tmp_path: Path) -> None:
    config = host_config(tmp_path)
    units = up_units(config, "dev")
    units.mkdir(parents=True)
    data = UpStatus(os.getpid(), None, {"chat": RUNNING}).to_json()
    data["instances"] = {"chat": {**RUNNING.to_json(), "state": "paused"}}
    (units / STATUS).write_text(json.dumps(data))
    expected = [
        f"{units / STATUS}: instances.chat.state: unknown state 'paused' (expected one of "
        "'starting', 'running', 'restarting', 'failed', 'exited', 'stopped'): not a status this "
        f"llamanix reads (stop that llamanix up (pid {os.getpid()}) and start it with this "
        "version)"
    ]
    # The supervisor's claim, and the managers' reader behind `plan`.
    for args in (("up", "llamanix.toml", "--host", "dev"), ("plan", "llamanix.toml")):
        done = llamanix(*args, cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.splitlines() == expected, args
