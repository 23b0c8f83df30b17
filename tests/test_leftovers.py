"""What a switch that did not finish leaves, without a server: a tool that fails to say what is
there is an error (never "nothing there"); doctor names the leftovers of a host's state and
``llamanix tidy`` removes them; and one lock per machine's units, whatever config a command
came from (the host bed runs the same with systemd: tests/test_crash_hosts.py).

Real processes: the CLI as a subprocess, a lock held by another process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from cli_run import run_llamanix
from standins import stand_in

from llamanix.config.model import load_config
from llamanix.core.errors import ExternalCommandError
from llamanix.external import nft, systemctl
from llamanix.external.process import Runner
from llamanix.hosts.managers import install_files, is_render_file
from llamanix.hosts.warm import slot_file
from llamanix.render.host_render import render_host
from llamanix.state.generations import GateRecord, GenerationRecord, HostState, ManagerRecord
from llamanix.state.host_lock import units_lock_path

llamanix = partial(run_llamanix, timeout=120)


# --- a tool that fails says nothing of what is there ------------------------------------------


@pytest.fixture
def failing_nft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An nft that fails, as one without the rights or with a broken kernel table does."""
    record = stand_in(tmp_path / "bin", "nft")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_EXIT_nft", "1")
    return record


@pytest.mark.parametrize(
    "look",
    [nft.fenced_ports, nft.redirected_ports, lambda: nft.unfence(8080), lambda: nft.untrack(8080)],
)
def test_a_failing_nft_is_an_error_never_no_fence(failing_nft: Path, look: object) -> None:
    assert callable(look)
    with pytest.raises(ExternalCommandError, match=r"nft list tables inet .* failed: exit code 1"):
        look()


def test_a_failing_systemctl_is_an_error_never_no_bridge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemctl asked which bridges systemd has: a failure is an error, never "none"."""
    stand_in(tmp_path / "bin", "systemctl")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_EXIT_systemctl", "1")
    with pytest.raises(ExternalCommandError, match=r"systemctl .*list-units .* failed"):
        systemctl.list_units(False, "llamanix-*-bridge.service")


# --- doctor names a host's leftovers, tidy removes them --------------------------------------

CONFIG = """[hosts.dev]
kind = "systemd"
binaries = {{ upstream = "{binary}" }}

[instances.chat]
model = "{model}"
port = 18555
context = 512
"""


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """A config whose host `llamanix up` runs generation 1 (its files installed), as a switch
    records it; nothing runs (nothing needs to: what tidy touches here are files)."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    path = tmp_path / "llamanix.toml"
    path.write_text(CONFIG.format(binary=sys.executable, model=model))
    config = load_config(path)
    files = render_host(config, "dev").files()
    state = HostState.beside(path, "dev")
    up = state.root / "up"
    gen = state.create(
        files, path.read_text(), ".toml", GenerationRecord(gate=GateRecord("passed", "health"))
    )
    state.set_current(gen)
    state.set_manager(ManagerRecord("up", units_dir=str(up)))
    install_files(Runner(), up, files, {}, is_render_file)
    return path


def leftovers_of(path: Path) -> tuple[list[str], dict[str, object]]:
    done = llamanix("doctor", str(path), "--json", cwd=path.parent)
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    codes = sorted(f["code"] for f in report["findings"] if "leftover" in f["code"])
    return codes, report


def test_doctor_names_what_a_killed_switch_left_in_the_state_and_tidy_removes_it(
    recorded: Path,
) -> None:
    state = HostState.beside(recorded, "dev")
    # A switch killed after it recorded generation 2 (its gate pending), and one killed while
    # it assembled generation 3, while it wrote `current` and the config, after a warm save.
    killed = state.create(
        {}, recorded.read_text(), ".toml", GenerationRecord(gate=GateRecord("pending", "health"))
    )
    (state.generations_dir / ".3.tmp" / "files").mkdir(parents=True)
    (state.root / ".current.x1y2.tmp").write_text("2\n")
    config_tmp = recorded.parent / ".llamanix.toml.a1b2.tmp"
    config_tmp.write_text("half")
    slots = state.root / "up" / "state" / "llamanix-chat"
    slots.mkdir(parents=True)
    (slots / slot_file(0)).write_bytes(b"\0" * 64)

    codes, report = leftovers_of(recorded)
    assert codes == [
        "leftover-pending",
        "leftover-slot-files",
        "leftover-staging",
        "leftover-temporary-file",
        "leftover-temporary-file",
    ], report["findings"]
    assert report["checks"]["leftovers"] == "finding"  # type: ignore[index]
    messages = " | ".join(str(f["message"]) for f in report["findings"])  # type: ignore[union-attr]
    for named in (".3.tmp", ".current.x1y2.tmp", str(config_tmp), slot_file(0), "generation 2"):
        assert named in messages, (named, messages)

    done = llamanix("tidy", str(recorded), cwd=recorded.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "dev: generation 1 is current, serving" in lines, lines
    assert any("marked interrupted" in line for line in lines), lines
    assert killed.outcome == "interrupted"
    assert not config_tmp.exists() and not list(slots.iterdir())
    assert not (state.generations_dir / ".3.tmp").exists()
    codes, report = leftovers_of(recorded)
    assert codes == [] and report["checks"]["leftovers"] == "ok", report["findings"]  # type: ignore[index]


# --- one lock per machine's units ------------------------------------------------------------

_HOLD = """
import sys
from pathlib import Path
from llamanix.state.host_lock import units_lock
with units_lock(Path(sys.argv[1]), sys.argv[2], command="switch"):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def units(tmp_path: Path) -> Path:
    found = tmp_path / "units"
    found.mkdir()
    return found


@pytest.fixture
def holder(tmp_path: Path, units: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holds the units' lock, for a config elsewhere."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(units), "/srv/other/llamanix.toml"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.mark.parametrize(
    "command",
    [
        ("switch", "--manager", "up", "--set", "instances.chat.context=1024"),
        ("rollback", "--manager", "up", "--to", "1"),
        ("up",),
    ],
    ids=["switch", "rollback", "up"],
)
def test_units_another_config_is_changing_are_refused_in_one_line(
    recorded: Path, units: Path, holder: subprocess.Popen[str], command: tuple[str, ...]
) -> None:
    name, *extra = command
    done = llamanix(name, str(recorded), *extra, "--units-dir", str(units), cwd=recorded.parent)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"{recorded}: this machine's units in {units.resolve()} are being switched by pid "
        f"{holder.pid} for /srv/other/llamanix.toml (since "
    ), lines
    assert lines[0].endswith("(try again, or pass --wait SECONDS)"), lines
    # Nothing was written: no generation, and the units are as they were.
    assert [g.number for g in HostState.beside(recorded, "dev").generations()] == [1]
    assert list(units.iterdir()) == []


def test_a_tidy_of_units_another_config_is_changing_is_refused_in_one_line(
    recorded: Path,
) -> None:
    """tidy writes the units its host's generation records (here `llamanix up`'s directory):
    while another config's command holds them, it refuses too, and changes nothing."""
    up = HostState.beside(recorded, "dev").root / "up"
    before = {p.name: p.read_bytes() for p in up.iterdir() if p.is_file()}
    other = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(up), "/srv/other/llamanix.toml"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        done = llamanix("tidy", str(recorded), cwd=recorded.parent)
    finally:
        other.kill()
        other.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"{recorded}: this machine's units in {up.resolve()} are being switched by pid "
        f"{other.pid} for /srv/other/llamanix.toml (since "
    ), lines
    assert {p.name: p.read_bytes() for p in up.iterdir() if p.is_file()} == before


def test_a_wait_takes_its_turn_once_the_other_is_done(
    recorded: Path, units: Path, holder: subprocess.Popen[str]
) -> None:
    assert holder.stdin is not None
    argv = ["switch", str(recorded), "--manager", "up", "--units-dir", str(units), "--wait", "30"]
    waiting = subprocess.Popen(
        [sys.executable, "-m", "llamanix", *argv],
        cwd=recorded.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    assert waiting.poll() is None  # still waiting for its turn
    holder.stdin.close()  # the other one is done
    out, err = waiting.communicate(timeout=60)
    # Past the lock: it got as far as asking for the `llamanix up` of those units.
    assert "being switched" not in err, err
    assert "llamanix up" in err and waiting.returncode == 2, out + err


def test_the_lock_goes_with_its_holder_even_a_killed_one(units: Path) -> None:
    path = units_lock_path(units)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(units), "/srv/a.toml"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    assert json.loads(path.read_text())["pid"] == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # A SIGKILLed holder leaves its record, never its lock: the next one takes it at once.
    again = subprocess.run(
        [sys.executable, "-c", _HOLD, str(units), "/srv/b.toml"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.stdout == "held\n", again.stderr
    # And a holder that lets go removes the file: nothing is left in the run directory.
    assert not path.exists()
