"""Files keep their owner's intent: a switch or rollback that rewrites the config writes through
a symlink to its target and keeps the file's mode and owner (a 0600 ``real.toml`` behind
``cfg.toml`` used to become a world-readable ``cfg.toml``); a generation's copy of the config is
readable by no more users than the file; where the owner cannot be kept, the switch refuses
before it changes anything. A key file every user can read is a warning of validate and
doctor.

nixos-rebuild is a recording stand-in (tests/standins.py); the gate talks to a small HTTP server
that answers as a serving llama-server does, or to nothing, where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cli_run import invoke
from click.testing import CliRunner
from standins import recorded, stand_in

from llamanix.cli import main
from llamanix.state.generations import HostState

OWNER = (4242, 4343)  # not this process's: only root can keep them


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "standins"
    record = tmp_path / "record.jsonl"
    stand_in(bin_dir, "nixos-rebuild", record=record)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


class _Serving(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer(200, b'{"status": "ok"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(200, b'{"choices": [{"message": {"role": "assistant", "content": "Hi."}}]}')

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def serving() -> Iterator[ThreadingHTTPServer]:
    """What the health gate talks to: /health and a chat completion answer."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Serving)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


cli = partial(invoke, catch_exceptions=False)


def _config(tmp_path: Path, port: int) -> tuple[Path, Path]:
    """``cfg.toml``, a symlink to ``real/real.toml``, mode 0600, owned by OWNER."""
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    for d in (tmp_path, real_dir):
        (d / "flake.nix").write_text("{ outputs = _: { }; }\n")
    real = real_dir / "real.toml"
    real.write_text(
        "# my GPU box\n"
        '[hosts.gpu1]\nkind = "nixos"\nbinaries = { upstream = "/opt/llama/bin/llama-server" }\n\n'
        f'[instances.qwen]\nmodel = "/srv/models/q.gguf"\nport = {port}\ncontext = 4096\n'
    )
    real.chmod(0o600)
    os.chown(real, *OWNER)
    link = tmp_path / "cfg.toml"
    link.symlink_to(Path("real") / "real.toml")
    return link, real


def _kept(link: Path, real: Path) -> None:
    assert link.is_symlink() and link.resolve() == real.resolve()
    st = real.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, *OWNER), oct(st.st_mode)
    assert [p.name for p in real.parent.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="keeping another user's ownership needs root")
def test_switch_and_rollback_write_through_the_link_and_keep_mode_and_owner(
    tmp_path: Path, recorder: Path, serving: ThreadingHTTPServer
) -> None:
    link, real = _config(tmp_path, serving.server_address[1])
    for context in ("8192", "2048"):
        done = cli("switch", str(link), "--set", f"instances.qwen.context={context}")
        assert done.exit_code == 0, done.output
        assert f"context = {context}\n" in real.read_text()
        _kept(link, real)
    # Each generation's copy of the config is as closed as the file.
    state = HostState.beside(link, "gpu1")
    snapshots = [g.config_snapshot() for g in state.generations()]
    assert len(snapshots) == 2
    for snapshot in snapshots:
        assert snapshot is not None and stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    done = cli("rollback", str(link))
    assert done.exit_code == 0, done.output
    assert "context = 8192\n" in real.read_text()
    _kept(link, real)
    # A failed gate puts the old text back the same way.
    before = real.read_text()
    serving.shutdown()
    serving.server_close()
    done = cli("switch", str(link), "--set", "instances.qwen.context=1024", "--timeout", "1")
    assert done.exit_code == 1, done.output
    assert real.read_text() == before
    _kept(link, real)
    switch, back = ["nixos-rebuild", "switch", "--flake", ".#gpu1"], ["nixos-rebuild", "switch"]
    assert [r["argv"] for r in recorded(recorder)] == [
        switch,
        switch,
        [*back, "--rollback"],
        switch,
        [*back, "--rollback"],
    ]


def test_a_switch_that_cannot_keep_the_owner_changes_nothing(
    tmp_path: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as another user than the file's, the switch would hand the file to itself: it says
    so in one line, before a generation or the file is written."""
    link, real = _config(tmp_path, 8080)
    before = real.read_text()
    uid = os.geteuid() + 1 if os.geteuid() + 1 != OWNER[0] else OWNER[0] + 1
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    done = CliRunner().invoke(main, ["switch", str(link), "--set", "instances.qwen.context=8192"])
    assert done.exit_code == 2, done.output
    assert done.output.strip().splitlines() == [
        f"{link}: {link} (a link to {real.resolve()}) belongs to uid {OWNER[0]}: written as uid "
        f"{uid}, it would change owners (run llamanix as the file's owner, or as root)"
    ]
    assert real.read_text() == before
    assert not (real.parent / ".llamanix-state").exists()
    assert recorded(recorder) == []


# --- a key file any user can read --------------------------------------------------------------


@pytest.fixture
def keys() -> Iterator[Path]:
    """A directory for key files outside /tmp, which validate refuses for them."""
    if not os.access("/run", os.W_OK):
        pytest.skip("needs a directory outside /tmp: /run is not writable here")
    found = Path(tempfile.mkdtemp(prefix="llamanix-test-keys-", dir="/run"))
    yield found
    shutil.rmtree(found)


def test_validate_and_doctor_warn_of_a_key_file_any_user_can_read(
    tmp_path: Path, keys: Path
) -> None:
    keys.chmod(0o755)
    key = keys / "api-key"
    key.write_text("sk-test\n")
    key.chmod(0o644)
    config = tmp_path / "llamanix.toml"
    config.write_text(
        '[hosts.box]\nkind = "systemd"\nbinaries = { upstream = "/opt/llama/bin/llama-server" }'
        f'\n\n[instances.chat]\nmodel = "/srv/models/q.gguf"\nport = 8080\n'
        f'api_key_file = "{key}"\n'
    )
    warning = (
        f"warning: {config}: instances.chat.api_key_file: {key} is readable by every user of "
        f"this machine (it is mode 0644): any local process can use the key (chmod 600 {key})"
    )

    def validate(*extra: str) -> list[str]:
        done = invoke("validate", str(config), "--remote", *extra)
        assert done.exit_code == 0, done.output
        return [line for line in done.output.splitlines() if line.startswith("warning:")]

    def doctor() -> dict[str, Any]:
        done = invoke("doctor", str(config), "chat", "--json")
        data: dict[str, Any] = json.loads(done.output[done.output.index("{") :])
        return data

    # --remote: the units run elsewhere, and this machine's files say nothing of them.
    assert validate() == []
    done = CliRunner().invoke(main, ["validate", str(config)])
    assert warning in done.output.splitlines(), done.output
    report = doctor()
    [found] = [f for f in report["findings"] if f["code"] == "key-readable"]
    assert found["severity"] == "warning" and found["instance"] == "chat"
    assert found["fix"] == f"chmod 600 {key}" and report["checks"]["key-file"] == "finding"
    # Closed to other users, by its mode or by a directory above it: no warning.
    for closed in ((keys, 0o755, key, 0o600), (keys, 0o700, key, 0o644)):
        closed[0].chmod(closed[1])
        closed[2].chmod(closed[3])
        done = CliRunner().invoke(main, ["validate", str(config)])
        assert "readable by every user" not in done.output, done.output
        assert doctor()["checks"]["key-file"] == "ok"
