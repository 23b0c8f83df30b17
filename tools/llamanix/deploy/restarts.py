"""Restarting a host's changed servers one at a time: drain, stop, start, and the gap.

The systemd manager restarts through this when a switch asks for it (``--drain-timeout``):
each changed server is drained (``llamanix.measure.drain``), then stopped at once by a signal
to its main process (a ``systemctl`` call would add tens of milliseconds in which a new
request can arrive and begin its answer), then started with its new unit. An ``AnswerWatch``
runs around each restart, so every instance gets its gap and load time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llamanix.deploy.gap_records import GapRecord
from llamanix.external import signals, systemctl
from llamanix.external.process import Runner
from llamanix.measure.drain import AnswerWatch, Drained, Endpoint, drain, gap_of

# After the manager's start returned (the unit's readiness check passed), how long the watch
# may take to see the new server's first answer.
FIRST_ANSWER_WAIT_S = 2.0


def instance_of(unit: str) -> str:
    return unit.removeprefix("llamanix-").removesuffix(".service")


@dataclass
class DrainingRestart:
    """Restarts units one by one; ``old``/``new``: where each instance answered before and
    answers after (by instance name); ``gaps`` fills as it goes."""

    old: Mapping[str, Endpoint]
    new: Mapping[str, Endpoint]
    drain_timeout_s: float
    gaps: dict[str, GapRecord] = field(default_factory=dict)

    def restart(self, runner: Runner, user: bool, units: Sequence[str]) -> bool:
        """Restart each of ``units``; False when one of them did not start."""
        ok = True
        for unit in units:
            ok = self._restart_one(runner, user, unit) and ok
        return ok

    def _restart_one(self, runner: Runner, user: bool, unit: str) -> bool:
        name = instance_of(unit)
        old, new = self.old.get(name), self.new.get(name)
        if old is None and new is None:
            # Not a server of the config's (the gateway, a router): restarted as it is.
            return systemctl.restart(runner, user, [unit], check=False)
        endpoints = [e for e in (old, new) if e is not None]
        endpoints = [e for i, e in enumerate(endpoints) if e not in endpoints[:i]]
        drained: Drained | None = None
        with AnswerWatch(endpoints) as watch:
            before = systemctl.show(user, unit)
            if old is not None and before.runs:
                drained = drain(old, self.drain_timeout_s)
                if before.main_pid is not None:
                    signals.signal_process(before.main_pid, signal.SIGTERM)
            ok = systemctl.restart(runner, user, [unit], check=False)
            after = systemctl.show(user, unit)
            started = after.main_started
            if ok and started is not None:
                deadline = time.monotonic() + FIRST_ANSWER_WAIT_S
                while time.monotonic() < deadline and not any(
                    t >= started for t in watch.answers()
                ):
                    time.sleep(0.01)
        if started is None:
            self.gaps[name] = _record(None, None, drained)
            return ok
        gap = gap_of(watch.answers(), started, drained)
        self.gaps[name] = _record(gap.gap_s, gap.load_s, drained)
        return ok


def _record(gap_s: float | None, load_s: float | None, drained: Drained | None) -> GapRecord:
    if drained is None:
        return GapRecord(gap_s, load_s)
    return GapRecord(gap_s, load_s, drained.waited_s, drained.idle, drained.in_flight)
