"""An API key never leaves its key file: one full cycle (up, switch with a bench gate, dry runs,
bench, generations, plan, render, rollback) on the real CPU llama-server, then every file
llamanix wrote, every captured output and every running process's command line and environment
are searched for the key. The key is in effect (a request without it gets 401), so the search
is not vacuous.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import run_llamanix

from llamanix.server.server_process import free_port
from llamanix.testbed.up_process import start_up, stop_up, wait_running

pytestmark = pytest.mark.server


def descendants(root: int) -> list[int]:
    """root and every process below it, from /proc (children of children included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def test_api_key_never_leaks(tmp_path: Path, llama_server_bin: Path, synth_models: Any) -> None:
    cycle_dir = tmp_path
    key = f"sk-llamanix-{secrets.token_hex(16)}"
    secret_dir = cycle_dir / "secrets"
    secret_dir.mkdir(mode=0o700)
    key_file = secret_dir / "api-key"
    key_file.write_text(key + "\n")
    work = cycle_dir / "work"
    work.mkdir()
    port = free_port()
    (work / "llamanix.toml").write_text(
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{llama_server_bin}" }}\n'
        f'\n[instances.chat]\nmodel = "{synth_models.target}"\nport = {port}\n'
        f'context = 512\nthreads = 1\nalias = "synthetic"\napi_key_file = "{key_file}"\n'
    )
    outputs: dict[str, str] = {}

    def llamanix(*args: str) -> subprocess.CompletedProcess[str]:
        proc = run_llamanix(*args, cwd=work, timeout=300)
        outputs[" ".join(args)] = proc.stdout + proc.stderr
        return proc

    units = work / ".llamanix-state" / "dev" / "up"
    up_log = cycle_dir / "up.log"
    with up_log.open("w") as log:
        up = start_up(work / "llamanix.toml", "dev", log)
    try:
        wait_running(up, units, "chat", explain=up_log.read_text, deadline_s=120.0)
        url = f"http://127.0.0.1:{port}"

        # The key is in effect: without it the API refuses, with it the server answers.
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/v1/models", headers=auth, timeout=10).status_code == 200

        dry = llamanix(
            "switch",
            "llamanix.toml",
            "--manager",
            "up",
            "--set",
            "instances.chat.context=1024",
            "--dry-run",
        )
        assert dry.returncode == 0 and "# write" in dry.stdout, dry.stdout + dry.stderr
        # What a systemd host would be told to do (systemctl, the unit files): printed only.
        system_dry = llamanix(
            "switch",
            "llamanix.toml",
            "--manager",
            "systemd",
            "--units-dir",
            str(cycle_dir / "etc-systemd"),
            "--set",
            "instances.chat.context=1024",
            "--dry-run",
        )
        assert system_dry.returncode == 0 and "systemctl" in system_dry.stdout, (
            system_dry.stdout + system_dry.stderr
        )
        switched = llamanix(
            "switch",
            "llamanix.toml",
            "--manager",
            "up",
            "--set",
            "instances.chat.context=1024",
            "--gate",
            "bench",
            "--min-tok-s",
            "0.001",
        )
        assert switched.returncode == 0, switched.stdout + switched.stderr
        smoke = llamanix(
            "switch",
            "llamanix.toml",
            "--manager",
            "up",
            "--set",
            "instances.chat.context=2048",
            "--gate",
            "smoke",
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401

        bench_json = cycle_dir / "bench.json"
        bench = llamanix(
            "bench",
            "--url",
            url,
            "--api-key-file",
            str(key_file),
            "--max-tokens",
            "4",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--json",
            "-o",
            str(bench_json),
        )
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert json.loads(bench_json.read_text())
        for args in (
            ("generations", "llamanix.toml", "--json"),
            ("plan", "llamanix.toml", "--json"),
            ("render", "llamanix.toml", "--out", str(cycle_dir / "rendered")),
            ("doctor", "llamanix.toml", "--url", url),
        ):
            llamanix(*args)
        assert outputs["generations llamanix.toml --json"].strip()

        # Every process of the cycle that is still running: `up`, its servers, their children.
        pids = descendants(up.pid)
        assert len(pids) >= 2, "llamanix up and its llama-server"
        for pid in pids:
            for name in ("cmdline", "environ"):
                try:
                    data = (Path("/proc") / str(pid) / name).read_bytes()
                except (FileNotFoundError, ProcessLookupError):
                    continue
                assert key.encode() not in data, f"/proc/{pid}/{name}"

        back = llamanix("rollback", "llamanix.toml")
        assert back.returncode == 0, back.stdout + back.stderr
    finally:
        stop_up(up)

    # Every file llamanix wrote (state, renders, argv files, logs, bench JSON, generations).
    written = [p for p in cycle_dir.rglob("*") if p.is_file() and p != key_file]
    assert any(p.name == "manifest.json" for p in written)
    assert any("generation" in str(p) for p in written), sorted(map(str, written))
    leaks = [str(p) for p in written if key.encode() in p.read_bytes()]
    assert leaks == []
    for command, text in outputs.items():
        assert key not in text, command
