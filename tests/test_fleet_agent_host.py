"""The fleet agent on real hosts (systemd as PID 1, Debian 12 and 13): what runs at the far end
of ``ssh TARGET -- sudo -n llamanix fleet-agent ...``, run here as root inside the host with the
config and options on stdin (ssh itself is the fleet bed's: tests/test_fleet*.py).

A switch that passes, one whose gate fails and restores, and one whose agent is killed while
its transient unit runs: the unit finishes (here: restores) by itself, and the next ``status``
says how it ended, once.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import HOST_FIGURES
from hostbed import BROKEN, SERVER, chat, config_text, show, slow_script

from llamanix.fleet.protocol import (
    GENERATIONS,
    PROTOCOL,
    AgentRequest,
    RunReport,
    SwitchOrder,
    parse_started,
)
from llamanix.switch.switch_records import SwitchOptions
from llamanix.testbed import hosts
from llamanix.testbed.hosts import Host

pytestmark = [pytest.mark.server, pytest.mark.hosts]

PORT = 8090
FLEET = "/var/lib/llamanix/fleet"
UNIT = "llamanix-fleet.service"
SLOW_BROKEN = "/usr/local/bin/llama-server-slow-broken"
# A llama-server that takes a minute to start: a switch to it outlives short deadlines.
SLEEPY = "/usr/local/bin/llama-server-sleepy"


def fleet_config(binary: str = SERVER, kind: str = "systemd", port: int = PORT) -> str:
    """The controller's config: the host has a target there (the agent drops it)."""
    text = config_text(port, binary=binary, kind=kind)
    kind_line = f'kind = "{kind}"\n'
    return "# the fleet\n" + text.replace(
        kind_line, f'{kind_line}target = "admin@box"  # over ssh\n', 1
    )


def agent(
    host: Host, op: str, config: str | None = None, user: str | None = None
) -> tuple[subprocess.CompletedProcess[str], RunReport | None]:
    """``fleet-agent OP`` with its request on stdin (``config``: a switch's, ``order``)."""
    argv = [hosts.LLAMANIX, "fleet-agent", op]
    request = config or AgentRequest(PROTOCOL, "box").text()
    done = host.run(argv, input_text=request, user=user, check=False, timeout_s=300)
    lines = done.stdout.splitlines()
    report = RunReport.parse(lines[-1]) if lines else None
    return done, report


def order(config: str, opts: SwitchOptions | None = None) -> str:
    """What the controller hands the agent's switch on stdin: the request, with the config
    and the options."""
    switch_order = SwitchOrder("toml", config, opts or SwitchOptions())
    return AgentRequest(PROTOCOL, "box", order=switch_order).text()


def switch(host: Host, binary: str = SERVER) -> tuple[subprocess.CompletedProcess[str], RunReport]:
    done, report = agent(host, "switch", config=order(fleet_config(binary)))
    assert report is not None and report.outcome is not None, done.stdout + done.stderr
    return done, report


def test_a_switch_passes_and_the_host_keeps_its_copy(host: Host) -> None:
    started = time.monotonic()
    done, report = switch(host)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = report.outcome
    assert outcome is not None
    assert (outcome.result, outcome.generation, outcome.previous) == ("passed", 1, None)
    assert outcome.out_of_service_s is not None and outcome.out_of_service_s > 0
    assert "box: switching chat via systemd" in done.stdout
    assert "gate health chat: passed" in done.stdout
    assert any(parse_started(line) == report.run for line in done.stdout.splitlines())
    assert chat(host, PORT) == "200"
    # Its copy: the config received, with its own host's target left out (here it is local).
    copy = host.path(f"{FLEET}/llamanix.toml").read_text()
    assert copy == fleet_config().replace('target = "admin@box"  # over ssh\n', "")
    assert host.path(FLEET).stat().st_mode & 0o777 == 0o700
    assert not host.path(f"{FLEET}/llamanix.next.toml").exists()
    # The unit stays loaded once done (its result can be read), and says it succeeded.
    state = show(host, UNIT, "ActiveState", "SubState", "Result")
    assert state == {"ActiveState": "active", "SubState": "exited", "Result": "success"}
    listing = agent(host, "generations")[0].stdout.splitlines()[-1]
    assert listing.startswith(GENERATIONS) and '"number": 1, "current": true' in listing
    _, again = agent(host, "status")
    assert again is not None and again.reported and again.run == report.run
    HOST_FIGURES.append(
        f"{host.spec.name}: a fleet agent switch passed in {took:.1f}s, out of service "
        f"{outcome.out_of_service_s:.1f}s"
    )


def test_a_switch_whose_gate_fails_restores_and_keeps_the_old_copy(host: Host) -> None:
    switch(host)  # generation 1 serves (unchanged when the test before ran)
    before = host.path(f"{FLEET}/llamanix.toml").read_text()
    done, report = switch(host, binary=BROKEN)
    assert done.returncode == 1, done.stdout + done.stderr
    outcome = report.outcome
    assert outcome is not None and outcome.result == "failed"
    assert "did not start" in outcome.detail and "serving again" in outcome.detail, outcome
    assert outcome.previous == 1 and outcome.out_of_service_s is not None
    assert chat(host, PORT) == "200"
    # The copy is the one that serves: the failed text was never written over it.
    assert host.path(f"{FLEET}/llamanix.toml").read_text() == before
    assert not host.path(f"{FLEET}/llamanix.next.toml").exists()
    # The last run's unit was stopped and forgotten before this one started.
    assert f"$ systemctl stop {UNIT}" in done.stdout


def test_a_killed_agent_leaves_the_switch_to_finish_and_status_says_how(host: Host) -> None:
    switch(host)
    # Sleeps before it fails, so the agent is killed while the unit's switch is under way.
    host.write(SLOW_BROKEN, slow_script(BROKEN, 3), mode=0o755)
    host.write("/root/next.json", order(fleet_config(binary=SLOW_BROKEN)), mode=0o600)
    command = (
        f"{hosts.LLAMANIX} fleet-agent switch < /root/next.json > /root/agent.out 2>&1 & echo $!"
    )
    pid = host.sh(command).stdout.strip()
    deadline = time.monotonic() + 60
    while show(host, UNIT, "SubState")["SubState"] != "running":
        assert time.monotonic() < deadline, host.path("/root/agent.out").read_text()
        time.sleep(0.2)
    host.run(["kill", "-9", pid])
    killed_at = time.monotonic()
    # While the unit runs, another switch is refused in one line.
    done, report = agent(host, "switch", config=order(fleet_config()))
    assert done.returncode == 2 and report is None
    assert "still runs" in done.stderr and "fleet-agent status follows it" in done.stderr
    # status follows the run that still goes on to its end (what a controller does after it
    # lost the connection).
    done, report = agent(host, "status")
    finished_s = time.monotonic() - killed_at
    assert show(host, UNIT, "SubState")["SubState"] != "running"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "following the fleet switch of box started" in done.stdout
    assert "box: gate failed; restoring generation" in done.stdout
    out = host.path("/root/agent.out").read_text()
    assert "llamanix-fleet-outcome" not in out  # the killed agent never saw the end
    assert report is not None and report.outcome is not None and not report.reported
    assert report.outcome.result == "failed" and "serving again" in report.outcome.detail
    assert report.summary().endswith("(not reported before)")
    assert chat(host, PORT) == "200"  # restored by the unit alone
    _, again = agent(host, "status")
    assert again is not None and again.reported and again.run == report.run
    HOST_FIGURES.append(
        f"{host.spec.name}: with its agent killed, the fleet unit restored the previous "
        f"generation {finished_s:.1f}s later"
    )


def test_a_run_past_its_deadlines_is_left_to_go_on_then_stopped(host: Host) -> None:
    """--follow-timeout: the agent stops following a run that still goes on, and says so (the
    run goes on); --run-timeout: the run's unit is stopped once it ran that long, and status
    says why. The next switch tidies what it left and serves again."""
    switch(host)
    host.write(SLEEPY, f'#!/bin/sh\nsleep 60\nexec {SERVER} "$@"\n', mode=0o755)
    opts = SwitchOptions(run_timeout_s=10.0, follow_timeout_s=2.0)
    started = time.monotonic()
    done, report = agent(host, "switch", config=order(fleet_config(binary=SLEEPY), opts))
    followed = time.monotonic() - started
    assert report is not None and report.running and report.outcome is None, done.stdout
    assert "still runs after 2 s of following; it goes on by itself" in done.stdout
    assert show(host, UNIT, "SubState")["SubState"] == "running"
    deadline = time.monotonic() + 90
    while show(host, UNIT, "SubState")["SubState"] == "running":
        assert time.monotonic() < deadline, "the run was not stopped at its --run-timeout"
        time.sleep(0.2)
    _, ended = agent(host, "status")
    assert ended is not None and ended.run == report.run and ended.outcome is None
    assert ended.unit == "stopped: it ran past its --run-timeout", ended
    done, again = switch(host)
    assert done.returncode == 0 and again.outcome is not None, done.stdout + done.stderr
    assert chat(host, PORT) == "200"
    HOST_FIGURES.append(
        f"{host.spec.name}: the agent left a run after {followed:.1f}s of following (2 s asked)"
    )


def test_a_users_agent_switches_its_user_units(host: Host) -> None:
    """systemd-user: no sudo; the agent's directory is the user's, the unit the user's
    manager's."""
    port = PORT + 1
    config = fleet_config(kind="systemd-user", port=port)
    done, report = agent(host, "switch", config=order(config), user=hosts.USER)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report is not None and report.outcome is not None
    assert (report.outcome.result, report.outcome.generation) == ("passed", 1)
    home = f"/home/{hosts.USER}"
    copy = host.path(f"{home}/.local/state/llamanix/fleet/llamanix.toml")
    assert copy.read_text() == config.replace('target = "admin@box"  # over ssh\n', "")
    assert copy.stat().st_uid == host.uid_of(hosts.USER)
    state = show(host, UNIT, "ActiveState", "SubState", "Result", user=hosts.USER)
    assert state == {"ActiveState": "active", "SubState": "exited", "Result": "success"}
    assert chat(host, port) == "200"
