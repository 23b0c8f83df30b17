"""A rolling switch behind a gateway moves each drained replica's caches to a replica that
takes its conversations over (docs/gateway.md, "Caches move with a drain"). The hosts' own
parts are switch/cache_moves.py, run by their fleet agents; this is the controller's order:

1. the gateway marks the replica as draining: no new conversation goes there, its own keep
   going there (it still serves, warm) until they move;
2. the replica's server saves each slot that holds a cache, stamped with its build and layout;
3. each file goes, through this machine, to the host of another replica of the same model
   group outside the batch, which restores it into an idle slot once its stamp matches that
   server's build and layout;
4. the gateway moves the replica's conversations to that replica, and says it did: only then
   does the host's switch fence, drain and restart the replica;
5. once the host's switch has ended, the replica is no longer draining.

A replica's caches go cold, with the reason in the rollout's record (its row's ``caches``),
when its group has no affinity, no other replica outside the batch takes them, a host or the
gateway's host is not one a fleet agent runs on (a NixOS host, or the controller itself), the
instance or the taker runs without ``warm_switch`` (no ``--slot-save-path``), or the two differ
in build, model or layout (the warm switch's rules, checked against each file's stamp). A move
that fails part-way leaves the rest of the switch as it was: the gateway's health checks and
retries route around the replica, and the conversations go cold.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from llamanix.config.model import Config, Instance
from llamanix.core.errors import ExternalCommandError, UserError
from llamanix.core.json_value import JsonObject, JsonValue
from llamanix.external.process import Runner
from llamanix.fleet import remote
from llamanix.fleet.protocol import CacheStep
from llamanix.state.warm_records import SLOT_OUTCOMES, CacheMove, SlotOutcome, WarmSlot
from llamanix.switch.switch_records import Echo


def _changed(old: Config, new: Config, host: str, name: str) -> bool:
    """Whether ``name``'s server will be restarted by the host's switch (its settings or its
    host's changed): only then are its caches moved."""
    if name not in new.instances:
        return False
    return old.instances.get(name) != new.instances[name] or old.hosts.get(host) != new.hosts.get(
        host
    )


def _group(inst: Instance) -> str:
    return inst.alias or inst.name


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _outcome(value: object) -> SlotOutcome:
    return next((o for o in SLOT_OUTCOMES if o == value), "not restored")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class CacheMoves:
    """The moves of one rollout; ``before`` a host's switch and ``after`` it (hosts of one
    batch may call them at once)."""

    old: Config
    new: Config
    batches: Sequence[Sequence[str]]
    runner: Runner
    echo: Echo
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _draining: set[str] = field(default_factory=set)
    _takers: dict[str, threading.Lock] = field(default_factory=dict)
    _restored: dict[str, list[int]] = field(default_factory=dict)
    # The hosts this rollout has switched so far (their instances run the new config).
    _switched: set[str] = field(default_factory=set)

    @property
    def _gateway(self) -> remote.RemoteHost | None:
        gateway = self.new.gateway
        return None if gateway is None else remote.remote_host(self.new, gateway.host)

    def _replicas(self, host: str) -> list[Instance]:
        """The host's instances the switch restarts, in groups with affinity. A switch to the
        file as it is (no --set) cannot tell here what changed since the host's last switch
        (the host knows): every replica of the host's is taken to restart."""
        gateway = self.new.gateway
        if gateway is None:
            return []
        edited = self.old is not self.new
        return [
            inst
            for inst in self.old.instances_on(host)
            if gateway.affinity_of(_group(inst))
            and (_changed(self.old, self.new, host, inst.name) if edited else True)
            and inst.name in self.new.instances
        ]

    def _batch(self, host: str) -> set[str]:
        return next((set(b) for b in self.batches if host in b), {host})

    def _route(self, moves: dict[str, str]) -> tuple[bool, str]:
        """Hand the gateway the draining replicas and ``moves``; (applied, why not)."""
        rg = self._gateway
        if rg is None:
            return False, "the gateway's host is not reached by a fleet agent"
        with self._lock:
            routes: JsonObject = {
                "seq": time.time_ns(),
                "draining": list[JsonValue](sorted(self._draining)),
                "moves": dict(moves),
            }
            answer, _ = remote.remote_cache_step(
                rg, CacheStep("route", json.dumps(routes)), self.runner, self.echo
            )
        if self.runner.dry_run:
            return True, ""
        why = answer.get("why")
        return answer.get("applied") is True, str(why or "")

    def before(self, host: str) -> dict[str, CacheMove]:
        """Move the caches of ``host``'s replicas that its switch restarts; each one's
        record. Where none can move (their reasons are known here), nothing is asked of any
        host."""
        records: dict[str, CacheMove] = {}
        movable: list[tuple[Instance, Instance]] = []
        for inst in self._replicas(host):
            taker = self._taker(host, inst)
            why = self._cold(host, inst, taker)
            if why is not None or taker is None:
                records[inst.name] = CacheMove(to=taker.name if taker else None, cold=why)
            else:
                movable.append((inst, taker))
        if movable:
            with self._lock:
                self._draining |= {inst.name for inst, _ in movable}
            try:
                self._route({})
            except (ExternalCommandError, UserError) as err:
                self.echo(f"{host}: the gateway was not told of the drain: {err}")
        for inst, taker in movable:
            try:
                records[inst.name] = self._move(host, inst, taker)
            except (ExternalCommandError, UserError) as err:
                records[inst.name] = CacheMove(to=taker.name, cold=f"the move stopped: {err}")
        for name, record in records.items():
            self.echo(f"{host}:   {name}: {record.describe()}")
        return records

    def after(self, host: str) -> None:
        """``host``'s switch has ended: its replicas take new conversations again."""
        names = {r.name for r in self._replicas(host)}
        with self._lock:
            self._switched.add(host)
            ended = names & self._draining
            self._draining -= ended
        if not ended:
            return
        try:
            self._route({})
        except (ExternalCommandError, UserError) as err:
            self.echo(f"{host}: the gateway was not told the drain ended: {err}")

    def _running(self, inst: Instance) -> Instance:
        """The instance as its host runs it now: the new config's once this rollout switched
        its host, else the old one's."""
        if inst.host in self._switched:
            return self.new.instances.get(inst.name, inst)
        return self.old.instances.get(inst.name, inst)

    def _cold(self, host: str, inst: Instance, taker: Instance | None) -> str | None:
        """Why ``inst``'s caches cannot move, as far as the configs tell (the stamps tell the
        rest, on the taker's host)."""
        if self._gateway is None:
            gateway = self.new.gateway.host if self.new.gateway else ""
            return f"the gateway's host '{gateway}' is not reached by a fleet agent"
        if remote.remote_host(self.new, host) is None:
            return f"host '{host}' is not reached by a fleet agent"
        if taker is None:
            return f"no other replica of {_group(inst)} outside this batch takes them over"
        for side in (self._running(inst), self._running(taker)):
            if not side.warm_switch:
                return (
                    f"{side.name} runs without warm_switch (no --slot-save-path to move "
                    "caches through)"
                )
        return None

    def _taker(self, host: str, inst: Instance) -> Instance | None:
        """Another replica of the group, on a host outside the batch that a fleet agent runs
        on: the first by name."""
        batch = self._batch(host)
        for other in sorted(self.new.instances.values(), key=lambda i: i.name):
            if (
                other.name != inst.name
                and _group(other) == _group(inst)
                and other.host not in batch
                and remote.remote_host(self.new, other.host) is not None
            ):
                return other
        return None

    def _taking(self, taker: str) -> threading.Lock:
        """One move at a time into a taker: its parts go to one file on its host."""
        with self._lock:
            return self._takers.setdefault(taker, threading.Lock())

    def _carry(
        self,
        source: remote.RemoteHost,
        target: remote.RemoteHost,
        inst: Instance,
        taker: Instance,
        filename: str,
        tokens: int,
        used: list[int],
    ) -> tuple[JsonObject, JsonObject]:
        """Carry one saved file from the source's host to the taker's, part by part (each
        request stays inside the agent's bound on its stdin); the last part's ``send`` answer
        and the ``take`` answer that ended the move. A take that refuses a part stops the move,
        and the source deletes its file."""
        run = self.runner, self.echo
        offset = 0
        while True:
            wanted = json.dumps({"instance": inst.name, "file": filename, "offset": offset})
            sent, data = remote.remote_cache_step(source, CacheStep("send", wanted), *run)
            header = {
                "instance": taker.name,
                "tokens": tokens,
                "offset": offset,
                "bytes": sent.get("bytes"),
                "sha256": sent.get("sha256"),
                "size": sent.get("size"),
                "last": sent.get("last") is True,
                "stamp": sent.get("stamp"),
                "avoid": list[JsonValue](used),
            }
            took, _ = remote.remote_cache_step(
                target, CacheStep("take", json.dumps(header), tuple(data)), *run
            )
            part = _int(sent.get("bytes"))
            if self.runner.dry_run or sent.get("last") is True or part is None:
                return sent, took
            if took.get("outcome") != "receiving":
                dropped = json.dumps({"instance": inst.name, "file": filename, "discard": True})
                remote.remote_cache_step(source, CacheStep("send", dropped), *run)
                return sent, took
            offset += part

    def _move(self, host: str, inst: Instance, taker: Instance) -> CacheMove:
        source = remote.remote_host(self.new, host)
        target = remote.remote_host(self.new, taker.host)
        assert source is not None and target is not None
        run = self.runner, self.echo
        order = json.dumps({"instance": inst.name})
        saved, _ = remote.remote_cache_step(source, CacheStep("save", order), *run)
        if self.runner.dry_run:
            return CacheMove(to=taker.name)
        if saved.get("cold") is not None:
            return CacheMove(to=taker.name, cold=str(saved["cold"]))
        slots: list[WarmSlot] = []
        # The taker's slots that moves of this rollout restored into, from every source: a
        # later restore takes another slot while one is idle.
        with self._lock:
            used = self._restored.setdefault(taker.name, [])
        entries = saved.get("slots")
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            slot, tokens = _int(entry.get("slot")) or 0, _int(entry.get("tokens")) or 0
            filename = entry.get("file")
            if not isinstance(filename, str):
                why = str(entry.get("why") or "not saved")
                slots.append(WarmSlot(slot, tokens, "not saved", why=why))
                continue
            with self._taking(taker.name):
                _, took = self._carry(source, target, inst, taker, filename, tokens, used)
                restored_in = _int(took.get("slot"))
                if restored_in is not None and took.get("outcome") == "restored":
                    used.append(restored_in)
            outcome = took.get("outcome")
            slots.append(
                WarmSlot(
                    slot,
                    tokens,
                    _outcome(outcome),
                    _int(took.get("bytes")),
                    _int(took.get("restored")),
                    _float(entry.get("save_ms")),
                    _float(took.get("restore_ms")),
                    str(took["why"]) if took.get("why") else None,
                )
            )
        restored = [s for s in slots if s.outcome == "restored"]
        if not restored:
            why = next((s.why for s in slots if s.why), None) or "no slot held a cache"
            return CacheMove(to=taker.name, cold=why, slots=tuple(slots))
        applied, why = self._route({inst.name: taker.name})
        if not applied:
            self.echo(f"{host}: the gateway did not confirm the move of {inst.name}: {why}")
        return CacheMove(to=taker.name, slots=tuple(slots), routed=applied)


__all__ = ["SLOT_OUTCOMES", "CacheMove", "CacheMoves", "SlotOutcome"]
