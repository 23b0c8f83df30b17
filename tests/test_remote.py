"""A remote plain-systemd host, from the controller's side: the exact ssh and agent command
lines, the config on ssh's stdin (never in an argv), the agent's lines echoed with the host's
name, each way of failing as one line, dry runs, and the outcome's JSON.

ssh is a stand-in on PATH that records its argv and stdin. It either answers what a test put
in its script of replies (one per call), or runs the remote command here with ``sh -c``, as
sshd hands it to a login shell: then ``sudo`` is a stand-in that runs the rest of its argv,
``llamanix`` is this checkout, and the agent's ``systemctl`` and ``systemd-run`` are stand-ins
(systemd-run plays the unit: it writes what the real switch would, tests/test_fleet_agent_host.py
runs the real one under systemd).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pytest
from cli_run import invoke
from click.testing import Result

from llamanix import __version__
from llamanix.config.model import load_config
from llamanix.core.address import parse_target
from llamanix.core.errors import UserError
from llamanix.external.process import Runner
from llamanix.fleet import agent as fleet_agent
from llamanix.fleet import remote
from llamanix.fleet.protocol import (
    GENERATIONS,
    PROTOCOL,
    AgentRequest,
    Hello,
    RunReport,
    SwitchOrder,
    started_line,
)
from llamanix.state.gate_records import BenchVerdict, GateResult
from llamanix.switch.switch_records import HostOutcome, RollbackOptions, SwitchOptions

ROOT = Path(__file__).resolve().parent.parent
SSH_OPTS = [
    "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5",
    "-o", "ServerAliveCountMax=3", "-T",
]  # fmt: skip
HELLO = Hello(PROTOCOL, __version__).line()

_SSH = """#!{python}
import json, os, subprocess, sys
record = {record!r}
stdin = sys.stdin.read()
with open(record, "a") as fh:
    fh.write(json.dumps({{"argv": ["ssh", *sys.argv[1:]], "stdin": stdin}}) + "\\n")
replies = {replies!r}
if not os.path.exists(replies):  # run it here, as sshd hands it to a login shell
    sys.exit(subprocess.run(["sh", "-c", sys.argv[-1]], input=stdin, text=True).returncode)
calls = sum(1 for _ in open(record))
reply = json.load(open(replies))[calls - 1]
sys.stdout.write(reply["stdout"])
sys.stderr.write(reply["stderr"])
sys.exit(reply["exit"])
"""


@dataclass
class Ssh:
    """The ssh stand-in: its record, and the replies it gives (none: it runs the command)."""

    record: Path
    replies: Path
    bin_dir: Path

    def reply(self, *replies: tuple[list[str], str, int]) -> None:
        """One reply per call: (stdout lines, stderr, exit code)."""
        self.replies.write_text(
            json.dumps(
                [
                    {"stdout": "".join(f"{line}\n" for line in out), "stderr": err, "exit": code}
                    for out, err, code in replies
                ]
            )
        )

    def calls(self) -> list[dict[str, object]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def argvs(self) -> list[list[str]]:
        return [list(c["argv"]) for c in self.calls()]  # type: ignore[call-overload]


@pytest.fixture
def ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ssh:
    bin_dir = tmp_path / "standins"
    bin_dir.mkdir()
    found = Ssh(tmp_path / "ssh.jsonl", tmp_path / "replies.json", bin_dir)
    script = bin_dir / "ssh"
    script.write_text(
        _SSH.format(python=sys.executable, record=str(found.record), replies=str(found.replies))
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return found


KIND = "systemd"


def write_config(d: Path, kind: str = KIND, target: str = "admin@box2", port: int = 8080) -> Path:
    path = d / "llamanix.toml"
    path.write_text(
        "# the fleet\n"
        f'[hosts.box2]\nkind = "{kind}"\ntarget = "{target}"  # over ssh\n'
        'binaries = { upstream = "/usr/local/bin/llama-server" }\n\n'
        f'[instances.chat]\nhost = "box2"\nmodel = "/srv/models/m.gguf"\nport = {port}\n'
    )
    return path


cli = partial(invoke, catch_exceptions=False)


def outcome_line(result: str = "passed", generation: int = 3, run: str = "r1") -> str:
    outcome = HostOutcome(
        "box2",
        result,  # type: ignore[arg-type]
        generation,
        "" if result == "passed" else "chat: did not start; previous generation serving again",
        ["chat"],
        [GateResult("chat", "health", result == "passed", "health ok")],
        previous=2,
        out_of_service_s=1.5,
    )
    report = RunReport("switch", run, "box2", "2025-01-01T00:00:00+00:00", "active", True, outcome)
    return report.line()


def agent_command(op: str, sudo: bool = True) -> str:
    """The agent's command as ssh sends it: the command's name alone, as the sudoers line
    allows it."""
    head = "sudo -n llamanix" if sudo else "llamanix"
    return f"{head} fleet-agent {op}"


def request_of(call: dict[str, object]) -> AgentRequest:
    """The request an ssh call handed the agent on stdin."""
    request = AgentRequest.parse(str(call["stdin"]), "stdin")
    assert (request.protocol, request.host) == (PROTOCOL, "box2")
    return request


def order_of(call: dict[str, object]) -> SwitchOrder:
    order = request_of(call).order
    assert order is not None
    return order


def rollback_of(call: dict[str, object]) -> RollbackOptions:
    opts = request_of(call).rollback
    assert opts is not None
    return opts


# --- the command lines ---------------------------------------------------------------------------


def test_remote_argv_is_ssh_with_batch_options_and_the_quoted_agent_command(
    tmp_path: Path,
) -> None:
    for kind, head in (("systemd", ["sudo", "-n", "llamanix"]), ("systemd-user", ["llamanix"])):
        config = load_config(write_config(tmp_path, kind))
        rh = remote.remote_host(config, "box2")
        target = parse_target("admin@box2")
        assert rh == remote.RemoteHost("box2", target, kind, "toml", str(config.source))  # type: ignore[arg-type]
        argv = remote.remote_argv(rh, "switch")
        # The command's name alone: the host's sudoers line allows it as it is.
        agent = [*head, "fleet-agent", "switch"]
        assert argv == ["ssh", *SSH_OPTS, "admin@box2", "--", shlex.join(agent)]
        # The login shell on the other side splits it back into the same words.
        assert shlex.split(argv[-1]) == agent


def test_only_plain_systemd_hosts_with_a_target_are_remote(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[hosts.local]\nkind = "systemd"\n'
        'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
        '[hosts.nix]\nkind = "nixos"\ntarget = "root@n"\n'
        '[instances.a]\nhost = "local"\nmodel = "/m.gguf"\nport = 8080\n'
    )
    config = load_config(path)
    assert remote.remote_host(config, "local") is None
    assert remote.remote_host(config, "nix") is None


def test_a_target_with_a_port_reaches_ssh_as_p(tmp_path: Path, ssh: Ssh) -> None:
    for target in ("admin@box2:2222", "ssh://admin@box2:2222"):
        path = write_config(tmp_path, target=target)
        ssh.reply(([HELLO, started_line("r1"), outcome_line()], "", 0))
        done = cli("switch", str(path), "--host", "box2")
        assert done.exit_code == 0, done.output
        [call] = ssh.calls()
        assert call["argv"] == [
            "ssh", *SSH_OPTS, "-p", "2222", "admin@box2", "--", agent_command("switch")
        ]  # fmt: skip
        ssh.record.unlink()


def test_the_switch_options_travel_as_one_record_on_stdin(tmp_path: Path) -> None:
    opts = SwitchOptions(
        sets=("instances.chat.context=2048",),
        gate="bench",
        max_regression=5.0,
        max_runs=12,
        inconclusive="rollback",
        gate_prompts="realtext:edit",
        timeout_s=300.0,
        wait_s=10.0,
    )
    rh = remote.remote_host(load_config(write_config(tmp_path)), "box2")
    assert rh is not None
    order = remote.switch_order(rh, "the config", opts)
    # --set is applied already: the text is the config to switch to.
    assert order == SwitchOrder("toml", "the config", replace(opts, sets=()))
    back = SwitchOrder.parse(order.text(), "stdin")
    assert back == order and back.options.to_json() == {
        "sets": [], "gate": "bench", "min_tok_s": None, "max_regression": 5.0, "max_runs": 12,
        "inconclusive": "rollback", "timeout_s": 300.0, "drain_timeout_s": 30.0,
        "wait_s": 10.0, "manager": None, "units_dir": None, "gate_prompts": "realtext:edit",
        "run_timeout_s": 900.0, "follow_timeout_s": None, "on_drift": "keep",
        "warm_limit_gib": 16.0, "blue_green": False,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"^stdin\.options\.gate: unknown gate 'fast'"):
        SwitchOrder.parse(json.dumps({**order.to_json(), "options": {"gate": "fast"}}), "stdin")


# --- a switch ------------------------------------------------------------------------------------


def test_switch_hands_the_config_on_stdin_and_echoes_each_line_with_the_host(
    tmp_path: Path, ssh: Ssh
) -> None:
    path = write_config(tmp_path)
    ssh.reply(
        (
            [
                HELLO,
                "box2: switching chat via systemd",
                "$ systemctl daemon-reload",
                started_line("r1"),
                "  gate health chat: passed: health ok",
                outcome_line(),
            ],
            "",
            0,
        )
    )
    done = cli("switch", str(path), "--host", "box2", "--set", "instances.chat.context=2048")
    assert done.exit_code == 0, done.output
    new_text = path.read_text()
    assert "context = 2048" in new_text and "# over ssh" in new_text  # written once it passed
    [call] = ssh.calls()
    argv = call["argv"]
    assert argv == [
        "ssh", *SSH_OPTS, "admin@box2", "--",
        agent_command("switch"),
    ]  # fmt: skip
    # The whole config, --set applied, and the options, on stdin only.
    assert order_of(call) == SwitchOrder("toml", new_text, SwitchOptions())
    assert not any("context" in a or "[hosts" in a for a in argv)  # type: ignore[attr-defined]
    lines = done.stdout.splitlines()
    assert lines[0] == "box2: switching over ssh (admin@box2)"
    assert lines[1] == f"$ {shlex.join(argv)}"  # type: ignore[arg-type]
    assert lines[2:] == [
        "box2: switching chat via systemd",
        "box2: $ systemctl daemon-reload",
        "box2:   gate health chat: passed: health ok",
    ]
    # No state of the remote host here: it keeps its generations itself.
    assert not (tmp_path / ".llamanix-state" / "box2" / "generations").exists()


def test_a_failed_remote_switch_leaves_the_config_file_alone(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    before = path.read_text()
    ssh.reply(([HELLO, started_line("r1"), outcome_line("failed")], "", 1))
    done = cli("switch", str(path), "--host", "box2", "--set", "instances.chat.context=2048")
    assert done.exit_code == 1
    assert path.read_text() == before
    assert done.stderr.splitlines() == [
        "llamanix: switch of box2 failed: chat: did not start; previous generation serving again"
    ]


def test_switch_json_carries_the_remote_outcome(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    warning = "Warning: Permanently added 'box2' (ED25519) to the list of known hosts."
    ssh.reply(([HELLO, started_line("r1"), outcome_line()], warning + "\n", 0))
    done = cli("switch", str(path), "--host", "box2", "--json")
    assert done.exit_code == 0, done.output
    assert f"box2: {warning}" in done.stderr.splitlines()
    [found] = json.loads(done.stdout)
    assert found["result"] == "passed"
    assert (found["generation"], found["previous"], found["out_of_service_s"]) == (3, 2, 1.5)
    assert all(line.startswith(("box2: ", "$ ssh ")) for line in done.stderr.splitlines())


def test_host_outcome_json_round_trip() -> None:
    # The note is not recorded: the gate's detail carries it.
    bench = BenchVerdict((40.0, 41.0, 39.5), "keep", "", prompts="builtin:x")
    outcome = HostOutcome(
        "box2",
        "failed",
        4,
        "chat: too slow; previous generation serving again",
        ["chat", "code"],
        [
            GateResult("chat", "bench", False, "too slow", 40.2, bench),
            GateResult("code", "health", True, "health ok"),
        ],
        previous=3,
        out_of_service_s=12.25,
    )
    back = HostOutcome.from_json(json.loads(json.dumps(outcome.to_json())), "outcome")
    assert back == outcome
    with pytest.raises(ValueError, match=r"outcome\.result: unknown result 'exploded'"):
        HostOutcome.from_json({"host": "box2", "result": "exploded"}, "outcome")
    bare = HostOutcome.from_json({"host": "box2", "result": "unchanged"}, "outcome")
    assert bare == HostOutcome("box2", "unchanged")


# --- each way of failing is one line --------------------------------------------------------------


def one_line_error(done: Result) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.output
    return lines[0]


def test_unreachable_host_is_one_line(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    ssh.reply(([], "ssh: connect to host box2 port 22: Connection refused\n", 255))
    done = cli("switch", str(path), "--host", "box2")
    assert done.exit_code == 1
    assert one_line_error(done) == (
        "llamanix: box2: cannot reach admin@box2 over ssh: "
        "ssh: connect to host box2 port 22: Connection refused"
    )


def test_unreachable_is_its_own_error_for_the_rolling_switch(tmp_path: Path, ssh: Ssh) -> None:
    rh = remote.remote_host(load_config(write_config(tmp_path)), "box2")
    assert rh is not None
    ssh.reply(([], "Permission denied (publickey).\n", 255))
    with pytest.raises(remote.RemoteUnreachable) as err:
        remote.remote_status(rh, 120.0, Runner(echo=lambda _: None), lambda _: None)
    assert str(err.value) == (
        "box2: cannot reach admin@box2 over ssh: Permission denied (publickey)."
    )


@pytest.mark.parametrize(
    ("kind", "stderr", "code", "where"),
    [
        ("systemd", "sudo: llamanix: command not found\n", 1, "sudo's PATH"),
        ("systemd-user", "bash: line 1: llamanix: command not found\n", 127, None),
    ],
)
def test_no_llamanix_there_is_one_line_with_the_install_command(
    tmp_path: Path, ssh: Ssh, kind: str, stderr: str, code: int, where: str | None
) -> None:
    path = write_config(tmp_path, kind)
    ssh.reply(([], stderr, code))
    done = cli("switch", str(path), "--host", "box2")
    assert done.exit_code == 2
    where = where or "the PATH of commands run over ssh"
    assert one_line_error(done) == (
        f"box2: admin@box2 has no llamanix on {where}; install it there: "
        "sudo python3 -m venv /opt/llamanix && sudo /opt/llamanix/bin/pip install ./llamanix && "
        "sudo ln -s /opt/llamanix/bin/llamanix /usr/local/bin/llamanix"
    )


def test_sudo_that_wants_a_password_is_one_line(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    ssh.reply(([], "sudo: a password is required\n", 1))
    done = cli("switch", str(path), "--host", "box2")
    assert done.exit_code == 2
    assert one_line_error(done) == (
        "box2: sudo on admin@box2 asks admin for a password, and a fleet switch cannot answer "
        "it; allow it there: echo 'admin ALL=(root) NOPASSWD: /usr/local/bin/llamanix "
        "fleet-agent switch, /usr/local/bin/llamanix fleet-agent rollback, "
        "/usr/local/bin/llamanix fleet-agent status, /usr/local/bin/llamanix fleet-agent "
        "generations, /usr/local/bin/llamanix fleet-agent top' | sudo tee "
        "/etc/sudoers.d/llamanix"
    )


def test_an_agent_of_another_protocol_is_one_line(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    ssh.reply(([Hello(PROTOCOL + 1, "9.0.0").line()], "", 3))
    done = cli("switch", str(path), "--host", "box2")
    assert done.exit_code == 2
    assert one_line_error(done) == (
        f"box2: llamanix 9.0.0 on admin@box2 speaks fleet protocol {PROTOCOL + 1}, this one "
        f"{PROTOCOL}; upgrade llamanix here ({__version__})"
    )
    ssh.record.unlink()
    ssh.reply(([Hello(1, "0.9.0").line()], "", 3))
    done = cli("switch", str(path), "--host", "box2")
    assert one_line_error(done) == (
        f"box2: llamanix 0.9.0 on admin@box2 speaks fleet protocol 1, this one {PROTOCOL}; "
        "upgrade it there: sudo /opt/llamanix/bin/pip install --upgrade ./llamanix"
    )


def test_an_older_llamanix_without_the_agent_is_one_line_with_its_version(
    tmp_path: Path, ssh: Ssh
) -> None:
    path = write_config(tmp_path)
    click_says = (
        "Usage: llamanix [OPTIONS] COMMAND [ARGS]...\nTry 'llamanix -h' for help.\n\n"
        "Error: No such command 'fleet-agent'.\n"
    )
    ssh.reply(([], click_says, 2), (["llamanix, version 0.0.9"], "", 0))
    done = cli("switch", str(path), "--host", "box2")
    assert done.exit_code == 2
    assert one_line_error(done) == (
        f"box2: llamanix 0.0.9 on admin@box2 speaks no fleet protocol, this one {PROTOCOL}; "
        "upgrade it there: sudo /opt/llamanix/bin/pip install --upgrade ./llamanix"
    )
    # Without sudo: the sudoers line allows the agent's commands alone.
    assert ssh.argvs()[1][-1] == "llamanix --version"


def test_the_agents_own_refusal_is_one_line(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    refusal = (
        "/var/lib/llamanix/fleet: a fleet switch started at 2025-01-01T00:00:00+00:00 still "
        "runs (llamanix fleet-agent status follows it)"
    )
    ssh.reply(([HELLO], refusal + "\n", 2))
    done = cli("switch", str(path), "--host", "box2")
    assert done.exit_code == 2
    assert one_line_error(done) == f"box2: admin@box2: {refusal}"


def test_a_connection_lost_mid_switch_is_followed_again(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    lost = "Timeout, server box2 not responding.\n"
    ssh.reply(
        ([HELLO, started_line("r7"), "box2: switching chat via systemd"], lost, 255),
        ([HELLO, "  gate health chat: passed: health ok", outcome_line(run="r7")], "", 0),
    )
    done = cli("switch", str(path), "--host", "box2", "--set", "instances.chat.context=2048")
    assert done.exit_code == 0, done.output
    assert "context = 2048" in path.read_text()
    # Followed again for as long as the switch's own follow (--run-timeout and a minute).
    assert ssh.argvs()[1][-1] == agent_command("status")
    assert request_of(ssh.calls()[1]).follow_timeout_s == 960.0
    assert (
        "box2: lost the ssh connection (Timeout, server box2 not responding.); following the "
        "switch there again"
    ) in done.stdout


def still_runs_line(run: str = "r7") -> str:
    report = RunReport("switch", run, "box2", "2025-01-01T00:00:00+00:00", "running", True)
    return replace(report, running=True).line()


def test_a_switch_still_running_when_its_agent_stops_following_is_lost(
    tmp_path: Path, ssh: Ssh
) -> None:
    rh = remote.remote_host(load_config(write_config(tmp_path)), "box2")
    assert rh is not None
    ssh.reply(([HELLO, started_line("r7"), still_runs_line()], "", 1))
    opts = SwitchOptions(run_timeout_s=300.0, follow_timeout_s=30.0)
    with pytest.raises(remote.RemoteLost) as err:
        remote.remote_switch(rh, "x", opts, Runner(echo=lambda _: None), lambda _: None)
    assert str(err.value) == (
        "box2: the fleet switch of box2 started 2025-01-01T00:00:00+00:00 still runs on "
        "admin@box2 after 30 s (--follow-timeout); it goes on there by itself: `llamanix "
        f"generations {rh.source} --host box2` shows how it ended"
    )
    # The unit's own limit went with the options.
    order = order_of(ssh.calls()[0])
    assert order.options.run_timeout_s == 300.0 and order.options.follow_s == 30.0


def test_a_run_still_going_on_refuses_the_rollout_before_any_host(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    ssh.reply(([HELLO, still_runs_line()], "", 1))
    done = cli("switch", str(path), "--hosts", "box2", "--preflight-timeout", "5")
    assert done.exit_code == 1, done.output
    [call] = ssh.calls()  # the status alone: no switch
    assert call["argv"][-1] == agent_command("status")  # type: ignore[index]
    assert request_of(call).follow_timeout_s == 5.0
    table = done.stdout[done.stdout.index("rolling switch") :]
    assert "refused" in table and "still runs" in table, table
    assert done.stdout.splitlines()[:2] == [
        "box2: the fleet switch of box2 started 2025-01-01T00:00:00+00:00 still runs there "
        "after 5 s (--preflight-timeout) (let it end (`llamanix fleet-agent status` on "
        "admin@box2 follows it), or raise --preflight-timeout)",
        "rollout: not started: box2 cannot be switched now",
    ]


def test_a_connection_lost_for_good_is_unreachable(tmp_path: Path, ssh: Ssh) -> None:
    rh = remote.remote_host(load_config(write_config(tmp_path)), "box2")
    assert rh is not None
    lost = "Timeout, server box2 not responding.\n"
    ssh.reply(
        ([HELLO, started_line("r7")], lost, 255),
        ([], "ssh: connect to host box2 port 22: No route to host\n", 255),
    )
    with pytest.raises(remote.RemoteLost) as err:
        remote.remote_switch(rh, "x", SwitchOptions(), Runner(echo=lambda _: None), print)
    assert str(err.value) == (
        "box2: lost admin@box2 over ssh during the switch (Timeout, server box2 not "
        f"responding.); it goes on there by itself: `llamanix generations {rh.source} --host "
        "box2` shows how it ended"
    )


def test_local_manager_options_are_refused_for_a_remote_host(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    done = cli("switch", str(path), "--host", "box2", "--manager", "up")
    assert done.exit_code == 2
    assert "--manager and --units-dir are for hosts switched from this machine" in done.stderr
    assert ssh.calls() == []


# --- dry runs, rollback, generations --------------------------------------------------------------


def test_dry_run_lists_every_remote_command_and_runs_nothing(tmp_path: Path, ssh: Ssh) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[hosts.box2]\nkind = "systemd"\ntarget = "admin@box2"\n'
        'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
        '[hosts.box3]\nkind = "systemd-user"\ntarget = "bob@box3"\n'
        'binaries = { upstream = "/home/bob/llama.cpp/build/bin/llama-server" }\n'
        '[instances.a]\nhost = "box2"\nmodel = "/m.gguf"\nport = 8080\n'
        '[instances.b]\nhost = "box3"\nmodel = "/m.gguf"\nport = 8081\n'
    )
    before = path.read_text()
    done = cli(
        "switch", str(path), "--host", "all", "--set", "instances.a.context=2048", "--dry-run"
    )
    assert done.exit_code == 0, done.output
    ssh_lines = [line for line in done.stdout.splitlines() if line.startswith("ssh ")]
    hosts = (("box2", "admin@box2", "sudo -n llamanix"), ("box3", "bob@box3", "llamanix"))
    # --host all is a rollout: every host asked how its last run ended, then each switched.
    assert ssh_lines == [
        shlex.join(["ssh", *SSH_OPTS, target, "--", f"{agent} fleet-agent {op}"])
        for op in ("status", "switch")
        for _, target, agent in hosts
    ]  # fmt: skip
    for host, _, _ in hosts:  # the preflight's requests, shown as they go on stdin
        request = AgentRequest(PROTOCOL, host, follow_timeout_s=120.0).text()
        assert f"# on ssh's stdin: {request}" in done.stdout
    assert f"# write {path} once box2 passes" in done.stdout
    assert ssh.calls() == [] and path.read_text() == before
    done = cli("rollback", str(path), "--host", "box3", "--to", "2", "--dry-run")
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert shlex.join(
        ["ssh", *SSH_OPTS, "bob@box3", "--", "llamanix fleet-agent rollback"]
    ) in lines  # fmt: skip
    note = next(line for line in lines if line.startswith("# on ssh's stdin: "))
    sent = AgentRequest.parse(note.removeprefix("# on ssh's stdin: "), "stdin")
    assert (sent.protocol, sent.host, sent.rollback) == (PROTOCOL, "box3", RollbackOptions(to=2))
    assert ssh.calls() == []


def test_rollback_of_a_remote_host(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    before = path.read_text()
    report = RunReport(
        "rollback", "r2", "box2", "2025-01-01T00:00:00+00:00", "active", False,
        HostOutcome("box2", "passed", 2, previous=3, out_of_service_s=2.0),
    )  # fmt: skip
    ssh.reply(
        ([HELLO, started_line("r2"), "box2: rolling back to generation 2", report.line()], "", 0)
    )
    done = cli("rollback", str(path), "--host", "box2", "--to", "2")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[-1] == "now serving generation 2"
    assert "box2: rolling back to generation 2" in done.stdout
    assert ssh.argvs()[0][-1] == agent_command("rollback")
    assert rollback_of(ssh.calls()[0]) == RollbackOptions(to=2)
    assert path.read_text() == before  # the file here names every host: left as it is


def test_rollback_of_several_hosts_waits_as_asked(tmp_path: Path, ssh: Ssh) -> None:
    """--wait reaches each host's agent: a run still going on there is waited for, not
    refused at once."""
    path = write_config(tmp_path)
    report = RunReport(
        "rollback", "r2", "box2", "2025-01-01T00:00:00+00:00", "active", False,
        HostOutcome("box2", "passed", 2, previous=3),
    )  # fmt: skip
    ssh.reply(([HELLO, started_line("r2"), report.line()], "", 0))
    done = cli("rollback", str(path), "--hosts", "box2", "--to", "2", "--wait", "45")
    assert done.exit_code == 0, done.output
    sent = rollback_of(ssh.calls()[0])
    assert (sent.to, sent.wait_s) == (2, 45.0)


def test_generations_of_a_remote_host_come_from_it(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    row = {
        "number": 1,
        "current": True,
        "date": "2025-01-01T00:00:00+00:00",
        "instances": {"chat": {"port": 8080, "source_revision": "abc", "variant": "upstream"}},
        "gate": {"kind": "health", "result": "passed"},
        "rollback": None,
        "gaps": {
            "chat": {"drain_s": 0.0, "drained": True, "gap_s": 0.3, "in_flight": 0, "load_s": 0.2}
        },
        "warm": {},
        "not_serving_now": {},
    }
    ssh.reply(([HELLO, GENERATIONS + json.dumps([row])], "", 0))
    done = cli("generations", str(path), "--host", "box2", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == [row]
    assert ssh.argvs()[0][-1] == agent_command("generations")
    assert request_of(ssh.calls()[0]) == AgentRequest(PROTOCOL, "box2")
    ssh.record.unlink()
    done = cli("generations", str(path), "--host", "box2")
    assert done.exit_code == 0, done.output
    assert "generations of box2" in done.stdout and "health passed" in done.stdout


# --- the real agent at the far end ----------------------------------------------------------------

_SYSTEMCTL = """#!/bin/sh
# systemctl: the fleet unit is loaded and done (or not there before the first run).
echo "$@" >> {record}
if [ -e {state} ]; then cat {state}; exit 0; fi
printf 'ActiveState=inactive\\nSubState=dead\\nLoadState=not-found\\n'
"""

_SYSTEMD_RUN = """#!{python}
# systemd-run: plays the unit at once. What the real one writes: its progress and its outcome.
import json, os, sys
argv = sys.argv[1:]
with open({record!r}, "a") as fh:
    fh.write(json.dumps(argv) + "\\n")
# The unit takes no argument: its directory is the agent's, its host the run's record's.
[d] = [a.split("=", 2)[2] for a in argv if a.startswith("--setenv=LLAMANIX_FLEET_DIR=")]
host = json.load(open(os.path.join(d, "run.json")))["host"]
with open(os.path.join(d, "run.log"), "a") as fh:
    fh.write(host + ": switching chat via systemd\\n  gate health chat: passed: health ok")
outcome = {{"host": host, "result": "passed", "generation": 1, "changed": ["chat"]}}
with open(os.path.join(d, "outcome.json"), "w") as fh:
    json.dump(outcome, fh)
with open({state!r}, "w") as fh:
    fh.write("ActiveState=active\\nSubState=exited\\nResult=success\\nLoadState=loaded\\n")
"""


@pytest.fixture
def far_end(ssh: Ssh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """ssh runs the command here: sudo runs the rest of its argv, llamanix is this checkout,
    systemctl and systemd-run are stand-ins; the agent's directory is under tmp_path."""
    bin_dir = ssh.bin_dir
    write = {
        "sudo": '#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n',
        "llamanix": f'#!/bin/sh\nexec {sys.executable} -m llamanix "$@"\n',
        "systemctl": _SYSTEMCTL.format(
            record=tmp_path / "systemctl.log", state=tmp_path / "unit-state"
        ),
        "systemd-run": _SYSTEMD_RUN.format(
            python=sys.executable,
            record=str(tmp_path / "systemd-run.jsonl"),
            state=str(tmp_path / "unit-state"),
        ),
    }
    for name, text in write.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tools"))
    fleet_dir = tmp_path / "agent"
    monkeypatch.setenv(fleet_agent.DIR_ENV, str(fleet_dir))
    yield fleet_dir


def test_the_real_agent_keeps_its_copy_and_starts_the_unit(
    tmp_path: Path, ssh: Ssh, far_end: Path
) -> None:
    kind = "systemd" if os.geteuid() == 0 else "systemd-user"  # what the agent runs as here
    path = write_config(tmp_path, kind)
    done = cli("switch", str(path), "--host", "box2", "--set", "instances.chat.context=2048")
    assert done.exit_code == 0, done.output
    assert "box2: switching chat via systemd" in done.stdout
    assert "box2:   gate health chat: passed: health ok" in done.stdout
    # Its copy: the text received, but its own host has no target there (it is local).
    copy = (far_end / "llamanix.toml").read_text()
    assert copy == path.read_text().replace('target = "admin@box2"  # over ssh\n', "")
    assert "# the fleet" in copy and "context = 2048" in copy
    assert tomllib.loads(copy)["hosts"]["box2"].get("target") is None
    assert stat.S_IMODE(far_end.stat().st_mode) == 0o700
    [unit] = [
        json.loads(line) for line in (tmp_path / "systemd-run.jsonl").read_text().splitlines()
    ]
    user = ["--user"] if kind == "systemd-user" else []
    assert unit[: unit.index("--") + 1] == [
        *user,
        "--unit=llamanix-fleet",
        "--description=llamanix fleet switch of box2",
        "--property=Type=exec",
        "--property=RemainAfterExit=yes",
        "--property=StandardOutput=journal",
        "--property=StandardError=journal",
        f"--setenv={fleet_agent.DIR_ENV}={far_end}",
        f"--setenv=PYTHONPATH={ROOT / 'tools'}",
        "--quiet",
        "--",
    ]
    assert unit[unit.index("--") + 1 :] == [
        # Stopped once it ran --run-timeout (SIGTERM, then SIGKILL 30 s later).
        "timeout", "--kill-after=30", "900",
        # No argument: what it runs is in the run's record, beside the options.
        sys.executable, "-m", "llamanix", "fleet-agent", "unit-switch",
    ]  # fmt: skip
    record = json.loads((far_end / "run.json").read_text())
    assert (record["op"], record["host"], record["config_format"]) == ("switch", "box2", "toml")
    # The options the unit's switch runs with, kept beside the copy for it.
    kept = json.loads((far_end / "switch-options.json").read_text())
    assert SwitchOptions.from_json(kept, "options") == SwitchOptions()
    # The next call finds the last run's unit ended: reported already, so only stopped and
    # forgotten before the next one starts.
    status = remote.remote_status(
        remote.remote_host(load_config(path), "box2"),  # type: ignore[arg-type]
        120.0,
        Runner(echo=lambda _: None),
        lambda _: None,
    ).summary()
    assert status.startswith("fleet switch of box2 started ") and status.endswith(
        ": passed, generation 1"
    )


def test_the_real_agent_refuses_another_protocol(
    tmp_path: Path, ssh: Ssh, far_end: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "PROTOCOL", PROTOCOL + 1)
    path = write_config(tmp_path)
    done = cli("generations", str(path), "--host", "box2")
    assert done.exit_code == 2
    assert one_line_error(done) == (
        f"box2: llamanix {__version__} on admin@box2 speaks fleet protocol {PROTOCOL}, this "
        f"one {PROTOCOL + 1}; "
        "upgrade it there: sudo /opt/llamanix/bin/pip install --upgrade ./llamanix"
    )


def test_the_real_agent_with_no_runs_yet(tmp_path: Path, ssh: Ssh, far_end: Path) -> None:
    rh = remote.remote_host(load_config(write_config(tmp_path)), "box2")
    assert rh is not None
    runner = Runner(echo=lambda _: None)
    assert remote.remote_generations(rh, runner) == []
    status = remote.remote_status(rh, 120.0, runner, lambda _: None)
    assert status.summary() == "no fleet switch or rollback has run there yet"


def test_the_agent_drops_the_target_from_a_json_config_too(tmp_path: Path) -> None:
    text = json.dumps(
        {"hosts": {"box2": {"kind": "systemd", "target": "a@b"}, "box3": {"target": "c@d"}}}
    )
    local = fleet_agent.local_text(text, "box2", "json", tmp_path / "llamanix.json")
    assert json.loads(local)["hosts"] == {"box2": {"kind": "systemd"}, "box3": {"target": "c@d"}}


def test_a_run_record_that_does_not_read_is_one_line_naming_it(
    tmp_path: Path, ssh: Ssh, far_end: Path
) -> None:
    """Never "no run yet": a record the agent cannot read might hide a run that goes on."""
    rh = remote.remote_host(load_config(write_config(tmp_path)), "box2")
    assert rh is not None
    far_end.mkdir(mode=0o700)
    (far_end / "run.json").write_text('{"op": "switch", "run": ')
    with pytest.raises(UserError) as err:
        remote.remote_status(rh, 120.0, Runner(echo=lambda _: None), lambda _: None)
    assert str(err.value) == (
        f"box2: admin@box2: {far_end / 'run.json'}: not a fleet run's record: JSON syntax "
        "error at line 1, column 25: Expecting value (see `systemctl status llamanix-fleet` "
        "there, then remove the file)"
    )


# --- docs/fleet.md's examples, run ----------------------------------------------------------------

DOC = ROOT / "docs" / "fleet.md"


def doc_section(name: str) -> str:
    text = DOC.read_text()
    return text[text.index(f"<!-- {name}:begin -->") : text.index(f"<!-- {name}:end -->")]


def doc_console(section: str) -> tuple[list[str], list[str]]:
    """The command of the section's console block (its ``\\`` continuations joined), and the
    lines it shows."""
    block = "$ " + section.split("```console\n$ ", 1)[1].split("\n```", 1)[0]
    lines = block.splitlines()
    command = lines[0].removeprefix("$ ")
    while command.endswith("\\"):
        lines.pop(0)
        command = command[:-1] + lines[0].strip()
    return shlex.split(command), lines[1:]


def doc_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The doc's fleet.toml, in a flake directory that is the current one."""
    toml = doc_section("dry-run").split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "fleet.toml").write_text(toml)
    (tmp_path / "flake.nix").write_text("{ }\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "fleet.toml"


def test_the_docs_dry_run_is_what_the_command_prints(
    tmp_path: Path, ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc_fleet(tmp_path, monkeypatch)
    argv, shown = doc_console(doc_section("dry-run"))
    assert argv[:2] == ["llamanix", "switch"]
    done = cli(*argv[1:])
    assert done.exit_code == 0, done.output
    # The flake directory as the docs test shows it: the directory the command runs in.
    assert done.output.replace(str(tmp_path), ".").splitlines() == shown
    assert ssh.calls() == []


def refused_replies() -> list[tuple[list[str], str, int]]:
    """What box2 and box3 answer in the doc's refused example: no runs yet; box2's switch
    passes (generation 3 to 4); box3's sudo asks for a password; box2's rollback to 3."""
    none = RunReport(None).line()
    passed = HostOutcome(
        "box2", "passed", 4, changed=["chat2"],
        gates=[GateResult("chat2", "health", True, "health ok")], previous=3,
        out_of_service_s=6.2,
    )  # fmt: skip
    switched = RunReport("switch", "6f1c", "box2", "2025-06-01T10:00:00+00:00", "active", True)
    back = RunReport(
        "rollback", "9a2e", "box2", "2025-06-01T10:00:09+00:00", "active", True,
        HostOutcome("box2", "passed", 3, previous=4, out_of_service_s=5.8),
    )  # fmt: skip
    return [
        ([HELLO, none], "", 0),
        ([HELLO, none], "", 0),
        (
            [
                HELLO, started_line("6f1c"), "box2: switching chat2 via systemd",
                "  restart chat2: gap 5.71 s, load 5.64 s, drained in 0.01 s",
                "  gate health chat2: passed: health ok", replace(switched, outcome=passed).line(),
            ],
            "", 0,
        ),
        ([], "sudo: a password is required\n", 1),
        (
            [
                HELLO, started_line("9a2e"), "box2: rolling back to generation 3 via systemd",
                back.line(),
            ],
            "", 0,
        ),
    ]  # fmt: skip


def test_the_docs_table_after_a_refused_host_is_what_the_command_prints(
    tmp_path: Path, ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = doc_fleet(tmp_path, monkeypatch)
    before = config.read_text()
    argv, shown = doc_console(doc_section("refused"))
    ssh.reply(*refused_replies())
    done = cli(*argv[1:])
    assert done.exit_code == 1, done.output
    assert done.output.splitlines() == shown
    assert config.read_text() == before  # the canary's change undone here too


def test_switch_host_all_ends_with_its_table_when_a_host_is_unreachable(
    tmp_path: Path, ssh: Ssh
) -> None:
    """--host all is a rollout: an unreachable host is a row of the table, not the end of the
    command before any summary."""
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[hosts.box2]\nkind = "systemd"\ntarget = "admin@box2"\n'
        'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
        '[hosts.box3]\nkind = "systemd"\ntarget = "admin@box3"\n'
        'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
        '[instances.a]\nhost = "box2"\nmodel = "/m.gguf"\nport = 8080\n'
        '[instances.b]\nhost = "box3"\nmodel = "/m.gguf"\nport = 8081\n'
    )
    ssh.reply(
        ([HELLO, RunReport(None).line()], "", 0),
        ([], "ssh: connect to host box3 port 22: No route to host\n", 255),
    )
    done = cli("switch", str(path), "--host", "all", "--set", "instances.a.context=2048")
    assert done.exit_code == 1, done.output
    assert len(ssh.calls()) == 2  # the two questions, and no switch
    table = done.stdout[done.stdout.index("rolling switch") :]
    assert re.search(r"│ box2 │ -\s+│ untouched\s+│", table), table
    assert re.search(r"│ box3 │ -\s+│ unreachable │ .*No route to host", table), table


def test_the_deadlines_given_reach_the_agent_with_the_options(tmp_path: Path, ssh: Ssh) -> None:
    path = write_config(tmp_path)
    ssh.reply(([HELLO, started_line("r1"), outcome_line()], "", 0))
    done = cli(
        "switch", str(path), "--host", "box2", "--run-timeout", "300", "--follow-timeout", "30"
    )
    assert done.exit_code == 0, done.output
    sent = order_of(ssh.calls()[0]).options
    assert (sent.run_timeout_s, sent.follow_timeout_s, sent.follow_s) == (300.0, 30.0, 30.0)


def test_the_docs_sudoers_line_is_the_one_llamanix_suggests() -> None:
    """docs/fleet.md and docs/debian.md install the line a password prompt's error names:
    the agent's commands, each as a controller runs it, and no wildcard."""
    line = remote.sudoers_line("admin")
    assert "*" not in line
    for doc in ("fleet.md", "debian.md"):
        text = (ROOT / "docs" / doc).read_text()
        shown = [ln for ln in text.splitlines() if "NOPASSWD" in ln and ln.startswith("echo ")]
        assert shown == [f"echo '{line}' | sudo tee /etc/sudoers.d/llamanix"], doc
