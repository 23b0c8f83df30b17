"""switch and rollback read the config file once and parse it once, under the host's lock.

The commands run for real, in process, against a NixOS host whose nixos-rebuild is a recording
stand-in (as in tests/test_deploy_commands.py): nothing listens on the instance's port, so the
gate really fails and the switch really restores. Every open of the config file for reading
and every call of ``parse_config`` is counted while they run.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cli_run import invoke
from click.testing import CliRunner
from standins import recorded, stand_in

from llamanix.cli import main
from llamanix.config import model as core_config
from llamanix.config.host_choice import HostChoiceError, pick_host
from llamanix.config.model import Config
from llamanix.external.files import atomic_write
from llamanix.server.server_process import free_port
from llamanix.state import config_edit
from llamanix.state.host_lock import host_lock

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "standins"
    record = tmp_path / "record.jsonl"
    for name in ("nixos-rebuild", "nix"):
        stand_in(bin_dir, name, record=record)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def write_config(d: Path, context: int = 4096, hosts: tuple[str, ...] = ("gpu1",)) -> Path:
    (d / "flake.nix").write_text("{ outputs = _: { }; }\n")
    path = d / "llamanix.toml"
    tables = "".join(f'[hosts.{h}]\nkind = "nixos"\n\n' for h in hosts)
    path.write_text(
        f"# my GPU box\n{tables}"
        f'[instances.qwen]\nhost = "{hosts[0]}"\nmodel = "/srv/models/q.gguf"\n'
        f"port = {free_port()}\ncontext = {context}\n"
    )
    return path


class Counts:
    """Reads of one file, and each parse_config call by the config's qwen context."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()
        self.reads = 0
        self.parses: Counter[object] = Counter()

    def opener(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def counting(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if (
                isinstance(file, str | os.PathLike)
                and not set(mode) & set("wax+")
                and Path(os.fspath(file)).resolve() == self.path
            ):
                self.reads += 1
            return real(file, mode, *args, **kwargs)

        return counting

    def os_opener(self, real: Callable[..., int]) -> Callable[..., int]:
        """``os.open``, which the one file reader uses: a read is an open without a write."""

        def counting(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
            if (
                isinstance(file, str | os.PathLike)
                and not flags & writes
                and Path(os.fspath(file)).resolve() == self.path
            ):
                self.reads += 1
            return real(file, flags, *args, **kwargs)

        return counting

    def parser(self, real: Callable[[dict[str, Any], str], Config]) -> Callable[..., Config]:
        def counting(data: dict[str, Any], source: str) -> Config:
            self.parses[data.get("instances", {}).get("qwen", {}).get("context")] += 1
            return real(data, source)

        return counting


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], Counts]]:
    """Counts for a config path: every open of it for reading (``open``, ``Path.read_text``,
    ``os.open``) and every parse_config, wherever it is called from."""

    def start(path: Path) -> Counts:
        counts = Counts(path)
        monkeypatch.setattr(builtins, "open", counts.opener(builtins.open))
        monkeypatch.setattr(io, "open", counts.opener(io.open))
        monkeypatch.setattr(os, "open", counts.os_opener(os.open))
        real_parse = core_config.parse_config
        monkeypatch.setattr(core_config, "parse_config", counts.parser(real_parse))
        monkeypatch.setattr(config_edit, "parse_config", counts.parser(real_parse))
        return counts

    yield start


cli = partial(invoke, catch_exceptions=False)


def test_one_switch_and_one_rollback_each_read_and_parse_the_config_once(
    tmp_path: Path, recorder: Path, counted: Callable[[Path], Counts]
) -> None:
    config = write_config(tmp_path, context=4096)
    counts = counted(config)
    # No --host: the config's only host, chosen from the same one parse.
    switched = cli("switch", str(config), "--set", "instances.qwen.context=8192", "--timeout", "1")
    assert switched.exit_code == 1, switched.output
    assert "gate health qwen: FAILED" in switched.output
    assert [r["argv"] for r in recorded(recorder)] == [
        ["nixos-rebuild", "switch", "--flake", ".#gpu1"],
        ["nixos-rebuild", "switch", "--rollback"],
    ]
    assert counts.reads == 1
    assert counts.parses == {8192: 1}  # the text with --set applied, once
    assert "context = 4096" in config.read_text()  # the failed change was put back

    counts = counted(config)
    rolled = cli("rollback", str(config), "--to", "1", "--timeout", "1")
    # Generation 1 goes back on (its config too), and really does not answer.
    assert rolled.exit_code == 1, rolled.output
    assert "generation 1 is installed but not answering" in rolled.output
    assert counts.reads == 1
    # The file's text once, and generation 1's config (another text: where its instances
    # listen, to check them) once.
    assert counts.parses == {4096: 1, 8192: 1}
    assert "context = 8192" in config.read_text()


def test_a_rollback_to_the_config_in_the_file_parses_it_once(
    tmp_path: Path, recorder: Path, counted: Callable[[Path], Counts]
) -> None:
    config = write_config(tmp_path)
    assert cli("switch", str(config), "--timeout", "1").exit_code == 1
    counts = counted(config)
    rolled = cli("rollback", str(config), "--to", "1", "--timeout", "1")
    assert "generation 1 is installed but not answering" in rolled.output
    assert (counts.reads, counts.parses) == (1, {4096: 1})


def _holds_open(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.path.realpath(fd) == str(path) for fd in fds.iterdir())
    except OSError:
        return False


def test_a_switch_that_waited_for_the_lock_works_from_the_config_written_meanwhile(
    tmp_path: Path, recorder: Path
) -> None:
    """The config is read before the host's lock is taken (which host follows from it): a
    switch that had to wait reads it again when another command wrote it in the meantime."""
    config = write_config(tmp_path, context=4096)
    state = tmp_path / ".llamanix-state" / "gpu1"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    argv = [sys.executable, "-m", "llamanix", "switch", str(config), "--timeout", "1"]
    with host_lock(state, "host gpu1", str(config), command="switch"):
        proc = subprocess.Popen(
            [*argv, "--wait", "60", "--set", "instances.qwen.parallel=2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # It opens the lock file after its read of the config, then polls for the lock.
        deadline = time.monotonic() + 30
        while not _holds_open(proc.pid, state / "lock"):
            assert proc.poll() is None and time.monotonic() < deadline, "never reached the lock"
            time.sleep(0.05)
        # What another switch would have done meanwhile: written the config anew.
        atomic_write(config, config.read_text().replace("context = 4096", "context = 2048"))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    listing = subprocess.run(
        [sys.executable, "-m", "llamanix", "generations", str(config), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    [gen] = json.loads(listing.stdout)
    snapshot = (state / "generations" / str(gen["number"]) / "config.toml").read_text()
    assert "context = 2048" in snapshot and "parallel = 2" in snapshot
    # The failed gate put back the file as it was under the lock, not as first read.
    assert "context = 2048" in config.read_text() and "parallel" not in config.read_text()


def test_host_choice_speaks_of_the_config_and_the_cli_adds_its_flag(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=("gpu1", "gpu2"))
    parsed = core_config.load_config(config)
    with pytest.raises(HostChoiceError) as unknown:
        pick_host(parsed, "box")
    with pytest.raises(HostChoiceError) as several:
        pick_host(parsed, None)
    assert [str(p) for p in unknown.value.problems + several.value.problems] == [
        f"{config}: hosts: no [hosts.box] table (known: gpu1, gpu2)",
        f"{config}: hosts: 2 [hosts.*] tables and no host named (name one of gpu1, gpu2)",
    ]
    result = CliRunner().invoke(main, ["switch", str(config)])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"{config}: hosts: 2 [hosts.*] tables and no host named "
        "(name one of gpu1, gpu2 with --host)"
    ]
    assert not (tmp_path / ".llamanix-state").exists()


def test_every_command_renders_a_host_one_way() -> None:
    """Only render.host_render calls the renderer itself: every other module goes through it,
    so a routed host's residency always comes with its members' VRAM."""
    package = ROOT / "tools" / "llamanix"
    callers = []
    for path in sorted(package.rglob("*.py")):
        if path in (package / "render" / "host_render.py", package / "render" / "units.py"):
            continue
        nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
        by_name = any(
            isinstance(n, ast.ImportFrom)
            and n.module == "llamanix.render.units"
            and any(a.name == "render_host" for a in n.names)
            for n in nodes
        )
        has_module = any(
            (
                (isinstance(n, ast.ImportFrom) and n.module == "llamanix.render")
                and any(a.name == "units" for a in n.names)
            )
            or (
                isinstance(n, ast.Import)
                and any(a.name == "llamanix.render.units" for a in n.names)
            )
            for n in nodes
        )
        by_module = has_module and any(
            isinstance(n, ast.Attribute) and n.attr == "render_host" for n in nodes
        )
        if by_name or by_module:
            callers.append(str(path.relative_to(package)))
    assert callers == []


def test_a_regression_judged_on_stored_runs_is_not_measured_again() -> None:
    """A regression of an instance that nothing served before the switch (judged against the
    last good bench's stored runs, the instance having been removed and added back) has no
    baseline to measure again: the rollback stands, said in one line, and nothing is
    measured (the confirmation used to look up its old target and fail with a KeyError)."""
    from types import SimpleNamespace

    from llamanix.state.gate_records import BenchVerdict, GateResult
    from llamanix.switch import transaction
    from llamanix.switch.switch_records import HostOutcome

    said: list[str] = []
    sw = SimpleNamespace(
        request=SimpleNamespace(old_config=object(), prompts=None),
        opts=SimpleNamespace(drift_action=lambda: "keep"),
        old_targets={},
        echo=said.append,
    )
    verdict = BenchVerdict(samples=(1.0,) * 5, action="rollback", note="", decision="regression")
    results = [GateResult("chat", "bench", False, "slower", 1.0, bench=verdict)]
    outcome = HostOutcome("box", "failed", 1, restore="serving again")
    back = transaction._confirm(sw, object(), results, outcome, True)  # type: ignore[arg-type]
    assert back is outcome
    assert said == [
        "  chat: not served before the switch, so not measured again; the rollback stands"
    ]


def test_a_request_read_again_with_other_units_for_the_same_hosts_locks_those(
    tmp_path: Path,
) -> None:
    """While a command waited for a host's lock, another wrote the config and gave the host
    other units (its kind, its units_dir): the request read again holds the lock of the units
    it now changes, not of those it first named."""
    from dataclasses import dataclass

    from llamanix.core.errors import UserError
    from llamanix.hosts.leftovers import Scope
    from llamanix.state.config_edit import ConfigText, read_config
    from llamanix.state.host_lock import units_lock
    from llamanix.switch.request import locked

    config = tmp_path / "llamanix.toml"
    config.write_text("# first\n")
    first_units, then_units = tmp_path / "units-a", tmp_path / "units-b"

    @dataclass(frozen=True)
    class Request:
        source: ConfigText
        hosts: tuple[str, ...]
        units: Path

        def units_scope(self, host: str) -> Scope:
            return Scope(self.units, "user")

        def read_again(self) -> Request:
            return Request(read_config(config), self.hosts, then_units)

    first = Request(read_config(config), ("box",), first_units)
    atomic_write(config, "# written meanwhile, other units\n")
    said: list[str] = []
    with locked(first, dry_run=False, wait_s=0, command="switch", echo=said.append) as request:
        assert request.units == then_units and request.source.text.startswith("# written")
        with (
            pytest.raises(UserError, match=r"units in .*units-b are being switched"),
            units_lock(then_units, "test", 0, command="test"),
        ):
            pass
        with units_lock(first_units, "test", 0, command="test"):
            pass  # released when the request was read again
    with units_lock(then_units, "test", 0, command="test"):
        pass  # and released at the end
