"""The fleet agent's refusals, here: what a caller of ``sudo -n llamanix fleet-agent ...`` may
not make it do (tests/test_fleet_sudo.py tries the same through the real sudoers line on the
fleet bed). Each is one line, exit 2, and nothing is written: no copy of the config, no run,
no file outside the agent's directory.

The agent runs as this process's user: root where the tests run as root (a ``systemd`` host's
agent, through sudo there), else a user's (``systemd-user``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from cli_run import invoke
from click.testing import Result

from llamanix.core.errors import UserError
from llamanix.fleet import agent
from llamanix.fleet.protocol import PROTOCOL, AgentRequest, RunReport, SwitchOrder
from llamanix.switch.switch_records import RollbackOptions, SwitchOptions

ROOT = os.geteuid() == 0
KIND = "systemd" if ROOT else "systemd-user"
# A host name that would add a sudoers line to whatever file it was written into.
SUDOERS_LINE_NAME = "\nadmin ALL=(ALL) NOPASSWD: ALL\n#"
needs_root = pytest.mark.skipif(not ROOT, reason="a root agent's checks: run as root")


def config(*names: str, other: str | None = None) -> str:
    """A fleet config with ``names`` as hosts of the agent's kind, and ``other`` (a host with
    a target: another machine)."""
    text = ""
    for name in names:
        text += f'[hosts.{json.dumps(name)}]\nkind = "{KIND}"\n'
        text += 'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
    if other:
        text += f'[hosts.{other}]\nkind = "{KIND}"\ntarget = "admin@{other}"\n'
        text += 'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
    for i, name in enumerate((*names, *([other] if other else []))):
        text += f'[instances.chat{i}]\nhost = {json.dumps(name)}\nmodel = "/srv/m.gguf"\n'
        text += f"port = {8080 + i}\n"
    return text


def run_agent(
    fleet: Path, command: str, request: str = "", *args: str, env: dict[str, str] | None = None
) -> Result:
    return invoke(
        "fleet-agent",
        command,
        *args,
        input=request,
        env={agent.DIR_ENV: str(fleet), **(env or {})},
        catch_exceptions=False,
    )


def one_line(done: Result) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.output
    return lines[0]


def switch_request(host: str, text: str, **options: object) -> str:
    opts = SwitchOptions(**options)  # type: ignore[arg-type]
    return AgentRequest(PROTOCOL, host, order=SwitchOrder("toml", text, opts)).text()


def tree(path: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and link under ``path``: its mode and its bytes (a link's target)."""
    found: dict[str, tuple[int, bytes]] = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            found[str(p)] = (st.st_mode, os.readlink(p).encode())
        elif stat.S_ISREG(st.st_mode):
            found[str(p)] = (st.st_mode, p.read_bytes())
    return found


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    return tmp_path / "agent"


# --- the unit's commands -----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["unit-switch", "unit-rollback"])
def test_the_units_commands_take_no_directory_nor_host(
    tmp_path: Path, fleet: Path, command: str
) -> None:
    """The escape of a wildcard sudoers line: DIR/run.log a link to a file of root's, and a
    host name that carries a sudoers line. There is no --dir, and no --host, to give."""
    evil = tmp_path / "evil"
    evil.mkdir()
    target = tmp_path / "sudoers.d" / "admin"
    target.parent.mkdir()
    target.write_text("admin ALL=(root) NOPASSWD: /usr/local/bin/llamanix fleet-agent status\n")
    (evil / "run.log").symlink_to(target)
    before = tree(tmp_path)
    argv = ["--host", SUDOERS_LINE_NAME, "--dir", str(evil)]
    done = run_agent(fleet, command, "", *argv)
    assert done.exit_code == 2, done.output
    assert "No such option '--host'" in done.stderr
    assert tree(tmp_path) == before


@needs_root
@pytest.mark.parametrize("op", ["switch", "rollback"])
def test_the_units_commands_run_only_in_their_unit(fleet: Path, op: str) -> None:
    fleet.mkdir(mode=0o700)
    done = run_agent(fleet, f"unit-{op}")
    assert done.exit_code == 2
    assert one_line(done) == (
        f"llamanix fleet-agent unit-{op}: runs only as the fleet's own unit "
        f"llamanix-fleet.service, which `llamanix fleet-agent {op}` starts (run llamanix {op} "
        "from the controller)"
    )
    assert list(fleet.iterdir()) == []


def test_the_units_log_is_never_written_through_a_link(
    tmp_path: Path, fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even where a link got into the agent's directory, the unit neither follows it nor
    writes the host's name through it."""
    fleet.mkdir(mode=0o700)
    target = tmp_path / "sudoers"
    target.write_text("root ALL=(ALL) ALL\n")
    (fleet / "run.log").symlink_to(target)
    record = agent.RunRecord("switch", "r1", "box2", "2025-01-01T00:00:00+00:00")
    d = agent.FleetDir(fleet, not ROOT)
    record.save(d)
    monkeypatch.setattr(agent, "in_run_unit", lambda _: True)
    with pytest.raises(UserError) as err:
        agent.unit_switch(d, lambda _: None)
    assert str(err.value).startswith(f"{fleet / 'run.log'}: cannot be written: ")
    assert target.read_text() == "root ALL=(ALL) ALL\n"


# --- the request -------------------------------------------------------------------------------


def test_arguments_are_refused_after_the_hello(fleet: Path) -> None:
    """What an older controller sends: the hello says which protocol this agent speaks."""
    done = run_agent(fleet, "status", "", "--protocol", "2", "--host", "box2")
    assert done.exit_code == 3
    assert done.stdout.startswith("llamanix-fleet-agent: ")
    assert one_line(done) == (
        "llamanix fleet-agent status: --protocol: takes no argument: fleet protocol "
        f"{PROTOCOL} reads its request on stdin (install the same llamanix on both sides)"
    )
    assert not fleet.exists()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"units_dir": Path("/etc/sudoers.d")}, "options.units_dir"),
        ({"manager": "up"}, "options.manager"),
        ({"sets": ("instances.chat0.port=22",)}, "options.sets"),
        ({"gate": "bench", "gate_prompts": "/etc/shadow"}, "options.gate_prompts"),
    ],
)
def test_options_that_steer_a_switch_are_refused(
    fleet: Path, options: dict[str, object], field: str
) -> None:
    done = run_agent(fleet, "switch", switch_request("box2", config("box2"), **options))
    assert done.exit_code == 2, done.output
    assert one_line(done).startswith(f"llamanix fleet-agent switch: stdin: {field}: "), done.stderr
    assert not fleet.exists()


@pytest.mark.parametrize("options", [{"units_dir": "/etc/sudoers.d"}, {"manager": "up"}])
def test_options_that_steer_a_rollback_are_refused(fleet: Path, options: dict[str, str]) -> None:
    opts = RollbackOptions.from_json(options, "options")
    done = run_agent(fleet, "rollback", AgentRequest(PROTOCOL, "box2", rollback=opts).text())
    assert done.exit_code == 2, done.output
    [name] = options
    assert one_line(done).startswith(f"llamanix fleet-agent rollback: stdin: options.{name}: ")
    assert not fleet.exists()


@pytest.mark.parametrize("name", [SUDOERS_LINE_NAME, "../../../etc/sudoers.d/x", "..", "a/b"])
def test_a_host_that_is_no_plain_name_is_refused_before_anything_is_written(
    fleet: Path, name: str
) -> None:
    """Even where the config received names it: a host's name becomes a directory beside
    the copy, and goes into the run's record, the unit's description and its log."""
    for command in ("switch", "rollback", "generations", "top"):
        request = (
            switch_request(name, config(name))
            if command == "switch"
            else AgentRequest(PROTOCOL, name, rollback=RollbackOptions()).text()
        )
        done = run_agent(fleet, command, request)
        assert done.exit_code == 2, done.output
        line = one_line(done)
        assert f"host: {json.dumps(name)} is not a host's name" in line, line
    assert not fleet.exists() or tree(fleet) == {}


def test_a_host_of_the_copy_that_is_another_machine_is_refused(fleet: Path) -> None:
    """rollback, generations and top read the copy the host keeps: a host there with a
    target is another machine, which this one's root never reaches over ssh."""
    fleet.mkdir(mode=0o700)
    (fleet / "llamanix.toml").write_text(config("box2", other="box3"))
    for command in ("rollback", "generations", "top"):
        request = AgentRequest(PROTOCOL, "box3", rollback=RollbackOptions()).text()
        done = run_agent(fleet, command, request)
        assert done.exit_code == 2, done.output
        assert one_line(done) == (
            f"{fleet / 'llamanix.toml'}: hosts.box3.target: is another machine: this fleet "
            "agent reads and switches only the host it was switched as (name the host this "
            "machine is)"
        )
    done = run_agent(fleet, "generations", AgentRequest(PROTOCOL, "nohost").text())
    assert done.exit_code == 2
    assert 'host: no host "nohost" in the config' in one_line(done)


@needs_root
def test_the_directory_is_not_taken_from_the_environment_through_sudo(fleet: Path) -> None:
    done = run_agent(
        fleet, "status", AgentRequest(PROTOCOL, "box2").text(), env={"SUDO_UID": "1001"}
    )
    assert done.exit_code == 2
    assert one_line(done) == (
        "LLAMANIX_FLEET_DIR: is not for a fleet agent run through sudo: it keeps its state in "
        "/var/lib/llamanix/fleet (leave LLAMANIX_FLEET_DIR out)"
    )


# --- the agent's directory ---------------------------------------------------------------------


def test_a_directory_that_is_a_link_is_refused(tmp_path: Path, fleet: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "run.json").write_text('{"op": "switch", "run": "r", "host": "x", "started": "t"}')
    fleet.symlink_to(elsewhere)
    for command in ("status", "switch"):
        done = run_agent(fleet, command, switch_request("box2", config("box2")))
        assert done.exit_code == 2, done.output
        assert one_line(done) == (
            f"{fleet}: is a symbolic link: the fleet agent keeps its state in a directory of "
            "its own (remove it; the next switch makes the directory)"
        )
    assert sorted(p.name for p in elsewhere.iterdir()) == ["run.json"]


def test_a_directory_others_may_read_is_refused(fleet: Path) -> None:
    fleet.mkdir()
    fleet.chmod(0o755)
    done = run_agent(fleet, "switch", switch_request("box2", config("box2")))
    assert done.exit_code == 2
    assert one_line(done) == (
        f"{fleet}: has mode 0755: the fleet agent keeps its state where only it reads and "
        f"writes (0700) (chmod 0700 {fleet})"
    )
    assert list(fleet.iterdir()) == []


@needs_root
def test_a_directory_of_another_user_is_refused(fleet: Path) -> None:
    fleet.mkdir(mode=0o700)
    os.chown(fleet, 1001, 1001)
    done = run_agent(fleet, "status", AgentRequest(PROTOCOL, "box2").text())
    assert done.exit_code == 2
    assert one_line(done) == (
        f"{fleet}: belongs to uid 1001, not to the fleet agent's (uid 0) (see what it holds, "
        f"then chown -R 0 {fleet} or remove it)"
    )


@needs_root
def test_a_directory_below_one_others_may_change_is_refused(tmp_path: Path) -> None:
    """Whoever may write the directory above could move the agent's away and put a link in
    its place."""
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)  # and not sticky
    fleet = above / "agent"
    done = run_agent(fleet, "switch", switch_request("box2", config("box2")))
    assert done.exit_code == 2
    assert one_line(done) == (
        f"{above}: holds the fleet agent's directory {fleet}, and another user could change "
        "it (uid 0, mode 0777) (make it root's, and writable by root alone)"
    )
    assert [p.name for p in fleet.iterdir()] == []


def test_a_run_record_that_is_a_link_is_not_read(tmp_path: Path, fleet: Path) -> None:
    """status prints what it reads: never a file a link leads to."""
    fleet.mkdir(mode=0o700)
    secret = tmp_path / "secret.json"
    secret.write_text('{"op": "switch", "run": "sk-secret", "host": "h", "started": "t"}')
    (fleet / "run.json").symlink_to(secret)
    done = run_agent(fleet, "status", AgentRequest(PROTOCOL, "box2").text())
    assert done.exit_code == 2
    assert one_line(done).startswith(f"{fleet / 'run.json'}: cannot be read: ")
    assert "sk-secret" not in done.output


def test_status_needs_no_request_and_the_others_say_who_sends_one(fleet: Path) -> None:
    """Someone on the host asks how the last run ended (what the refusals of a run that still
    goes on point to); the commands that change something wait for no request that will not
    come."""
    done = run_agent(fleet, "status")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[-1] == RunReport(None).line()
    for command in ("switch", "rollback", "generations", "top"):
        done = run_agent(fleet, command)
        assert done.exit_code == 2
        assert one_line(done) == (
            f"llamanix fleet-agent {command}: no request on stdin: a controller sends one (run "
            f"llamanix {command} from the controller)"
        )
    assert not fleet.exists()


@pytest.mark.parametrize(
    ("request_text", "words"),
    [
        ("[" * 200_000 + "]" * 200_000, "nest more than 64 levels deep"),
        (f'{{"protocol": {PROTOCOL}, "host": "box", "window_s": NaN}}', "holds NaN"),
        (f'{{"protocol": {PROTOCOL}, "host": "box", "follow_timeout_s": Infinity}}', "Infinity"),
        (f'{{"protocol": {PROTOCOL}, "host": "box", "host": "other"}}', "appears twice"),
    ],
)
def test_a_request_is_read_as_every_file_is(fleet: Path, request_text: str, words: str) -> None:
    """The request root reads on stdin goes through the one JSON reader: one line, no
    traceback, for nesting, non-numbers and keys given twice; nothing is written."""
    for command in ("status", "top", "switch"):
        done = run_agent(fleet, command, request_text)
        assert done.exit_code == 2, done.output
        assert words in one_line(done)
    assert not fleet.exists()
