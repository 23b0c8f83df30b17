"""A test hook: named points where switch and rollback can be killed on purpose.

``crash_point("switch:activated")`` does nothing, unless the environment variable
``LLAMANIX_TEST_CRASH_AT`` names that point: then the process sends itself SIGKILL there. A
real kill at a random moment would test a different point on every run; a named point makes
each crash of tests/test_crash_consistency.py happen at exactly the step it is about, with
the same abrupt end (no ``finally``, no ``atexit``, no flushing) as a kill from outside.
Nothing but the tests sets the variable.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from llamanix.external.signals import kill_this_process

CRASH_ENV = "LLAMANIX_TEST_CRASH_AT"

# Every named point, in the order a switch (and then a rollback) reaches them.
CrashPoint = Literal[
    # A new generation's directory is complete under its temporary name, not yet renamed.
    "generation:before-rename",
    # The new generation is recorded (gate "pending"); the config is not yet written.
    "switch:staged",
    # The config holds the change; nothing is installed yet.
    "switch:config-written",
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


def crash_point(name: CrashPoint) -> None:
    if os.environ.get(CRASH_ENV) == name:
        kill_this_process()
