"""The fleet agent's sudo surface on real hosts: what the ssh user of a fleet may do as root
with the sudoers line docs/fleet.md gives, and nothing more (issue: the trust boundary).

Two hosts of the fleet bed (llamanix.testbed.fleet: box1 Debian 12 with sudo 1.9.13, box2
Debian 13 with sudo 1.9.16), reached from the controller over OpenSSH as ``admin``, a user
that is not root, whose sudoers file is exactly ``sudoers_line("admin")``. First the
controller's own commands go through that line (switch, rollback, generations, top); then
``admin`` tries each way around it that a wider line or a looser agent left open. Each is
refused, and nothing outside the agent's own state changes: every file under /etc, /usr,
/opt, /root and /srv is as it was (the sudoers files, the units, the files the attempts aim
at), and ``sudo -n -l`` lists what it listed.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_run import llamanix_argv
from conftest import HOST_FIGURES, REPO
from hostbed import tiny_fleet

from llamanix.external.process import Finished
from llamanix.fleet.protocol import PROTOCOL, AgentRequest, RunReport, SwitchOrder
from llamanix.fleet.remote import sudoers_line
from llamanix.switch.switch_records import RollbackOptions, SwitchOptions
from llamanix.testbed import hosts
from llamanix.testbed.fleet import ADMIN, Fleet

pytestmark = [pytest.mark.hosts]

NAMES: tuple[hosts.HostName, ...] = ("debian12", "debian13")
PORTS = {"box1": 18091, "box2": 18092}
CONFIG = "/root/fleet/llamanix.toml"
MODEL = f"{hosts.MODELS}/tiny.gguf"
SERVER = "/usr/local/bin/llama-server"
ADMIN_SUDOERS = f"/etc/sudoers.d/{ADMIN}"
# What the attempts aim at: a new file among sudo's, which sudo would read.
AIMED = "/etc/sudoers.d/zz-llamanix-escape"
# A host name that, written into a file sudo reads, is a sudoers line of its own.
INJECTED = f"\n{ADMIN} ALL=(ALL) NOPASSWD: ALL\n#"
EVIL = f"/home/{ADMIN}/evil"
# Where a host keeps what may not change (the agent's state, /var/lib/llamanix/fleet, may).
KEPT = ("/etc", "/usr", "/opt", "/root", "/srv")
MARKER = "/run/llamanix-escape-marker"
# The controller runs this checkout's llamanix.
CONTROLLER_ENV = {"PYTHONPATH": str(REPO / "tools")}


def fleet_config(context: int) -> str:
    text = ""
    for name in PORTS:
        text += (
            f'[hosts.{name}]\nkind = "systemd"\ntarget = "{ADMIN}@{name}"\n'
            f'binaries = {{ upstream = "{SERVER}" }}\n\n'
        )
    for name, port in PORTS.items():
        text += (
            f'[instances.chat-{name}]\nhost = "{name}"\nvariant = "upstream"\n'
            f'model = "{MODEL}"\nport = {port}\ncontext = {context}\nparallel = 1\n\n'
        )
    return text


def install_the_line(bed: Fleet, name: str, line: str | None = None) -> None:
    """admin's sudoers file: exactly the documented line (or ``line``), and no other file of
    sudo's than the host had."""
    host = bed.host(name)
    host.write(ADMIN_SUDOERS, (line or sudoers_line(ADMIN)) + "\n", mode=0o440)
    host.run(["rm", "-rf", AIMED])
    assert host.run(["visudo", "-c"], check=False).returncode == 0


@pytest.fixture(scope="module")
def bed(
    host_bed: None,
    tmp_path_factory: pytest.TempPathFactory,
    project_wheel: Path,
    llama_server_bin: Path,
) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet-sudo")
    with tiny_fleet(NAMES, work, project_wheel, llama_server_bin) as (booted, took):
        HOST_FIGURES.append(f"fleet of 2 (sudo) up and installed in {took:.0f}s")
        for name in booted.names:
            install_the_line(booted, name)
        path = booted.home / "fleet" / "llamanix.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fleet_config(1024))
        yield booted


@pytest.fixture(autouse=True)
def the_documented_line(bed: Fleet) -> Iterator[None]:
    """Each test starts, and ends, with the documented line alone: an escape one test makes
    does not carry over to the next."""
    for name in bed.names:
        install_the_line(bed, name)
    yield
    for name in bed.names:
        install_the_line(bed, name)


def llamanix(bed: Fleet, *args: str, timeout_s: float = 600) -> Finished:
    return bed.controller(llamanix_argv(*args), timeout_s=timeout_s, env=CONTROLLER_ENV)


def as_admin(bed: Fleet, name: str, argv: list[str], stdin: str | None = None) -> Finished:
    """``argv`` on ``name`` as admin over ssh (the remote shell gets it quoted, as a controller
    sends a command), ``stdin`` on its stdin."""
    return bed.controller(
        ["ssh", name, "--", shlex.join(argv)], input_text=stdin or "", timeout_s=120
    )


def agent_call(
    bed: Fleet,
    name: str,
    command: str,
    host: str,
    order: SwitchOrder | None = None,
    rollback: RollbackOptions | None = None,
) -> Finished:
    """``sudo -n llamanix fleet-agent COMMAND`` on ``name`` as admin, with a request of
    admin's making on its stdin."""
    request = AgentRequest(PROTOCOL, host, order=order, rollback=rollback).text()
    return as_admin(bed, name, ["sudo", "-n", "llamanix", "fleet-agent", command], request)


def sudo_list(bed: Fleet, name: str) -> str:
    return as_admin(bed, name, ["sudo", "-n", "-l"]).stdout


def sudoers_and_units(bed: Fleet, name: str) -> str:
    """Every file of sudo's and of the system manager's units: name, type, mode, owner and
    checksum."""
    script = (
        "find /etc/sudoers /etc/sudoers.d /etc/systemd/system -printf '%p %y %m %U\\n' | sort; "
        "find /etc/sudoers /etc/sudoers.d /etc/systemd/system -type f -print0 | sort -z "
        "| xargs -0 sha256sum"
    )
    return bed.host(name).sh(script).stdout


@contextmanager
def nothing_changes(bed: Fleet) -> Iterator[None]:
    """Around an attempt: on every host, nothing under KEPT is newer than before it, the
    sudoers files and the units are as they were, and admin's sudo lists what it listed and
    still asks a password for anything else. Checked even when the attempt's own assertions
    failed, so that a failure says what the attempt changed too."""
    before = {}
    for name in bed.names:
        bed.host(name).run(["touch", MARKER])
        before[name] = (sudoers_and_units(bed, name), sudo_list(bed, name))
    try:
        yield
    finally:
        changed = []
        for name in bed.names:
            host = bed.host(name)
            newer = host.run(["find", *KEPT, "-xdev", "-newer", MARKER], check=False).stdout
            if newer:
                changed.append(f"{name}: changed:\n{newer}")
            now = (sudoers_and_units(bed, name), sudo_list(bed, name))
            if now != before[name]:
                changed.append(f"{name}: sudo's files, the units or sudo -l:\n{now}")
            aimed = host.path(AIMED)
            if aimed.is_dir():
                changed.append(f"{name}: {AIMED} was made: {sorted(aimed.rglob('*'))}")
            elif aimed.exists():
                changed.append(f"{name}: {AIMED} was written:\n{aimed.read_text()}")
            still = as_admin(bed, name, ["sudo", "-n", "true"])
            if still.returncode == 0 or "password is required" not in still.stderr:
                changed.append(f"{name}: admin runs anything as root now: {still.stderr}")
        assert not changed, "\n".join(changed)


def refused(done: Finished, *words: str) -> None:
    assert done.returncode != 0, done.stdout + done.stderr
    for word in words:
        assert word in done.stderr, done.stdout + done.stderr


def serving_context(bed: Fleet, name: str) -> int | None:
    unit = f"llamanix-chat-{name}.service"
    host = bed.host(name)
    if host.run(["systemctl", "is-active", unit], check=False).stdout.strip() != "active":
        return None
    done = host.run(["systemctl", "show", "-p", "ExecStart", unit], check=False)
    argv = done.stdout.split("argv[]=", 1)[-1].split(" ;", 1)[0].split()
    return int(argv[argv.index("-c") + 1]) if "-c" in argv else None


# --- the controller's own commands, through the line ---------------------------------------------


def test_a_controller_switches_rolls_back_and_reads_through_the_line(bed: Fleet) -> None:
    started = time.monotonic()
    done = llamanix(bed, "switch", CONFIG, "--all-hosts", "--json")
    assert done.returncode == 0, done.stderr
    assert {r["host"]: r["verdict"] for r in json.loads(done.stdout)} == dict.fromkeys(
        PORTS, "passed"
    )
    sets = [a for n in PORTS for a in ("--set", f"instances.chat-{n}.context=2048")]
    done = llamanix(bed, "switch", CONFIG, *sets, "--hosts", "box1,box2", "--json")
    assert done.returncode == 0, done.stderr
    assert [serving_context(bed, n) for n in PORTS] == [2048, 2048]
    done = llamanix(bed, "generations", CONFIG, "--hosts", "box1,box2", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert {h: [g["number"] for g in gens] for h, gens in listed.items()} == {
        "box1": [1, 2],
        "box2": [1, 2],
    }, done.stdout
    done = llamanix(bed, "rollback", CONFIG, "--hosts", "box1,box2")
    assert done.returncode == 0, done.stderr
    assert [serving_context(bed, n) for n in PORTS] == [1024, 1024]
    done = llamanix(bed, "top", CONFIG, "--once", "--json")
    assert done.returncode == 0, done.stderr
    found = {h["host"]: h for h in json.loads(done.stdout)["hosts"]}
    assert {h: found[h]["state"] for h in PORTS} == dict.fromkeys(PORTS, "ok"), done.stdout
    HOST_FIGURES.append(
        f"switch, switch, generations, rollback, top of 2 hosts through the sudoers line: "
        f"{time.monotonic() - started:.1f}s"
    )


# --- the ways around it --------------------------------------------------------------------------


def _unit_commands_attempts(bed: Fleet, name: str) -> list[Finished]:
    """run.log in a directory of admin's, a link to a new file among sudo's and to admin's
    own sudoers file; the units' commands with that directory and a host name that carries a
    sudoers line."""
    link = as_admin(
        bed, name, ["sh", "-c", f"mkdir -p {EVIL}/b && ln -sfn {AIMED} {EVIL}/run.log && "
                    f"ln -sfn {ADMIN_SUDOERS} {EVIL}/b/run.log"]
    )  # fmt: skip
    assert link.returncode == 0, link.stderr
    llamanix_ = ["sudo", "-n", "llamanix", "fleet-agent"]
    tries = []
    for d in (EVIL, f"{EVIL}/b"):
        tries.append(
            as_admin(bed, name, [*llamanix_, "unit-switch", "--host", INJECTED, "--dir", d])
        )
        tries.append(
            as_admin(
                bed, name,
                [*llamanix_, "unit-switch", "--host", INJECTED, "--dir", d, "--format", "toml"],
            )
        )  # fmt: skip
        tries.append(
            as_admin(bed, name, [*llamanix_, "unit-rollback", "--host", INJECTED, "--dir", d])
        )
    tries.append(as_admin(bed, name, [*llamanix_, "unit-switch"]))
    tries.append(as_admin(bed, name, [*llamanix_, "unit-rollback"]))
    return tries


def test_the_units_commands_are_not_the_callers(bed: Fleet) -> None:
    """What a transient unit runs is not reachable through the line, with any --dir: sudo
    asks for a password it cannot get."""
    for name in bed.names:
        with nothing_changes(bed):
            for done in _unit_commands_attempts(bed, name):
                refused(done, "password is required")


def test_a_wildcard_line_from_before_still_cannot_reach_the_units_commands(bed: Fleet) -> None:
    """With the old `fleet-agent *` line still installed, the agent refuses by itself: the
    units' commands take no directory and no host, and run only in their unit."""
    old = f"{ADMIN} ALL=(root) NOPASSWD: /usr/local/bin/llamanix fleet-agent *"
    for name in bed.names:
        install_the_line(bed, name, old)
        with nothing_changes(bed):
            tries = _unit_commands_attempts(bed, name)
        for done in tries[:-2]:
            refused(done, "No such option '--host'")
        for done in tries[-2:]:
            refused(done, "runs only as the fleet's own unit llamanix-fleet.service")


STEERING: list[tuple[SwitchOptions, str]] = [
    (SwitchOptions(units_dir=Path("/etc/sudoers.d")), "options.units_dir: is not the caller's"),
    (SwitchOptions(manager="up", units_dir=Path(EVIL)), "options.manager: is not the caller's"),
    (SwitchOptions(manager="up"), "options.manager: is not the caller's"),
    (SwitchOptions(sets=("instances.chat-box1.port=22",)), "options.sets: is not the caller's"),
    (SwitchOptions(gate="bench", gate_prompts="/etc/shadow"), "options.gate_prompts: "),
]


def test_options_that_name_a_units_directory_or_a_manager_are_refused(bed: Fleet) -> None:
    text = fleet_config(1024)
    for name in bed.names:
        with nothing_changes(bed):
            for options, said in STEERING:
                order = SwitchOrder("toml", text, options)
                refused(agent_call(bed, name, "switch", name, order=order), said)
            for rb in ({"units_dir": "/etc/sudoers.d"}, {"manager": "up"}):
                opts = RollbackOptions.from_json(rb, "options")
                done = agent_call(bed, name, "rollback", name, rollback=opts)
                refused(done, "is not the caller's to choose")


def test_a_config_that_names_other_hosts_and_paths_is_refused(bed: Fleet) -> None:
    """The host the request names: a sudoers line, a path out of the agent's directory,
    another machine of the copy, a host of another kind."""
    for name in bed.names:
        with nothing_changes(bed):
            for bad in (INJECTED, f"../../../../../..{AIMED}"):
                text = fleet_config(1024).replace(f"[hosts.{name}]", f"[hosts.{json.dumps(bad)}]")
                text = text.replace(f'host = "{name}"', f"host = {json.dumps(bad)}")
                order = SwitchOrder("toml", text, SwitchOptions())
                refused(agent_call(bed, name, "switch", bad, order=order), "is not a host's name")
                for command in ("rollback", "generations", "top"):
                    done = agent_call(bed, name, command, bad, rollback=RollbackOptions())
                    refused(done, "is not a host's name")
            # box1's copy names box2 with its target: another machine, which box1's root
            # never reaches over ssh for admin.
            other = "box2" if name == "box1" else "box1"
            for command in ("rollback", "generations", "top"):
                done = agent_call(bed, name, command, other, rollback=RollbackOptions())
                refused(done, f"hosts.{other}.target: is another machine")
            for kind in ("systemd-user", "nixos"):
                text = fleet_config(1024).replace(
                    f'[hosts.{name}]\nkind = "systemd"', f'[hosts.{name}]\nkind = "{kind}"'
                )
                order = SwitchOrder("toml", text, SwitchOptions())
                done = agent_call(bed, name, "switch", name, order=order)
                refused(
                    done, f"hosts.{name}.kind: is '{kind}', but this fleet agent runs as root's"
                )


def test_arguments_and_environment_are_not_the_callers(bed: Fleet) -> None:
    """The line allows each command as it is: no argument, and no variable (sudo keeps none
    of the caller's environment)."""
    agent = ["sudo", "-n", "llamanix", "fleet-agent"]
    for name in bed.names:
        assert as_admin(bed, name, ["mkdir", "-p", EVIL]).returncode == 0
        evil_before = as_admin(bed, name, ["ls", "-lA", EVIL]).stdout
        with nothing_changes(bed):
            for extra in (
                ["status", "--follow-timeout", "1"],
                ["top", "--protocol", str(PROTOCOL), "--host", name],
                ["generations", name],
                ["switch", "--dir", EVIL],
            ):
                refused(as_admin(bed, name, [*agent, *extra]), "password is required")
            setenv = [*agent[:2], f"LLAMANIX_FLEET_DIR={EVIL}", *agent[2:], "status"]
            refused(as_admin(bed, name, setenv), "not allowed to set")
            kept = as_admin(
                bed, name, ["env", f"LLAMANIX_FLEET_DIR={EVIL}", *agent, "status"],
                AgentRequest(PROTOCOL, name).text(),
            )  # fmt: skip
            # sudo dropped it: the agent's own directory answered, and admin's is untouched.
            assert kept.returncode in (0, 1), kept.stderr
            assert RunReport.parse(kept.stdout.splitlines()[-1]) is not None, kept.stdout
        assert as_admin(bed, name, ["ls", "-lA", EVIL]).stdout == evil_before
