"""The deploy loop for real: ``llamanix up`` as the service manager, the real llama-server,
real HTTP. A switch that passes its gate is kept; a new variant that cannot start and one
slower than --min-tok-s are rolled back, and each time the previous generation answers again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import llamanix_argv, run_llamanix

from llamanix.server.server_process import free_port
from llamanix.state.up_status import UpInstance
from llamanix.testbed.up_process import instance_status, running_up

DEADLINE_S = 120.0

pytestmark = pytest.mark.server


llamanix = partial(run_llamanix, timeout=300)


def n_ctx(url: str) -> int:
    props = httpx.get(f"{url}/props", timeout=10).json()
    return int(props["default_generation_settings"]["n_ctx"])


def serving(url: str) -> bool:
    health = httpx.get(f"{url}/health", timeout=10)
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    return health.status_code == 200 and chat.status_code == 200 and bool(chat.json()["choices"])


def chat(units: Path) -> UpInstance:
    """up's entry for the instance, which it has while the ``up`` fixture runs."""
    entry = instance_status(units, "chat")
    assert entry is not None
    return entry


def settled_files(d: Path) -> None:
    """No half-written file anywhere: no temp files left, every JSON file parses."""
    assert [p for p in d.rglob("*") if p.name.endswith(".tmp")] == []
    for p in d.rglob("*.json"):
        json.loads(p.read_text())


@pytest.fixture
def deploy_dir(tmp_path: Path, llama_server_bin: Path, synth_models: Any) -> Path:
    port = free_port()
    (tmp_path / "llamanix.toml").write_text(
        "# a machine without systemd\n"
        '[hosts.dev]\nkind = "systemd"\n'
        f'binaries = {{ upstream = "{llama_server_bin}", '
        f'ik = "{tmp_path}/missing/llama-server" }}\n'
        "\n[instances.chat]\n"
        f'model = "{synth_models.target}"\nport = {port}\ncontext = 512\nthreads = 1\n'
        'alias = "synthetic"\n'
    )
    return tmp_path


@pytest.fixture
def up(deploy_dir: Path) -> Iterator[subprocess.Popen[str]]:
    with running_up(deploy_dir / "llamanix.toml", "dev", "chat", deadline_s=DEADLINE_S) as proc:
        yield proc


def test_switch_gate_and_rollback_with_up(deploy_dir: Path, up: subprocess.Popen[str]) -> None:
    config = deploy_dir / "llamanix.toml"
    units = deploy_dir / ".llamanix-state" / "dev" / "up"
    url = chat(units).url
    assert url is not None and n_ctx(url) == 512
    first_pid = chat(units).pid

    # 1. A switch that passes the smoke gate (health, chat, /metrics): the new generation serves.
    ok = llamanix(
        "switch",
        "llamanix.toml",
        "--host",
        "dev",
        "--manager",
        "up",
        "--set",
        "instances.chat.context=1024",
        "--gate",
        "smoke",
        cwd=deploy_dir,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert n_ctx(url) == 1024 and serving(url)
    assert chat(units).pid != first_pid
    good_config = config.read_text()
    good_units = {p.name: p.read_text() for p in units.glob("llamanix-*.service")}

    # 2. The new variant's binary cannot start: rolled back, the previous generation serves.
    broken = llamanix(
        "switch",
        "llamanix.toml",
        "--host",
        "dev",
        "--manager",
        "up",
        "--set",
        "instances.chat.variant=ik",
        "--timeout",
        "60",
        cwd=deploy_dir,
    )
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "did not start" in broken.stderr
    assert serving(url) and n_ctx(url) == 1024
    assert config.read_text() == good_config
    assert {p.name: p.read_text() for p in units.glob("llamanix-*.service")} == good_units
    settled_files(deploy_dir)

    # 3. Slower than --min-tok-s (no CPU decodes 1e9 tok/s): rolled back, previous serves.
    slow = llamanix(
        "switch",
        "llamanix.toml",
        "--host",
        "dev",
        "--manager",
        "up",
        "--set",
        "instances.chat.context=2048",
        "--min-tok-s",
        "1e9",
        cwd=deploy_dir,
    )
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "below --min-tok-s" in slow.stderr
    assert serving(url) and n_ctx(url) == 1024
    assert config.read_text() == good_config
    settled_files(deploy_dir)

    # 4. The record: what was tried, and the gate's verdict on each.
    listing = llamanix("generations", "llamanix.toml", "--host", "dev", "--json", cwd=deploy_dir)
    gens = json.loads(listing.stdout)
    assert [(g["gate"].get("kind"), g["gate"]["result"]) for g in gens] == [
        (None, "unverified"),
        ("smoke", "passed"),
        ("health", "failed"),
        ("bench", "failed"),
    ]
    assert [g["current"] for g in gens] == [False, True, False, False]
    assert gens[2]["instances"]["chat"]["variant"] == "ik"
    assert gens[1]["instances"]["chat"]["source_revision"]  # read from the binary's --version

    # 5. Rollback to the first generation: its config and its server come back.
    back = llamanix("rollback", "llamanix.toml", "--host", "dev", cwd=deploy_dir)
    assert back.returncode == 0, back.stdout + back.stderr
    assert n_ctx(url) == 512 and serving(url)
    assert "context = 512" in config.read_text()

    # Ctrl-C stops everything `up` started.
    pid = chat(units).pid
    assert pid is not None
    up.send_signal(signal.SIGINT)
    assert up.wait(timeout=30) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not (units / "up-status.json").exists()


def test_up_restarts_a_crashed_instance(deploy_dir: Path, up: subprocess.Popen[str]) -> None:
    units = deploy_dir / ".llamanix-state" / "dev" / "up"
    # The rendered unit says Restart=on-failure, RestartSec=10s: a SIGKILL is a failure.
    unit = units / "llamanix-chat.service"
    before = chat(units)
    assert before.starts == 1 and before.pid is not None
    os.kill(before.pid, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        now = chat(units)
        if now.state == "running" and now.starts == 2:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert "Restart=on-failure" in unit.read_text()
    assert now.url is not None and serving(now.url)


# --- one switch at a time per host --------------------------------------------------------


def start_switch(deploy_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        llamanix_argv("switch", "llamanix.toml", "--manager", "up", *extra),
        cwd=deploy_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lock_holder(deploy_dir: Path) -> dict[str, Any]:
    """Who holds host dev's lock, as its file says (empty while nobody does)."""
    try:
        text = (deploy_dir / ".llamanix-state" / "dev" / "lock").read_text()
    except FileNotFoundError:
        return {}
    data: dict[str, Any] = json.loads(text) if text else {}
    return data


def wait_for_holder(deploy_dir: Path, proc: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while not (holder := lock_holder(deploy_dir)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first switch never took the lock"
        time.sleep(0.02)
    return holder


def test_two_switches_at_once_take_turns(deploy_dir: Path, up: subprocess.Popen[str]) -> None:
    first = start_switch(deploy_dir, "--set", "instances.chat.context=1024")
    holder = wait_for_holder(deploy_dir, first)
    assert holder["pid"] == first.pid and holder["command"] == "switch"

    # A second switch of the same host while the first runs: one line, exit 2, nothing changed.
    refused = llamanix(
        "switch",
        "llamanix.toml",
        "--manager",
        "up",
        "--set",
        "instances.chat.context=768",
        cwd=deploy_dir,
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"llamanix.toml: host dev is being switched by pid {first.pid} (since {holder['since']}) "
        "(try again, or pass --wait SECONDS)"
    ]
    assert "Traceback" not in refused.stderr

    # With --wait it takes its turn after the first.
    waiting = start_switch(deploy_dir, "--wait", "300", "--set", "instances.chat.context=768")
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, out + err

    listing = llamanix("generations", "llamanix.toml", "--json", cwd=deploy_dir)
    gens = json.loads(listing.stdout)
    numbers = [g["number"] for g in gens]
    assert numbers == sorted(set(numbers))  # never the same number twice
    assert [g["gate"]["result"] for g in gens][-2:] == ["passed", "passed"]
    assert "context = 768" in (deploy_dir / "llamanix.toml").read_text()
    assert lock_holder(deploy_dir) == {}
    settled_files(deploy_dir)


def test_a_killed_switch_leaves_nothing_that_blocks(
    deploy_dir: Path, up: subprocess.Popen[str]
) -> None:
    doomed = start_switch(deploy_dir, "--set", "instances.chat.context=1024")
    wait_for_holder(deploy_dir, doomed)
    doomed.kill()  # SIGKILL while it holds the lock
    doomed.communicate()

    # The kernel released the dead switch's lock: the next switch proceeds at once.
    after = llamanix(
        "switch",
        "llamanix.toml",
        "--manager",
        "up",
        "--set",
        "instances.chat.context=768",
        cwd=deploy_dir,
    )
    assert after.returncode == 0, after.stdout + after.stderr
    assert "context = 768" in (deploy_dir / "llamanix.toml").read_text()
    listing = llamanix("generations", "llamanix.toml", "--json", cwd=deploy_dir)
    assert listing.returncode == 0 and json.loads(listing.stdout)
    assert llamanix("validate", "llamanix.toml", cwd=deploy_dir).returncode == 0
