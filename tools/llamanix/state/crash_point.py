"""A test hook: named points where switch and rollback can be killed on purpose.

``crash_point("switch:activated")`` does nothing, unless the environment variable
``LLAMANIX_TEST_CRASH_AT`` names that point: then the process sends itself SIGKILL there. A
real kill at a random moment would test a different point on every run; a named point makes
each crash of tests/test_crash_consistency.py and tests/test_crash_hosts.py happen at exactly
the step it is about, with the same abrupt end (no ``finally``, no ``atexit``, no flushing) as
a kill from outside. ``LLAMANIX_TEST_CRASH_HOW`` picks another end at the same point:
``interrupt`` sends the process SIGINT (a Ctrl-C: its ``finally`` blocks run), ``fail`` raises
the error a failing tool raises (``ExternalCommandError``). Nothing but the tests sets them.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from llamanix.core.errors import ExternalCommandError
from llamanix.external.signals import interrupt_this_process, kill_this_process

CRASH_ENV = "LLAMANIX_TEST_CRASH_AT"
CRASH_HOW_ENV = "LLAMANIX_TEST_CRASH_HOW"
CrashHow = Literal["kill", "interrupt", "fail"]
CRASH_HOWS: tuple[CrashHow, ...] = get_args(CrashHow)

# Every named point, in the order a switch (and then a rollback) reaches them.
CrashPoint = Literal[
    # A new generation's directory is complete under its temporary name, not yet renamed.
    "generation:before-rename",
    # The new generation is recorded (gate "pending"); the config is not yet written.
    "switch:staged",
    # The config holds the change; nothing is installed yet.
    "switch:config-written",
    # --- a systemd host's restart of one changed server (hosts.restarts), its unit file
    # already the new one:
    # its port is fenced; it is not yet drained.
    "restart:fenced",
    # (warm_switch) its slots' caches are saved to files; it still runs.
    "warm:saved",
    # it was sent SIGTERM; its unit is not yet started again.
    "restart:stopped",
    # its unit serves again; the caches are not yet restored, the fence is still up.
    "restart:started",
    # (warm_switch) the caches are restored into the new server; their files not yet deleted.
    "warm:restored",
    # --- the same restart blue-green (hosts.blue_green):
    # the bridge's runtime unit file is written; nothing else.
    "blue-green:bridge-written",
    # the bridge serves, the port's connections are followed; nothing is redirected yet.
    "blue-green:bridge-serving",
    # new connections from other machines go to the bridge.
    "blue-green:redirected",
    # the old server's port is fenced too; it is not yet drained.
    "blue-green:fenced",
    # the old server was sent SIGTERM; its unit is not yet started again.
    "blue-green:old-stopped",
    # the unit serves again; the port is still redirected and fenced.
    "blue-green:unit-serving",
    # the port is back on the unit; the bridge is fenced, not yet drained nor stopped.
    "blue-green:port-back",
    # the bridge is stopped; its tables, unit file and directories are not yet removed.
    "blue-green:bridge-stopped",
    # --- after activation:
    # The manager installed and started the new units; the gate has not run.
    "switch:activated",
    # Every gate passed; the generation is not yet recorded as passed nor made current.
    "switch:gate-passed",
    # A gate failed and the config is back; the previous units are not yet restored.
    "switch:restoring",
    # rollback wrote the target's config; the target's units are not yet installed.
    "rollback:config-written",
    # rollback installed and started the target's units; ``current`` not yet moved.
    "rollback:activated",
]
CRASH_POINTS: tuple[CrashPoint, ...] = get_args(CrashPoint)
# The points inside a systemd host's restart (tests/test_crash_hosts.py, on the host bed);
# the others are reached under `llamanix up` too (tests/test_crash_consistency.py).
RESTART_POINTS: tuple[CrashPoint, ...] = tuple(
    p for p in CRASH_POINTS if p.split(":")[0] in ("restart", "warm", "blue-green")
)


def crash_point(name: CrashPoint) -> None:
    if os.environ.get(CRASH_ENV) != name:
        return
    how = os.environ.get(CRASH_HOW_ENV) or "kill"
    if how == "interrupt":
        interrupt_this_process()
    elif how == "fail":
        raise ExternalCommandError(f"{name}: failed here on purpose ({CRASH_HOW_ENV}=fail)")
    else:
        kill_this_process()
