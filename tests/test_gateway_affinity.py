"""The gateway's plugin under a real LiteLLM (the pinned release, from the cached wheels) in
front of two real llama-servers of the tiny model, started the way the Debian unit starts it:
``llamanix gateway-exec`` with the rendered ``litellm.yaml`` and the keys as credentials.

- Health checks cost nothing: after several check intervals, no slot of either server has run
  a task (LiteLLM's own checks would have sent each a completion every interval).
- Affinity: conversations spread over both replicas, and every turn after a conversation's
  first lands on its replica and reuses its cache there, read from the server's own timings
  (``cache_n`` tokens from the cache against ``prompt_n`` processed).
- A session header keeps a client's requests together whatever they say.
- A replica that stops: its conversations' next turns are answered by the other one.

The same under a rolling switch with the caches moved: tests/test_fleet_gateway.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import server_argv
from conftest import REPO

from llamanix.config.model import load_config
from llamanix.render import gateway
from llamanix.server.server_process import LlamaServer, free_port
from llamanix.testbed.gateway_wheels import local_litellm

pytestmark = [pytest.mark.server]

INTERVAL_S = 1
REPLICAS = ("r1", "r2")


@dataclass
class Bed:
    url: str
    key: str
    servers: dict[str, LlamaServer]
    proc: subprocess.Popen[bytes]
    log: Path


def config_text(model: Path, ports: dict[str, int], key_file: Path, port: int) -> str:
    text = '[hosts.gw]\nkind = "systemd"\nbinaries = { upstream = "/usr/bin/true" }\n\n'
    text += (
        f'[gateway]\nkind = "litellm"\nhost = "gw"\nport = {port}\n'
        f'api_key_file = "{key_file}"\nhealth_check_interval = {INTERVAL_S}\n\n'
    )
    for name, p in ports.items():
        text += (
            f'[instances.{name}]\nhost = "gw"\nmodel = "{model}"\nalias = "chat"\nport = {p}\n'
            "context = 4096\nparallel = 2\n\n"
        )
    return text


@pytest.fixture(scope="module")
def bed(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, synth_models: Any
) -> Iterator[Bed]:
    tmp = tmp_path_factory.mktemp("affinity")
    litellm = local_litellm()
    servers: dict[str, LlamaServer] = {}
    proc = None
    try:
        for name in REPLICAS:
            argv = server_argv(
                llama_server_bin,
                synth_models.target,
                ctx=4096,
                parallel=2,
                threads=1,
                port=free_port(),
            )
            servers[name] = LlamaServer(argv, tmp / f"{name}.log").start()
        key = os.urandom(12).hex()
        key_file = tmp / "gateway.key"
        key_file.write_text(key + "\n")
        port = free_port()
        (tmp / "llamanix.toml").write_text(
            config_text(
                synth_models.target, {n: s.port for n, s in servers.items()}, key_file, port
            )
        )
        cfg = load_config(tmp / "llamanix.toml")
        # The unit's credentials: its config and its master key.
        creds = tmp / "credentials"
        creds.mkdir()
        (creds / gateway.CONFIG_FILE).write_text(gateway.config_text(cfg))
        (creds / gateway.MASTER_KEY_CREDENTIAL).write_text(key + "\n")
        argv = gateway.start_argv(cfg, [sys.executable, "-m", "llamanix"])
        argv = [
            str(creds / gateway.CONFIG_FILE)
            if a == f"%d/{gateway.CONFIG_FILE}"
            else str(litellm)
            if a.endswith("/bin/litellm")
            else a
            for a in argv
        ]
        env = {
            **os.environ,
            "CREDENTIALS_DIRECTORY": str(creds),
            "PYTHONPATH": str(REPO / "tools"),
            "HOME": str(tmp),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        log = tmp / "litellm.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        ready = subprocess.run(
            [sys.executable, "-m", "llamanix", "gateway-ready", "--url",
             f"http://127.0.0.1:{port}/health/liveliness", "--pid", str(proc.pid)],
            env={**os.environ, "PYTHONPATH": str(REPO / "tools")},
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert ready.returncode == 0, log.read_text()[-3000:]
        yield Bed(f"http://127.0.0.1:{port}", key, servers, proc, log)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for server in servers.values():
            server.stop()


def chat(
    bed: Bed, messages: list[dict[str, str]], headers: dict[str, str] | None = None
) -> tuple[str, dict[str, Any], str]:
    """(the replica that answered, its timings, the answer)."""
    resp = httpx.post(
        f"{bed.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {bed.key}", **(headers or {})},
        json={"model": "chat", "messages": messages, "max_tokens": 12, "temperature": 0},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text[:500]
    data = resp.json()
    replica = resp.headers.get("x-litellm-model-id", "")
    return replica, data.get("timings") or {}, data["choices"][0]["message"]["content"]


def test_health_checks_send_no_completion(bed: Bed) -> None:
    """Several check intervals after the gateway came up, with no client yet: no slot of
    either server has run a task. LiteLLM's own background checks sent each replica a
    one-token completion every interval."""
    time.sleep(4 * INTERVAL_S)
    for name, server in bed.servers.items():
        slots = httpx.get(f"{server.url}/slots", timeout=30).json()
        assert all("id_task" not in s for s in slots), (name, slots)
    assert "Traceback" not in bed.log.read_text(), bed.log.read_text()[-3000:]


def test_each_turn_lands_on_its_replica_and_reuses_its_cache(bed: Bed) -> None:
    conversations = [
        [{"role": "user", "content": f"Conversation {n}: tell me about the number {n}."}]
        for n in range(4)
    ]
    homes: dict[int, set[str]] = {n: set() for n in range(4)}
    previous: dict[int, int] = {}
    for turn in range(4):
        for n, messages in enumerate(conversations):
            replica, timings, answer = chat(bed, messages)
            homes[n].add(replica)
            if turn:
                # The cache held the conversation up to this turn: only the new turn and the
                # last answer's tail were processed.
                assert timings["cache_n"] > timings["prompt_n"], (n, turn, timings)
                assert timings["cache_n"] >= previous[n] - 8, (n, turn, timings, previous[n])
            previous[n] = timings["cache_n"] + timings["prompt_n"]
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"And then, part {turn + 1}?"},
            ]
    assert all(len(h) == 1 for h in homes.values()), homes
    placed = sorted(next(iter(h)) for h in homes.values())
    assert placed == ["r1", "r1", "r2", "r2"], placed


def test_a_session_header_keeps_requests_together(bed: Bed) -> None:
    header = {"X-Session-Id": "s"}
    seen = {
        chat(bed, [{"role": "user", "content": f"Unrelated question {n}."}], header)[0]
        for n in range(4)
    }
    assert len(seen) == 1, seen


def test_a_replica_that_stops_hands_its_conversations_to_the_other(bed: Bed) -> None:
    messages = [{"role": "user", "content": "A conversation that outlives its replica."}]
    first, _, answer = chat(bed, messages)
    bed.servers[first].stop()
    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Still there?"},
    ]
    for _ in range(3):
        replica, _, answer = chat(bed, messages)
        assert replica != first
