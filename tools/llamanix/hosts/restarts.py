"""Restarting a host's changed servers one at a time: fence, drain, save, stop, start, restore,
and the gap.

The systemd manager restarts through this when a switch asks for it (``--drain-timeout``). For
each changed server, in order:

1. its port is *fenced* (``external.nft``) where other machines reach it: new connections and
   new requests from them are refused, so a gateway or a router in front sends them to another
   replica, and no request can arrive between the drain's last look and the stop;
2. it is drained (``llamanix.server.drain``): the requests it has finish;
3. with ``warm_switch``, its slots' caches are saved (``hosts.warm``);
4. it is stopped at once by a signal to its main process (a ``systemctl`` call would add tens of
   milliseconds), and started with its new unit, whose start waits for the readiness check;
5. the caches are restored into the new server, and only then is the fence lifted.

An ``AnswerWatch`` runs around each restart, so every instance gets its gap and load time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from llamanix.core.errors import ExternalCommandError
from llamanix.external import nft, signals, systemctl
from llamanix.external.files import atomic_write
from llamanix.external.process import Runner
from llamanix.hosts.blue_green import RUNTIME_UNITS, Bridge, remove_bridge_directories
from llamanix.hosts.warm import WarmCaches
from llamanix.server.drain import (
    DRAIN_SETTLE_S,
    AnswerWatch,
    Drained,
    Endpoint,
    drain,
    gap_of,
    longest_silence,
)
from llamanix.state.crash_point import crash_point
from llamanix.state.gap_records import GapRecord

# After the manager's start returned (the unit's readiness check passed), how long the watch
# may take to see the new server's first answer.
FIRST_ANSWER_WAIT_S = 2.0
# Blue-green: once new connections go to the bridge, how long a connection the old server
# already has may take to deliver its request before the old port's fence refuses new ones (a
# client that connected just before the redirect sends its request a moment later).
HANDOVER_GRACE_S = 1.0


def instance_of(unit: str) -> str:
    return unit.removeprefix("llamanix-").removesuffix(".service")


@dataclass
class DrainingRestart:
    """Restarts units one by one; ``old``/``new``: where each instance (or the router)
    answered before and answers after, by name; ``fence_old``/``fence_new``: the ports other
    machines reach them on, which are fenced while they restart; ``gaps`` fills as it goes."""

    old: Mapping[str, Endpoint]
    new: Mapping[str, Endpoint]
    drain_timeout_s: float
    fence_old: Mapping[str, int] = field(default_factory=dict)
    fence_new: Mapping[str, int] = field(default_factory=dict)
    warm: WarmCaches | None = None
    # Blue-green (``hosts.blue_green``): the bridge of each instance that switches so, and
    # why the others asked to did not.
    bridges: Mapping[str, Bridge] = field(default_factory=dict)
    no_bridge: Mapping[str, str] = field(default_factory=dict)
    gaps: dict[str, GapRecord] = field(default_factory=dict)

    def reversed(self) -> DrainingRestart:
        """The same restarts the other way (a rollback): the new servers are the running ones.
        The caches a restart saved and never restored are restored by this one's. A rollback
        restarts as usual, never blue-green: it is to be back quickly."""
        return DrainingRestart(
            self.new, self.old, self.drain_timeout_s, self.fence_new, self.fence_old, self.warm
        )

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
            # Not a server of the config's (the gateway): restarted as it is.
            return systemctl.restart(runner, user, [unit], check=False)
        bridge = self.bridges.get(name)
        before = systemctl.show(user, unit)
        port = self.fence_old.get(name)
        if (
            bridge is not None
            and old is not None
            and new is not None
            and port is not None
            and before.runs
            and self.fence_new.get(name) == port
        ):
            return self._restart_bridged(runner, user, unit, bridge, old, new, port)
        endpoints = [e for e in (old, new) if e is not None]
        endpoints = [e for i, e in enumerate(endpoints) if e not in endpoints[:i]]
        drained: Drained | None = None
        port = port if before.runs else None
        fenced_at, no_fence = _put_fence(port)
        try:
            crash_point("restart:fenced")
            with AnswerWatch(endpoints) as watch:
                if old is not None and before.runs:
                    settle = fenced_at + DRAIN_SETTLE_S if fenced_at is not None else None
                    drained = drain(old, self.drain_timeout_s, settle_until=settle, port=port)
                    if self.warm is not None:
                        self.warm.save(name, old)
                    if before.main_pid is not None:
                        signals.signal_process(before.main_pid, signal.SIGTERM)
                crash_point("restart:stopped")
                ok = systemctl.restart(runner, user, [unit], check=False)
                crash_point("restart:started")
                after = systemctl.show(user, unit)
                started = after.main_started
                if ok and started is not None:
                    deadline = time.monotonic() + FIRST_ANSWER_WAIT_S
                    while time.monotonic() < deadline and not any(
                        t >= started for t in watch.answers()
                    ):
                        time.sleep(0.01)
            if self.warm is not None and ok and new is not None:
                self.warm.restore(name, new)
        finally:
            fenced_s = None
            if port is not None and fenced_at is not None:
                nft.unfence(port)
                fenced_s = time.monotonic() - fenced_at
        if started is None:
            record = _record(None, None, drained)
        else:
            gap = gap_of(watch.answers(), started, drained)
            record = _record(gap.gap_s, gap.load_s, drained)
        self.gaps[name] = replace(
            record, fenced_s=fenced_s, no_fence=no_fence, no_bridge=self.no_bridge.get(name)
        )
        return ok

    def _restart_bridged(
        self,
        runner: Runner,
        user: bool,
        unit: str,
        bridge: Bridge,
        old: Endpoint,
        new: Endpoint,
        port: int,
    ) -> bool:
        """Blue-green (``hosts.blue_green``): the bridge serves other machines while the unit
        restarts; False when the unit did not start (the bridge is gone either way)."""
        name = instance_of(unit)
        why = nft.unavailable()
        if why is not None:
            self.no_bridge = {**self.no_bridge, name: why}
            self.bridges = {k: v for k, v in self.bridges.items() if k != name}
            return self._restart_one(runner, user, unit)
        path = Path(RUNTIME_UNITS) / bridge.unit
        at_bridge = replace(new, url=_with_port(new.url, bridge.port))
        atomic_write(path, bridge.unit_text)
        started_at = time.monotonic()
        try:
            crash_point("blue-green:bridge-written")
            # Conntrack follows the port's connections from now: those made while the bridge
            # loads are known from their SYN when the redirect comes (``nft.redirect_script``).
            nft.track(port)
            systemctl.daemon_reload(runner, user)
            if not systemctl.restart(runner, user, [bridge.unit], check=False):
                self.no_bridge = {**self.no_bridge, name: f"its bridge {bridge.unit} did not start"}
                self.bridges = {k: v for k, v in self.bridges.items() if k != name}
                systemctl.stop(runner, user, [bridge.unit])
                return self._restart_one(runner, user, unit)
            handover = self._hand_over(runner, user, unit, bridge, old, at_bridge, port)
        finally:
            # However it ends (done, an error, Ctrl-C): the bridge goes, with what served it.
            _remove_bridge(runner, user, bridge, port, path)
        silence = longest_silence(handover.watch.answers(), handover.handed, handover.ended)
        load = None
        if handover.started is not None:
            first = [t for t in handover.watch.answers(0) if t >= handover.started]
            load = min(first) - handover.started if first else None
        drained = handover.drained
        self.gaps[name] = GapRecord(
            silence,
            load,
            drained.waited_s,
            drained.idle,
            drained.in_flight,
            fenced_s=handover.ended - started_at,
            bridge_port=bridge.port,
            steps=handover.steps,
        )
        return handover.ok

    def _hand_over(
        self,
        runner: Runner,
        user: bool,
        unit: str,
        bridge: Bridge,
        old: Endpoint,
        at_bridge: Endpoint,
        port: int,
    ) -> _Handover:
        """With the bridge serving: the port to the bridge, the old server fenced, drained and
        stopped, the unit restarted, the port back to it, the bridge fenced, drained and
        stopped; an ``AnswerWatch`` on both all the while."""
        steps = {"bridge served": time.monotonic()}
        crash_point("blue-green:bridge-serving")
        with AnswerWatch([old, at_bridge]) as watch:
            handed = time.monotonic()
            nft.redirect(port, bridge.port)
            steps["port handed over"] = time.monotonic()
            crash_point("blue-green:redirected")
            time.sleep(HANDOVER_GRACE_S)
            nft.fence(port)
            fenced = time.monotonic()
            crash_point("blue-green:fenced")
            before = systemctl.show(user, unit)
            drained = drain(
                old, self.drain_timeout_s, settle_until=fenced + DRAIN_SETTLE_S, port=port
            )
            if before.main_pid is not None:
                signals.signal_process(before.main_pid, signal.SIGTERM)
            crash_point("blue-green:old-stopped")
            ok = systemctl.restart(runner, user, [unit], check=False)
            started = systemctl.show(user, unit).main_started
            steps["unit served"] = time.monotonic()
            crash_point("blue-green:unit-serving")
            # Back to the unit's own port: new connections go there, and the bridge's
            # open ones are refused new requests (its fence) while it drains; those it has
            # keep their redirect until the table goes, after the bridge has stopped.
            # The fence first: without the redirect, a new connection would meet it.
            nft.unfence(port)
            nft.end_redirect(port)
            steps["port back"] = time.monotonic()
            # As at the handover: a connection made to the bridge just before delivers its
            # request, then the bridge's own fence refuses new ones.
            time.sleep(HANDOVER_GRACE_S)
            nft.fence(bridge.port)
            back = time.monotonic()
            crash_point("blue-green:port-back")
            drain(
                at_bridge,
                self.drain_timeout_s,
                settle_until=back + DRAIN_SETTLE_S,
                port=bridge.port,
            )
            systemctl.stop(runner, user, [bridge.unit])
            ended = time.monotonic()
            steps["bridge stopped"] = ended
            crash_point("blue-green:bridge-stopped")
        return _Handover(ok, watch, handed, started, ended, drained, steps)


@dataclass(frozen=True)
class _Handover:
    """What a blue-green handover saw: ``ok`` when the unit started; when (monotonic) the port
    went to the bridge, the unit started and the bridge stopped; the old server's drain; the
    time of each named step; the watch on the old server and the bridge."""

    ok: bool
    watch: AnswerWatch
    handed: float
    started: float | None
    ended: float
    drained: Drained
    steps: dict[str, float]


def _with_port(url: str, port: int) -> str:
    """``url`` (http://HOST:PORT) on another port."""
    head, _, _ = url.rpartition(":")
    return f"{head}:{port}"


def _put_fence(port: int | None) -> tuple[float | None, str | None]:
    """Fence ``port`` (None: nothing to fence): when it went up, or why it could not."""
    if port is None:
        return None, None
    why = nft.unavailable()
    if why is not None:
        return None, why
    nft.fence(port)
    return time.monotonic(), None


def _remove_bridge(runner: Runner, user: bool, bridge: Bridge, port: int, path: Path) -> None:
    """Undo a blue-green handover, from wherever it got to: the tables (new connections reach
    the unit's own port again), then the bridge itself (stopped: it holds a copy of the
    model), its unit file and its directories. Every step is tried; the first error is raised
    once all were."""
    errors: list[ExternalCommandError] = []

    def step(action: Callable[[], object]) -> None:
        try:
            action()
        except ExternalCommandError as err:
            errors.append(err)

    step(lambda: nft.unfence(port))
    step(lambda: nft.untrack(port))
    step(lambda: nft.unfence(bridge.port))
    step(lambda: systemctl.stop(runner, user, [bridge.unit]))
    if path.exists():
        path.unlink()
        step(lambda: systemctl.daemon_reload(runner, user))
    remove_bridge_directories(bridge)
    if errors:
        raise errors[0]


def _record(gap_s: float | None, load_s: float | None, drained: Drained | None) -> GapRecord:
    if drained is None:
        return GapRecord(gap_s, load_s)
    return GapRecord(gap_s, load_s, drained.waited_s, drained.idle, drained.in_flight)
