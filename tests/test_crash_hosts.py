"""Every step of a systemd host's restart is a crash point, on a real host (Debian 13 in CI,
see below; systemd as PID 1): a switch killed with SIGKILL at each step of the plain restart,
the warm save and restore, and the blue-green handover leaves what ``llamanix doctor`` names,
one by one, and ``llamanix tidy`` removes all of it and serves the current generation again. A
Ctrl-C and a failing tool in the middle of a blue-green handover stop the bridge. And one
lock per machine: a local switch and the fleet agent's switch of the same units take turns.

The crashes share one booted host, and one after the other: each case starts from what the
tidy of the one before left (the current generation serving), which is itself what the tidy
must achieve. They run on Debian 12 and 13 (systemd 252 and 257), the versions users run;
``LLAMANIX_CRASH_HOSTS=debian13`` runs one of them. The killed command is a real
``llamanix switch`` that sends itself SIGKILL at the step ``LLAMANIX_TEST_CRASH_AT`` names
(llamanix.state.crash_point).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import HOST_FIGURES
from hostbed import (
    CONFIG,
    UNITS,
    chat,
    complete,
    config_text,
    generations,
    slow_script,
    write_config,
)

from llamanix.external.container import nsenter_argv
from llamanix.fleet.protocol import PROTOCOL, AgentRequest, RunReport, SwitchOrder
from llamanix.state.crash_point import (
    CRASH_ENV,
    CRASH_HOW_ENV,
    RESTART_POINTS,
    CrashHow,
    CrashPoint,
)
from llamanix.switch.switch_records import SwitchOptions
from llamanix.testbed import hosts
from llamanix.testbed.hosts import Host

pytestmark = [pytest.mark.server, pytest.mark.hosts]

CRASH_HOSTS = tuple(os.environ.get("LLAMANIX_CRASH_HOSTS", "debian12,debian13").split(","))
ON_CRASH_HOSTS = pytest.mark.parametrize("host", CRASH_HOSTS, indirect=True, scope="module")

UNIT = "llamanix-chat.service"
PORT = 8095
STATE = "/etc/llamanix/.llamanix-state/box"
# Reachable from other machines (so its restarts are fenced, and it can switch blue-green),
# open on purpose (a key changes nothing a crash leaves), and warm (so its restarts save and
# restore its slot).
PUBLIC = 'listen = "0.0.0.0"\nkeyless = true\n'
TEXT = config_text(PORT, extra=PUBLIC + "warm_switch = true\n")
FLEET_COPY = "/var/lib/llamanix/fleet/llamanix.toml"
SLOW = "/usr/local/bin/llama-server-slow"

F = "leftover-fence"
R = "leftover-redirect"
B = "leftover-bridge"
BF = "leftover-bridge-files"
S = "leftover-slot-files"
P = "leftover-pending"
D = "unit-differs"
N = "unit-not-running"

# What doctor finds after a kill at each step: the unit file is already the new one at every
# step (the restart comes after the units are installed), and the killed switch's generation
# is "pending".
EXPECTED: dict[CrashPoint, set[str]] = {
    "restart:fenced": {F, D, P},
    "warm:saved": {F, S, D, P},
    "restart:stopped": {F, S, D, N, P},
    "restart:started": {F, S, D, P},
    "warm:restored": {F, S, D, P},
    "blue-green:bridge-written": {B, D, P},
    "blue-green:bridge-serving": {R, B, BF, D, P},
    "blue-green:redirected": {R, B, BF, D, P},
    "blue-green:fenced": {F, R, B, BF, D, P},
    "blue-green:old-stopped": {F, R, B, BF, D, N, P},
    "blue-green:unit-serving": {F, R, B, BF, D, P},
    # The bridge's port is fenced now, the unit's not.
    "blue-green:port-back": {F, R, B, BF, D, P},
    # The bridge is stopped: its unit file, tables and directories are left.
    "blue-green:bridge-stopped": {F, R, B, BF, D, P},
}
LEFTOVER_CODES = {F, R, B, BF, S, P, D, N, "leftover-staging", "leftover-temporary-file"}
_ROUNDS = itertools.count(1)


def test_every_restart_step_is_a_crash_point_here() -> None:
    assert sorted(EXPECTED) == sorted(RESTART_POINTS)


def run(
    host: Host, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """llamanix as root inside the host (with the crash hook's variables in ``env``)."""
    return host.run([hosts.LLAMANIX, *args], env=env, check=False, timeout_s=300)


def leftovers(host: Host) -> tuple[list[str], dict[str, Any]]:
    """The leftover codes doctor reports (sorted), and its whole report."""
    done = run(host, "doctor", CONFIG, "--json")
    report = json.loads(done.stdout)
    codes = sorted(
        f["code"]
        for f in report["findings"]
        if f["code"] in LEFTOVER_CODES or "leftover" in f["code"]
    )
    return codes, report


def current(host: Host, rows: list[dict[str, object]] | None = None) -> int:
    return next(int(str(r["number"])) for r in rows or generations(host) if r["current"])


def serves_current(host: Host, rows: list[dict[str, object]] | None = None) -> None:
    """The unit runs the current generation's unit file, and answers."""
    number = current(host, rows)
    recorded = host.path(f"{STATE}/generations/{number}/files/{UNIT}").read_text()
    assert host.path(f"{UNITS}/{UNIT}").read_text() == recorded
    state = host.run(["systemctl", "is-active", UNIT], check=False).stdout.strip()
    assert state == "active", host.run(["systemctl", "status", UNIT], check=False).stdout
    assert chat(host, PORT) == "200"


@dataclass
class Bed:
    host: Host
    generation: int  # the generation that serves, as the bed began


@pytest.fixture(scope="module")
def bed(host: Host) -> Iterator[Bed]:
    write_config(host, TEXT)
    done = run(host, "switch", CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr
    yield Bed(host, current(host))


def killed_switch(
    host: Host, point: CrashPoint, how: CrashHow = "kill"
) -> subprocess.CompletedProcess[str]:
    """A switch that changes the instance's environment (a restart, warm), killed (or
    interrupted, or failing) at ``point``."""
    if point.startswith(("warm:", "restart:")):
        # A slot with a cache, for the warm save.
        status, _ = complete(host, PORT, " ".join(["word"] * 40))
        assert status == "200", status
    argv = [
        "switch",
        CONFIG,
        "--set",
        f'instances.chat.environment.LLAMANIX_ROUND="{next(_ROUNDS)}"',
    ]
    if point.startswith("blue-green:"):
        argv.append("--blue-green")
    return run(host, *argv, env={CRASH_ENV: point, CRASH_HOW_ENV: how})


@ON_CRASH_HOSTS
@pytest.mark.parametrize("point", list(EXPECTED))
def test_a_switch_killed_in_a_restart_leaves_what_doctor_names_and_tidy_removes(
    bed: Bed, point: CrashPoint
) -> None:
    host = bed.host
    took: dict[str, float] = {}
    started = time.monotonic()
    killed = killed_switch(host, point)
    took["kill"] = time.monotonic() - started
    assert killed.returncode in (-9, 137), killed.stdout + killed.stderr

    codes, report = leftovers(host)
    took["doctor"] = time.monotonic() - started - sum(took.values())
    assert set(codes) == EXPECTED[point], json.dumps(report["findings"], indent=1)
    assert report["checks"]["leftovers"] == "finding"
    named = len(codes)

    tidy = run(host, "tidy", CONFIG)
    took["tidy"] = time.monotonic() - started - sum(took.values())
    assert tidy.returncode == 0, tidy.stdout + tidy.stderr
    assert f"box: generation {bed.generation} is current, serving" in tidy.stdout, tidy.stdout

    codes, report = leftovers(host)
    assert codes == [] and report["checks"]["leftovers"] == "ok", report["findings"]
    rows = generations(host)
    assert current(host, rows) == bed.generation
    serves_current(host, rows)
    verdicts = [r["gate"]["result"] for r in rows]  # type: ignore[index]
    assert verdicts[-1] == "interrupted" and "pending" not in verdicts, verdicts
    took["check"] = time.monotonic() - started - sum(took.values())
    HOST_FIGURES.append(
        f"{host.spec.name}: killed at {point}: {named} leftovers named and tidied in "
        f"{time.monotonic() - started:.1f}s ("
        + ", ".join(f"{k} {v:.1f}s" for k, v in took.items())
        + ")"
    )


@ON_CRASH_HOSTS
def test_a_rollback_after_a_killed_restart_lifts_its_fence(bed: Bed) -> None:
    """rollback, too, removes what a killed switch left with the units before it changes
    them: the fence that would keep refusing other machines while the host looks healthy."""
    host = bed.host
    killed = killed_switch(host, "restart:fenced")
    assert killed.returncode in (-9, 137), killed.stdout + killed.stderr
    assert F in leftovers(host)[0]
    done = run(host, "rollback", CONFIG, "--to", str(bed.generation))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lifted the fence a killed switch left on port {PORT}" in done.stdout, done.stdout
    codes, report = leftovers(host)
    assert codes == [] and report["checks"]["leftovers"] == "ok", report["findings"]
    serves_current(host)


@ON_CRASH_HOSTS
def test_a_ctrl_c_in_a_blue_green_handover_stops_the_bridge(bed: Bed) -> None:
    """SIGINT while the port is handed to the bridge: the switch stops (exit 130), and takes
    the bridge, its tables, its unit file and its directories with it."""
    host = bed.host
    done = killed_switch(host, "blue-green:redirected", "interrupt")
    assert done.returncode == 130, done.stdout + done.stderr
    assert "stopped by SIGINT" in done.stderr
    bridge = host.run(
        ["systemctl", "show", "llamanix-chat-bridge.service", "-p", "ActiveState"], check=False
    ).stdout
    assert bridge.strip() == "ActiveState=inactive", bridge
    codes, report = leftovers(host)
    # Only what a Ctrl-C does not undo: the switch's record, and the unit file it installed.
    assert set(codes) == {D, P}, report["findings"]
    assert run(host, "tidy", CONFIG).returncode == 0
    serves_current(host)


@ON_CRASH_HOSTS
def test_a_tool_failing_in_a_blue_green_handover_stops_the_bridge(bed: Bed) -> None:
    """A failing tool (an ExternalCommandError) once the unit serves again: the bridge goes,
    the gate fails, and the previous generation is restored: nothing is left."""
    host = bed.host
    done = killed_switch(host, "blue-green:unit-serving", "fail")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed here on purpose" in done.stdout, done.stdout
    assert "previous generation serving again" in done.stdout + done.stderr, done.stdout
    codes, report = leftovers(host)
    assert codes == [] and report["checks"]["leftovers"] == "ok", report["findings"]
    serves_current(host)


def _units_locked(host: Host, within_s: float = 60) -> str:
    """Until a command holds this machine's units lock; the holder's record."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done = host.run(["sh", "-c", "cat /run/llamanix/units-*.lock"], check=False)
        if '"pid"' in done.stdout:
            return done.stdout
        time.sleep(0.2)
    raise AssertionError(f"no command took the units lock within {within_s}s")


@ON_CRASH_HOSTS
def test_a_local_switch_and_the_fleet_agents_take_turns(bed: Bed) -> None:
    """The fleet agent's copy of the config and /etc/llamanix/llamanix.toml name the same unit:
    while the agent's switch runs (its server slow to start), the local switch refuses in one
    line, and with --wait it waits for its turn; each writes the unit once."""
    host = bed.host
    host.write(SLOW, slow_script("/usr/local/bin/llama-server", 6), mode=0o755)
    fleet = config_text(PORT, binary=SLOW, extra=PUBLIC).replace(
        'kind = "systemd"\n', 'kind = "systemd"\ntarget = "admin@box"\n', 1
    )
    # What the controller sends on ssh's stdin: here from a file.
    order = SwitchOrder("toml", fleet, SwitchOptions())
    request = AgentRequest(PROTOCOL, "box", order=order).text()
    host.write("/root/order.json", request, mode=0o600)
    before = len(generations(host))
    argv = [hosts.LLAMANIX, "fleet-agent", "switch"]
    with host.path("/root/order.json").open() as stdin:
        agent = subprocess.Popen(
            nsenter_argv(host.pid, argv), stdin=stdin, stdout=subprocess.PIPE, text=True
        )
    try:
        holder = _units_locked(host)
        assert FLEET_COPY in holder, holder
        refused = run(host, "switch", CONFIG, "--set", "instances.chat.context=2048")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            f"{CONFIG}: this machine's units in {UNITS} are being switched by pid "
        ), lines
        assert f"for {FLEET_COPY} (since " in lines[0] and "--wait SECONDS" in lines[0], lines
        assert len(generations(host)) == before
        started = time.monotonic()
        waited = run(
            host, "switch", CONFIG, "--set", "instances.chat.context=2048", "--wait", "120"
        )
        waited_s = time.monotonic() - started
    finally:
        out, _ = agent.communicate(timeout=300)
    report = RunReport.parse(out.splitlines()[-1])
    assert report is not None and report.outcome is not None, out
    assert report.outcome.result == "passed", out
    # The local switch went once the agent's was done, and its unit is the one installed.
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert len(generations(host)) == before + 1
    unit = host.path(f"{UNITS}/{UNIT}").read_text()
    assert "-c 2048" in unit and SLOW not in unit, unit[:600]
    # The agent's switch wrote its own generation once (the units it found, then its own).
    agent_current = host.path("/var/lib/llamanix/fleet/.llamanix-state/box/current")
    assert int(agent_current.read_text()) == report.outcome.generation
    assert chat(host, PORT) == "200"
    HOST_FIGURES.append(
        f"{host.spec.name}: a local switch waited {waited_s:.1f}s for the fleet agent's switch "
        "of the same units"
    )
