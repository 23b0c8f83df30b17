"""A switch or rollback SIGKILLed at each named step leaves a host that the next command can
use: the config parses, the generations list, the lock is free, and the next switch or
rollback (without --wait) exits 0 with the instance serving what the config says.

Real processes throughout: ``llamanix up`` runs the real llama-server; the killed command is
a real ``llamanix switch``/``rollback`` that sends itself SIGKILL at the step named by
``LLAMANIX_TEST_CRASH_AT`` (llamanix.state.crash_point).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import run_llamanix

from llamanix.server.server_process import free_port
from llamanix.state.crash_point import CRASH_ENV, CRASH_POINTS, RESTART_POINTS, CrashPoint
from llamanix.state.up_status import UpInstance
from llamanix.testbed.up_process import instance_status, start_up, stop_up

DEADLINE_S = 120.0

pytestmark = pytest.mark.server

SET_1024 = ("--set", "instances.chat.context=1024")


def llamanix(
    *args: str, cwd: Path, crash_at: CrashPoint | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(CRASH_ENV, None)
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    return run_llamanix(*args, cwd=cwd, env=env, timeout=300)


def switch(cwd: Path, *extra: str, crash_at: CrashPoint | None = None) -> Any:
    return llamanix(
        "switch", "llamanix.toml", "--manager", "up", *extra, cwd=cwd, crash_at=crash_at
    )


def chat_status(units: Path) -> UpInstance | None:
    return instance_status(units, "chat")


def config_context(config: Path) -> int:
    for line in config.read_text().splitlines():
        if line.startswith("context ="):
            return int(line.split("=")[1])
    raise AssertionError(f"no context in {config}")


def served_context(url: str) -> int:
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert chat.status_code == 200 and chat.json()["choices"]
    props = httpx.get(f"{url}/props", timeout=10).json()
    return int(props["default_generation_settings"]["n_ctx"])


def servers_on(port: int) -> list[int]:
    """Live llama-server processes listening on ``port`` (from their command lines)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or not argv or not argv[0].endswith(b"llama-server"):
            continue
        if b"--port" in argv and argv[argv.index(b"--port") + 1] == str(port).encode():
            found.append(int(entry.name))
    return found


@dataclass
class Host:
    dir: Path
    port: int
    up: subprocess.Popen[str]

    @property
    def config(self) -> Path:
        return self.dir / "llamanix.toml"

    @property
    def units(self) -> Path:
        return self.dir / ".llamanix-state" / "dev" / "up"

    @property
    def generations_dir(self) -> Path:
        return self.dir / ".llamanix-state" / "dev" / "generations"

    def generations(self) -> list[dict[str, Any]]:
        listing = llamanix("generations", "llamanix.toml", "--json", cwd=self.dir)
        assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
        gens: list[dict[str, Any]] = json.loads(listing.stdout)
        return gens

    def verdicts(self) -> list[str]:
        return [g["gate"]["result"] for g in self.generations()]

    def wait_settled(self) -> UpInstance:
        """up has applied its manifest and the instance is running."""
        deadline = time.monotonic() + DEADLINE_S
        while (now := chat_status(self.units)) is None or now.state != "running":
            assert self.up.poll() is None, self.up.communicate()[0]
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        return now


@pytest.fixture
def host(tmp_path: Path, llama_server_bin: Path, synth_models: Any) -> Iterator[Host]:
    port = free_port()
    (tmp_path / "llamanix.toml").write_text(
        '[hosts.dev]\nkind = "systemd"\n'
        f'binaries = {{ upstream = "{llama_server_bin}", '
        f'ik = "{tmp_path}/missing/llama-server" }}\n'
        "\n[instances.chat]\n"
        f'model = "{synth_models.target}"\nport = {port}\ncontext = 512\nthreads = 1\n'
        'alias = "synthetic"\n'
    )
    up = start_up(tmp_path / "llamanix.toml", "dev")
    found = Host(tmp_path, port, up)
    try:
        found.wait_settled()
        yield found
    finally:
        stop_up(up)
    assert servers_on(port) == [], "llamanix up left a llama-server behind"


@dataclass(frozen=True)
class Case:
    """One crash: what runs first, the command killed, the command that must recover, and the
    gate verdicts the record ends with."""

    point: CrashPoint
    setup: tuple[str, ...] | None  # a switch that passes before the killed command
    killed: tuple[str, ...]  # "switch ..." or "rollback"
    recovery: tuple[str, ...]
    context_after_kill: int  # what the config file says right after the kill
    verdicts: tuple[str, ...]  # every generation's gate result after the recovery
    current_after: int  # the generation serving after the recovery


CASES = [
    # Killed before the config was written: the recorded generation is marked interrupted by
    # the next switch, which takes the next number.
    Case(
        "switch:staged",
        None,
        ("switch", *SET_1024),
        ("switch", *SET_1024),
        512,
        ("unverified", "interrupted", "passed"),
        3,
    ),
    # The config holds the change; a plain switch applies it.
    Case(
        "switch:config-written",
        None,
        ("switch", *SET_1024),
        ("switch",),
        1024,
        ("unverified", "interrupted", "passed"),
        3,
    ),
    # The change already runs, ungated: a plain switch gates it and records it.
    Case(
        "switch:activated",
        None,
        ("switch", *SET_1024),
        ("switch",),
        1024,
        ("unverified", "interrupted", "passed"),
        3,
    ),
    Case(
        "switch:gate-passed",
        None,
        ("switch", *SET_1024),
        ("switch",),
        1024,
        ("unverified", "interrupted", "passed"),
        3,
    ),
    # A variant that cannot start, killed after the config went back but before the previous
    # units were restored: the config equals the current generation, yet the broken unit is
    # installed. A plain switch must see that and put the working one back.
    Case(
        "switch:restoring",
        None,
        ("switch", "--set", "instances.chat.variant=ik", "--timeout", "60"),
        ("switch",),
        512,
        ("unverified", "failed", "passed"),
        3,
    ),
    # The staging directory of generation 3 was never renamed into place: nobody ever saw
    # generation 3, so the next switch removes the directory and uses the number.
    Case(
        "generation:before-rename",
        ("switch", "--set", "instances.chat.context=768"),
        ("switch", *SET_1024),
        ("switch", *SET_1024),
        768,
        ("unverified", "passed", "passed"),
        3,
    ),
    # rollback killed after writing generation 1's config, and after starting its units.
    Case(
        "rollback:config-written",
        ("switch", *SET_1024),
        ("rollback",),
        ("rollback",),
        512,
        ("unverified", "passed"),
        1,
    ),
    Case(
        "rollback:activated",
        ("switch", *SET_1024),
        ("rollback",),
        ("rollback",),
        512,
        ("unverified", "passed"),
        1,
    ),
]


def run(host: Host, argv: tuple[str, ...], crash_at: CrashPoint | None = None) -> Any:
    command, *extra = argv
    if command == "switch":
        return switch(host.dir, *extra, crash_at=crash_at)
    return llamanix("rollback", "llamanix.toml", *extra, cwd=host.dir, crash_at=crash_at)


def test_every_crash_point_is_tested() -> None:
    """Those inside a systemd host's restart: tests/test_crash_hosts.py, on the host bed."""
    assert sorted(c.point for c in CASES) == sorted(set(CRASH_POINTS) - set(RESTART_POINTS))


@pytest.mark.parametrize("case", CASES, ids=[c.point for c in CASES])
def test_a_command_killed_at_a_crash_point_leaves_a_usable_host(host: Host, case: Case) -> None:
    if case.setup is not None:
        done = run(host, case.setup)
        assert done.returncode == 0, done.stdout + done.stderr

    killed = run(host, case.killed, crash_at=case.point)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    # Right after the kill: the config parses and says what the step implies, and the
    # generations list (the record the killed command left, read without any lock).
    assert config_context(host.config) == case.context_after_kill
    valid = llamanix("validate", "llamanix.toml", cwd=host.dir)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    before = host.generations()
    if case.point == "generation:before-rename":
        assert [g["number"] for g in before] == [1, 2]
        assert (host.generations_dir / ".3.tmp").is_dir()

    # The next command, without --wait: a lock the dead one held would make it exit 2.
    recovered = run(host, case.recovery)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "Traceback" not in recovered.stderr

    # It serves what the config now says, and the record is settled.
    running = host.wait_settled()
    assert served_context(str(running.url)) == config_context(host.config)
    gens = host.generations()
    assert tuple(g["gate"]["result"] for g in gens) == case.verdicts
    assert [g["number"] for g in gens] == list(range(1, len(gens) + 1))
    assert [g["number"] for g in gens if g["current"]] == [case.current_after]
    if "interrupted" in case.verdicts:
        assert "marked interrupted" in recovered.stdout
    state = host.dir / ".llamanix-state" / "dev"
    assert [p for p in state.rglob("*") if p.name.endswith(".tmp")] == []
    for p in state.rglob("*.json"):
        json.loads(p.read_text())

    # No server of the killed command's making is left over: exactly the one `up` runs.
    assert servers_on(host.port) == [running.pid]

    # And the host keeps working: a switch after the recovery passes too.
    again = switch(host.dir, "--set", "instances.chat.context=1536")
    assert again.returncode == 0, again.stdout + again.stderr
    assert served_context(str(host.wait_settled().url)) == 1536
