"""Keys stay keys: a key file is read as llama-server reads it (one key per line, empty lines and
``#`` lines skipped), and every reader (readiness, bench, top, the fleet agent's top, the
exporter, doctor) uses its first key. No output, error line or written record carries a key's
bytes, whatever the file holds: the whole file sent as one Bearer token used to put every key
into an ``Invalid header value`` error.

The real CPU llama-server is started with the same file, so the server and llamanix are shown
to agree on which lines are keys.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_run import run_llamanix, server_argv

from llamanix.core.api_key import read_api_key
from llamanix.core.errors import UserError
from llamanix.fleet.agent import DIR_ENV
from llamanix.fleet.protocol import PROTOCOL, AgentRequest

# --- the file, read as llama-server reads it -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (b"sk-one\n", "sk-one"),
        (b"sk-one", "sk-one"),
        (b"# the clients' keys\n\nsk-one\nsk-two\n# old: sk-zero\n", "sk-one"),
        (b"\n\n#sk-not\nsk-one\n", "sk-one"),
        (b"sk.A-b_c~d+e/f==\n", "sk.A-b_c~d+e/f=="),
        (b"", None),
        (b"# nothing but comments\n\n", None),
    ],
    ids=["one", "no-newline", "several", "comment-first", "token68", "empty", "comments"],
)
def test_the_first_key_is_the_first_line_llama_server_keeps(
    tmp_path: Path, text: bytes, key: str | None
) -> None:
    path = tmp_path / "api-key"
    path.write_bytes(text)
    assert read_api_key(path, "api_key_file") == key


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (b"# c\r\nsk-secret-one\r\nsk-secret-two\r\n", 2, "carriage return"),
        (b" sk-secret-one\n", 1, "spaces or tabs"),
        (b"sk-secret-one\t\n", 1, "spaces or tabs"),
        (b"\n#\nsk-secret-\x01one\n", 3, "control character or non-ASCII"),
        ("sk-secret-\u00e9\n".encode(), 1, "control character or non-ASCII"),
        (b"sk-secret-\xff\n", 1, "control character or non-ASCII"),
    ],
    ids=["crlf", "leading-space", "trailing-tab", "control", "non-ascii", "not-utf8"],
)
def test_a_first_key_no_client_can_send_is_one_line_without_it(
    tmp_path: Path, text: bytes, line: int, says: str
) -> None:
    """llama-server would hold the line whole (its carriage return, its spaces), which no HTTP
    client sends: refused, naming the line by its number and never by its text."""
    path = tmp_path / "api-key"
    path.write_bytes(text)
    with pytest.raises(UserError) as err:
        read_api_key(path, "api_key_file")
    [problem] = err.value.problems
    message = str(problem)
    assert message.startswith(f"{path}: api_key_file: line {line} "), message
    assert says in message
    assert "secret" not in message and "\\x" not in message


# --- every reader, against the real server ------------------------------------------------------


def _key() -> str:
    return f"sk-llamanix-{secrets.token_hex(12)}"


@pytest.mark.server
def test_every_reader_uses_the_first_key_and_prints_none(
    tmp_path: Path, server_factory: Any, synth_models: Any, llama_server_bin: Path
) -> None:
    first, second, commented = _key(), _key(), _key()
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    key_file = keys / "api-key"
    key_file.write_text(f"# the clients' keys\n\n{first}\n{second}\n# retired: {commented}\n")
    key_file.chmod(0o600)
    server = server_factory(
        server_argv(
            llama_server_bin,
            synth_models.target,
            "--metrics",
            "--api-key-file",
            str(key_file),
            ctx=1024,
            threads=1,
        )
    )
    # The server took both keys and neither comment: llamanix's reading agrees with it.
    for key, status in ((first, 200), (second, 200), (commented, 401), (None, 401)):
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.get(f"{server.url}/v1/models", headers=auth, timeout=10).status_code == status

    config = tmp_path / "llamanix.toml"
    config.write_text(
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{llama_server_bin}" }}\n'
        f'\n[instances.chat]\nmodel = "{synth_models.target}"\nport = {server.port}\n'
        f'context = 1024\nthreads = 1\napi_key_file = "{key_file}"\n'
    )
    fleet = tmp_path / "fleet"
    fleet.mkdir(mode=0o700)
    (fleet / "llamanix.toml").write_text(config.read_text())
    outputs: dict[str, str] = {}

    def llamanix(
        *args: str, env: dict[str, str] | None = None, stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        proc = run_llamanix(
            *args, input=stdin, cwd=tmp_path, timeout=300, env={**os.environ, **(env or {})}
        )
        outputs[" ".join(args)] = proc.stdout + proc.stderr
        return proc

    def ran(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> str:
        proc = llamanix(*args, env=env, stdin=stdin)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    # readiness: what every keyed unit's ExecStartPost runs.
    assert ran("readiness", "--url", server.url, "--api-key-file", str(key_file))
    bench_json = tmp_path / "bench.json"
    ran(
        "bench",
        "--url",
        server.url,
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
    assert json.loads(bench_json.read_text())
    [host] = json.loads(ran("top", str(config), "--once", "--json"))["hosts"]
    assert [(row["instance"], row["state"]) for row in host["rows"]] == [("chat", "ok")], host
    # The fleet agent reads its request on stdin, as a controller sends it over ssh.
    agent = ran(
        "fleet-agent",
        "top",
        env={DIR_ENV: str(fleet)},
        stdin=AgentRequest(protocol=PROTOCOL, host="dev").text(),
    )
    assert '"state": "ok"' in agent, agent
    scrape = ran("metrics", str(config), "--once")
    assert 'instance="chat",model="' in scrape and 'reason="ok"' in scrape, scrape[:2000]
    assert "llamacpp:tokens_predicted_total{" in scrape
    doctor = llamanix("doctor", str(config), "chat", "--url", server.url, "--json")
    assert doctor.returncode in (0, 1) and json.loads(doctor.stdout)["checks"]["spec-probe"]

    # A key the server does not hold, first in its file: each reader says so in its own way.
    wrong = keys / "wrong"
    wrong.write_text(f"# first comes the wrong one\n{commented}\n{first}\n")
    wrong.chmod(0o600)
    # A file written on Windows: llama-server would keep each carriage return in its key.
    crlf = keys / "crlf"
    crlf.write_bytes(f"{first}\r\n{second}\r\n".encode())
    crlf.chmod(0o600)
    for bad in (wrong, crlf):
        bad_config = tmp_path / f"{bad.name}.toml"
        bad_config.write_text(config.read_text().replace(str(key_file), str(bad)))
        done = llamanix(
            "readiness", "--url", server.url, "--api-key-file", str(bad), "--timeout", "20"
        )
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        done = llamanix(
            "bench", "--url", server.url, "--api-key-file", str(bad), "--max-tokens", "4",
            "--runs", "1", "--warmup", "0",
        )  # fmt: skip
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        [host] = json.loads(ran("top", str(bad_config), "--once", "--json"))["hosts"]
        [row] = host["rows"]
        assert row["state"] == "refused", row
        scrape = ran("metrics", str(bad_config), "--once")
        assert 'reason="refused"' in scrape, scrape[:2000]
    crlf_line = f"{crlf}: --api-key-file: line 1 ends in a carriage return"
    assert crlf_line in outputs[f"readiness --url {server.url} --api-key-file {crlf} --timeout 20"]

    # Every output, and every file written, is searched for every key of the file.
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != keys]
    written = [p for p in written if not p.name.startswith("server-")]  # llama-server's logs
    assert bench_json in written
    for key in (first, second, commented):
        assert [str(p) for p in written if key.encode() in p.read_bytes()] == []
        assert [command for command, text in outputs.items() if key in text] == []
