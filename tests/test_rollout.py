"""The rolling switch's rules (deploy.rollout): order, canary, batches, stopping, rollback-all.

The hosts here are a recording of calls: what each host does is the one-host switch, tested
on real hosts in test_fleet.py; these tests pin down which host is asked what, in which order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from llamanix.core.errors import Problem, UserError
from llamanix.deploy.rollout import (
    RolloutOptions,
    Unreachable,
    parse_hosts,
    plan_batches,
    run_rollout,
)
from llamanix.deploy.switch import HostOutcome


@dataclass
class Recorded:
    """Each host: its generation before, and what its switch does."""

    fails: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    preflight_fails: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _log(self, call: str) -> None:
        with self.lock:
            self.calls.append(call)

    def preflight(self, host: str) -> None:
        self._log(f"preflight {host}")
        if host in self.preflight_fails:
            raise UserError(Problem("fleet.toml", f"hosts.{host}.target", "cannot reach", "fix"))

    def switch(self, host: str, first: bool) -> HostOutcome:
        self._log(f"switch {host}{' first' if first else ''}")
        if host in self.unreachable:
            raise Unreachable(f"cannot reach admin@{host} over ssh")
        if host in self.fails:
            detail = "chat: gate failed; previous generation serving again"
            return HostOutcome(host, "failed", 2, detail, previous=1, out_of_service_s=3.0)
        return HostOutcome(host, "passed", 2, previous=1, out_of_service_s=1.5)

    def rollback(self, host: str, to: int) -> HostOutcome:
        self._log(f"rollback {host} to {to}")
        return HostOutcome(host, "passed", to, out_of_service_s=1.0)


def test_canary_alone_then_batches() -> None:
    assert plan_batches(["a", "b", "c", "d", "e"], 2) == [["a"], ["b", "c"], ["d", "e"]]
    assert plan_batches(["a", "b", "c"], 1) == [["a"], ["b"], ["c"]]
    assert plan_batches(["a"], 3) == [["a"]]


def test_every_host_passes_in_order() -> None:
    ops = Recorded()
    rollout = run_rollout(["a", "b", "c"], RolloutOptions(), ops, lambda _: None)
    assert ops.calls == [
        "preflight a",
        "preflight b",
        "preflight c",
        "switch a first",
        "switch b",
        "switch c",
    ]
    assert rollout.ok
    assert [(r.host, r.verdict, r.generations) for r in rollout.ordered()] == [
        ("a", "passed", "1 -> 2"),
        ("b", "passed", "1 -> 2"),
        ("c", "passed", "1 -> 2"),
    ]


def test_the_first_failure_stops_and_leaves_the_rest_untouched() -> None:
    ops = Recorded(fails={"b"})
    rollout = run_rollout(["a", "b", "c"], RolloutOptions(), ops, lambda _: None)
    assert "switch c" not in ops.calls
    assert [(r.host, r.verdict, r.generations) for r in rollout.ordered()] == [
        ("a", "passed", "1 -> 2"),
        ("b", "rolled back", "1 -> 1"),
        ("c", "untouched", "-"),
    ]
    assert not rollout.ok


def test_rollback_all_restores_the_switched_hosts_newest_first() -> None:
    ops = Recorded(fails={"c"})
    opts = RolloutOptions(on_failure="rollback-all")
    rollout = run_rollout(["a", "b", "c", "d"], opts, ops, lambda _: None)
    assert ops.calls[-2:] == ["rollback b to 1", "rollback a to 1"]
    verdicts = {r.host: r.verdict for r in rollout.ordered()}
    assert verdicts == {"a": "restored", "b": "restored", "c": "rolled back", "d": "untouched"}
    # Out of service: the switch's and the restore's.
    assert rollout.rows["a"].out_of_service_s == pytest.approx(2.5)


def test_a_host_that_cannot_be_reached_before_the_start_touches_none() -> None:
    ops = Recorded(preflight_fails={"b"})
    with pytest.raises(UserError):
        run_rollout(["a", "b", "c"], RolloutOptions(), ops, lambda _: None)
    assert not any(c.startswith("switch") for c in ops.calls)


def test_a_host_lost_during_the_rollout_stops_it() -> None:
    ops = Recorded(unreachable={"b"})
    rollout = run_rollout(["a", "b", "c"], RolloutOptions(), ops, lambda _: None)
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "passed"),
        ("b", "unreachable"),
        ("c", "untouched"),
    ]


def test_a_stop_between_hosts_finishes_the_host_under_way_and_stops() -> None:
    ops = Recorded()
    asked = iter([False, True, True])
    rollout = run_rollout(
        ["a", "b", "c"], RolloutOptions(), ops, lambda _: None, lambda: next(asked)
    )
    assert [c for c in ops.calls if c.startswith("switch")] == ["switch a first"]
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "passed"),
        ("b", "interrupted"),
        ("c", "interrupted"),
    ]


def test_a_batch_switches_its_hosts_together() -> None:
    ops = Recorded()
    rollout = run_rollout(["a", "b", "c"], RolloutOptions(batch=2), ops, lambda _: None)
    assert ops.calls[3] == "switch a first"
    assert sorted(ops.calls[4:]) == ["switch b", "switch c"]
    assert rollout.ok


def test_hosts_are_named_once_and_known() -> None:
    assert parse_hosts("b, a", ("a", "b"), "fleet.toml") == ("b", "a")
    with pytest.raises(UserError, match="no host 'c'"):
        parse_hosts("a,c", ("a", "b"), "fleet.toml")
    with pytest.raises(UserError, match="named twice"):
        parse_hosts("a,a", ("a", "b"), "fleet.toml")
    with pytest.raises(UserError, match="--batch"):
        plan_batches(["a"], 0)
