"""A soak of ``llamanix up``: the real llama-server under chat load, SIGKILLed twice, comes back
each time per its unit's Restart=on-failure/RestartSec=; a server that can never start is
given up on after StartLimitBurst= starts with one line. Bounded (200 requests, 4 clients,
loopback), and nothing is left running afterwards.

The figures (requests ok / failed, restarts, restart latency) are printed, not asserted: they
depend on the machine. What is asserted is the behaviour: the restart count, that every
failed request was in flight at a kill, and that everything after each restart succeeds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SESSION_TAG_ENV

from llamanix.server.client import LlamaClient
from llamanix.server.server_process import free_port, processes_with_env
from llamanix.state.up_status import STATUS, UpInstance
from llamanix.testbed.up_process import instance_status, start_up, stop_up

pytestmark = pytest.mark.server

REQUESTS = 200
CLIENTS = 4
KILL_AFTER = (60, 130)  # kill the server once this many requests have completed
# Generous bound for RestartSec=10s plus a model load on a loaded machine; not a measurement.
RESTART_BOUND_S = 60.0
# The rendered unit's policy (render/templates/llamanix.service.j2), which the tests rely on.
RESTART_SEC = 10.0
START_LIMIT_BURST = 5


@dataclass(frozen=True)
class Request:
    started: float
    ended: float
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class Kill:
    at: float
    pid: int
    serving_again: float
    new_pid: int


@dataclass
class Host:
    dir: Path
    port: int
    up: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    @property
    def units(self) -> Path:
        return self.dir / ".llamanix-state" / "dev" / "up"

    def chat(self) -> UpInstance:
        """up's entry for the instance, which it has while the test runs."""
        now = instance_status(self.units, "chat")
        assert now is not None, "\n".join(self.output)
        return now

    def wait_for(
        self, what: str, deadline_s: float, check: Callable[[UpInstance], bool]
    ) -> UpInstance:
        deadline = time.monotonic() + deadline_s
        while (now := instance_status(self.units, "chat")) is None or not check(now):
            assert self.up.poll() is None, "\n".join(self.output)
            assert time.monotonic() < deadline, f"{what} within {deadline_s:g}s: {now}"
            time.sleep(0.05)
        return now

    def servers(self) -> list[int]:
        """This session's live llama-server processes listening on this host's port."""
        mine = []
        for pid in processes_with_env(SESSION_TAG_ENV, os.environ[SESSION_TAG_ENV]):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"llama-server") and str(self.port).encode() in argv:
                mine.append(pid)
        return mine


def start_host(tmp_path: Path, model: Path, server: Path) -> Host:
    port = free_port()
    (tmp_path / "llamanix.toml").write_text(
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{server}" }}\n'
        "\n[instances.chat]\n"
        f'model = "{model}"\nport = {port}\ncontext = 512\nthreads = 1\nalias = "synthetic"\n'
    )
    up = start_up(tmp_path / "llamanix.toml", "dev")
    host = Host(tmp_path, port, up)
    assert up.stdout is not None
    stream = up.stdout
    threading.Thread(target=lambda: host.output.extend(stream), daemon=True).start()
    return host


def stop_host(host: Host) -> None:
    stop_up(host.up)
    assert host.servers() == [], "a llama-server outlived llamanix up"
    assert not (host.units / STATUS).exists()


@pytest.fixture
def host(tmp_path: Path, llama_server_bin: Path, synth_models: Any) -> Iterator[Host]:
    found = start_host(tmp_path, synth_models.target, llama_server_bin)
    try:
        found.wait_for("the first start", 120, lambda s: s.state == "running")
        yield found
    finally:
        stop_host(found)


def test_up_restarts_the_server_killed_under_load(host: Host) -> None:
    url = host.chat().url
    assert url is not None
    unit = (host.units / "llamanix-chat.service").read_text()
    assert "Restart=on-failure" in unit and f"RestartSec={RESTART_SEC:g}s" in unit

    done: list[Request] = []
    kills: list[Kill] = []
    issued = 0
    lock = threading.Lock()
    serving = threading.Event()  # cleared from a kill until `up` reports the server running
    serving.set()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def client() -> None:
        nonlocal issued
        http = LlamaClient(url, timeout_s=60, max_connections=1)
        try:
            while True:
                serving.wait(RESTART_BOUND_S)
                with lock:
                    if issued >= REQUESTS:
                        return
                    issued += 1
                started = time.monotonic()
                try:
                    reply = http.chat(body)
                    ok, error = reply.status_code == 200, f"HTTP {reply.status_code}"
                except httpx.HTTPError as err:
                    ok, error = False, type(err).__name__
                with lock:
                    done.append(Request(started, time.monotonic(), ok, "" if ok else error))
                if not ok:  # a new connection after a failure, as any client would
                    http.close()
                    http = LlamaClient(url, timeout_s=60, max_connections=1)
        finally:
            http.close()

    def killer() -> None:
        for threshold in KILL_AFTER:
            while len(done) < threshold:
                time.sleep(0.01)
            before = host.chat()
            assert before.pid is not None

            def restarted(s: UpInstance, n: int = before.starts) -> bool:
                return s.state == "running" and s.starts == n + 1

            serving.clear()
            at = time.monotonic()
            os.kill(before.pid, signal.SIGKILL)  # the server, not `up`
            after = host.wait_for("the restart", RESTART_BOUND_S, restarted)
            assert after.pid is not None
            kills.append(Kill(at, before.pid, time.monotonic(), after.pid))
            serving.set()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    chaos = threading.Thread(target=killer)
    for t in [*threads, chaos]:
        t.start()
    for t in [*threads, chaos]:
        t.join(timeout=600)
        assert not t.is_alive()

    failed = [r for r in done if not r.ok]
    latency = [k.serving_again - k.at for k in kills]
    print(
        f"\nup soak: {len(done) - len(failed)} ok, {len(failed)} failed "
        f"({', '.join(sorted({r.error for r in failed})) or 'none'}), {len(kills)} restarts, "
        f"restart latency {', '.join(f'{s:.1f}s' for s in latency)} "
        f"(RestartSec={RESTART_SEC:g}s + load)"
    )

    assert len(done) == REQUESTS
    assert len(kills) == 2
    assert host.chat().starts == 1 + len(kills)  # exactly the two restarts, no others
    assert all(k.new_pid != k.pid for k in kills)
    assert sum(f"[chat] restarting in {RESTART_SEC:g}s" in line for line in host.output) == 2
    # A request failed only if it was in flight when the server was killed: every other one,
    # those after each restart included, succeeded ...
    for r in failed:
        assert any(r.started <= k.at <= r.ended for k in kills), r
    # ... and after each restart the new server answered.
    for k in kills:
        assert any(r.ok and r.started >= k.serving_again for r in done), k
    assert len(failed) <= CLIENTS * len(kills)
    # The killed servers are gone; exactly the one `up` reports serves.
    assert host.servers() == [host.chat().pid]


def test_up_gives_up_after_start_limit_burst(
    tmp_path: Path, llama_server_bin: Path, synth_models: Any
) -> None:
    # A model file cut short: the header reads, the load fails, every start.
    good = synth_models.target.read_bytes()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(good[: len(good) // 2])
    host = start_host(tmp_path, broken, llama_server_bin)
    try:
        unit = host.dir / ".llamanix-state" / "dev" / "up" / "llamanix-chat.service"
        final = host.wait_for(
            "giving up",
            RESTART_SEC * START_LIMIT_BURST + 120,
            lambda s: s.state == "failed",
        )
        assert f"StartLimitBurst={START_LIMIT_BURST}" in unit.read_text()
        assert final.starts == START_LIMIT_BURST
        limit = [line.rstrip("\n") for line in host.output if "start limit hit" in line]
        assert limit == [
            f"[chat] start limit hit ({START_LIMIT_BURST} starts within 600s, "
            f"StartLimitBurst={START_LIMIT_BURST}); not restarting. Last error: "
            f"{final.last_error}"
        ]
        assert final.last_error
        # `up` itself stays up: other instances of the host would keep running.
        assert host.up.poll() is None
        assert host.servers() == []
    finally:
        stop_host(host)
