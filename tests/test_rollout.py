"""The rolling switch's rules (fleet.rollout): order, canary, batches, stopping,
rollback-all.

The hosts here are a recording of calls: what each host does is the one-host switch, tested
on real hosts in test_fleet.py; these tests pin down which host is asked what, in which order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from cli_run import invoke
from standins import recorded, stand_in

from llamanix.core.errors import Problem, UserError
from llamanix.fleet.rollout import Lost, RolloutOptions, Unreachable, plan_batches, run_rollout
from llamanix.server.server_process import free_port
from llamanix.switch.request import parse_hosts
from llamanix.switch.switch_records import HostOutcome


@dataclass
class Recorded:
    """Each host: its generation before, and what its switch does."""

    fails: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    preflight_fails: set[str] = field(default_factory=set)
    preflight_unreachable: set[str] = field(default_factory=set)
    rollback_fails: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _log(self, call: str) -> None:
        with self.lock:
            self.calls.append(call)

    def last_run(self, host: str) -> None:
        self._log(f"preflight {host}")
        if host in self.preflight_fails:
            raise UserError(Problem("fleet.toml", f"hosts.{host}.target", "still runs", "wait"))
        if host in self.preflight_unreachable:
            raise Unreachable(f"cannot reach admin@{host} over ssh")

    def switch(self, host: str, first: bool) -> HostOutcome:
        self._log(f"switch {host}{' first' if first else ''}")
        if host in self.unreachable:
            raise Unreachable(f"cannot reach admin@{host} over ssh")
        if host in self.lost:
            raise Lost(f"lost admin@{host} over ssh during the switch")
        if host in self.refused:
            raise UserError(Problem(host, "", "sudo asks for a password"))
        if host in self.fails:
            detail = "chat: gate failed; previous generation serving again"
            return HostOutcome(
                host, "failed", 2, detail, previous=1, out_of_service_s=3.0, restore="serving again"
            )
        return HostOutcome(host, "passed", 2, previous=1, out_of_service_s=1.5)

    def rollback(self, host: str, to: int) -> HostOutcome:
        self._log(f"rollback {host} to {to}")
        if host in self.rollback_fails:
            return HostOutcome(host, "failed", detail="did not start")
        return HostOutcome(host, "passed", to, out_of_service_s=1.0)

    def config_back(self) -> None:
        self._log("config back")


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
    assert ops.calls[-3:] == ["rollback b to 1", "rollback a to 1", "config back"]
    verdicts = {r.host: r.verdict for r in rollout.ordered()}
    assert verdicts == {"a": "restored", "b": "restored", "c": "rolled back", "d": "untouched"}
    # Out of service: the switch's and the restore's.
    assert rollout.rows["a"].out_of_service_s == pytest.approx(2.5)


def test_a_host_that_cannot_be_switched_now_gets_its_row_and_none_is_touched() -> None:
    ops = Recorded(preflight_fails={"b"}, preflight_unreachable={"c"})
    opts = RolloutOptions(on_failure="rollback-all")
    rollout = run_rollout(["a", "b", "c", "d"], opts, ops, lambda _: None)
    assert not any(c.startswith(("switch", "rollback")) for c in ops.calls)
    # Every host was asked: each that cannot be switched is named, not only the first.
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "untouched"),
        ("b", "refused"),
        ("c", "unreachable"),
        ("d", "untouched"),
    ]
    assert "still runs" in rollout.rows["b"].detail and not rollout.ok


def test_a_refused_host_ends_the_rollout_with_its_row_and_rollback_all_runs() -> None:
    """sudo's password prompt, no llamanix there, another protocol: one line each, raised as
    a UserError by the one-host switch of a host after the canary."""
    ops = Recorded(refused={"b"})
    opts = RolloutOptions(on_failure="rollback-all")
    rollout = run_rollout(["a", "b", "c"], opts, ops, lambda _: None)
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "restored"),
        ("b", "refused"),
        ("c", "untouched"),
    ]
    assert rollout.rows["b"].detail == "sudo asks for a password"  # the row names the host
    assert ops.calls[-2:] == ["rollback a to 1", "config back"]


def test_the_verdict_is_what_the_outcome_says_not_its_words() -> None:
    words = "chat: did not start; previous generation serving again"
    for restore, verdict in (
        ("serving again", "rolled back"),
        ("not answering", "failed"),
        ("nothing before", "failed"),
        (None, "failed"),
    ):

        @dataclass
        class One(Recorded):
            def switch(self, host: str, first: bool) -> HostOutcome:
                return HostOutcome(host, "failed", 2, words, previous=1, restore=restore)  # noqa: B023

        rollout = run_rollout(["a"], RolloutOptions(), One(), lambda _: None)
        assert rollout.rows["a"].verdict == verdict, restore


def test_a_lost_host_is_left_as_it_goes_and_so_is_the_config() -> None:
    ops = Recorded(lost={"c"})
    opts = RolloutOptions(batch=2, on_failure="rollback-all")
    rollout = run_rollout(["a", "b", "c"], opts, ops, lambda _: None)
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "restored"),
        ("b", "restored"),
        ("c", "lost"),
    ]
    # c's switch goes on there and may pass: the config keeps the change it may run.
    assert "config back" not in ops.calls


def test_a_restore_that_fails_is_not_restored_and_keeps_the_config() -> None:
    ops = Recorded(fails={"c"}, rollback_fails={"a"})
    opts = RolloutOptions(on_failure="rollback-all")
    rollout = run_rollout(["a", "b", "c"], opts, ops, lambda _: None)
    assert {r.host: r.verdict for r in rollout.ordered()} == {
        "a": "passed",
        "b": "restored",
        "c": "rolled back",
    }
    assert rollout.rows["a"].detail == "rollback-all failed: did not start"
    assert "config back" not in ops.calls


def test_rollback_all_follows_a_stop_signal_too() -> None:
    ops = Recorded()
    asked = iter([False, True, True])
    opts = RolloutOptions(on_failure="rollback-all")
    rollout = run_rollout(["a", "b", "c"], opts, ops, lambda _: None, lambda: next(asked))
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "restored"),
        ("b", "interrupted"),
        ("c", "interrupted"),
    ]
    assert ops.calls[-2:] == ["rollback a to 1", "config back"] and not rollout.aborted


def test_a_second_stop_signal_ends_the_batch_under_way() -> None:
    """A KeyboardInterrupt (what the second signal raises) while a batch runs: the hosts of
    the batch are interrupted, the rest too, and nothing is rolled back."""
    started = threading.Barrier(3)
    release = threading.Event()
    seen: list[object] = []  # SIGINT's handler when the signal was sent

    @dataclass
    class Slow(Recorded):
        def switch(self, host: str, first: bool) -> HostOutcome:
            if first:
                return super().switch(host, first)
            started.wait(60)
            release.wait(60)
            return super().switch(host, first)

    def interrupt_once_both_run() -> None:
        started.wait(60)
        # What the second signal does: KeyboardInterrupt on the main thread, and the hosts'
        # ssh ended (here: their switches let go). A real SIGINT to the main thread, as a
        # Ctrl-C gives: it wakes the main thread from its wait for the batch at once, where
        # _thread.interrupt_main only flags it until that wait ends by itself.
        seen.append(signal.getsignal(signal.SIGINT))
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        release.set()

    ops = Slow()
    # Python's own handler, whatever an earlier test left: a SIGINT the test sends must raise
    # KeyboardInterrupt here, never end pytest.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_both_run, daemon=True).start()
        opts = RolloutOptions(batch=2, on_failure="rollback-all")
        rollout = run_rollout(["a", "b", "c", "d"], opts, ops, lambda _: None)
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.default_int_handler]
    assert rollout.aborted and not rollout.ok
    assert [(r.host, r.verdict) for r in rollout.ordered()] == [
        ("a", "passed"),
        ("b", "interrupted"),
        ("c", "interrupted"),
        ("d", "interrupted"),
    ]
    assert not any(c.startswith("rollback") for c in ops.calls)


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


# --- the CLI, on hosts whose deploy tools are stand-ins ---------------------------------------


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nixos-rebuild and ssh record their argv (in order) and do nothing."""
    bin_dir = tmp_path / "standins"
    record = tmp_path / "record.jsonl"
    for name in ("nixos-rebuild", "ssh"):
        stand_in(bin_dir, name, record=record)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def mixed_config(d: Path) -> Path:
    """Two NixOS hosts (nothing answers on their ports) and a remote plain-systemd one."""
    (d / "flake.nix").write_text("{ }\n")
    config = d / "llamanix.toml"
    p1, p2, p3 = free_port(), free_port(), free_port()
    config.write_text(
        '[hosts.a]\nkind = "nixos"\n[hosts.b]\nkind = "nixos"\n'
        '[hosts.box]\nkind = "systemd"\ntarget = "admin@box"\n'
        'binaries = { upstream = "/usr/local/bin/llama-server" }\n'
        f'[instances.x]\nhost = "a"\nmodel = "/m/x.gguf"\nport = {p1}\n'
        f'[instances.y]\nhost = "b"\nmodel = "/m/y.gguf"\nport = {p2}\n'
        f'[instances.z]\nhost = "box"\nmodel = "/m/z.gguf"\nport = {p3}\n'
    )
    return config


cli = partial(invoke, catch_exceptions=False)


def test_a_failing_canary_rolls_itself_back_and_nothing_else_runs(
    tmp_path: Path, recorder: Path
) -> None:
    config = mixed_config(tmp_path)
    result = cli("switch", str(config), "--hosts", "b,a", "--timeout", "1")
    assert result.exit_code == 1, result.output
    # b first (the order given), its gate fails (nothing serves), it rolls back; a never runs.
    assert [r["argv"] for r in recorded(recorder)] == [
        ["nixos-rebuild", "switch", "--flake", ".#b"],
        ["nixos-rebuild", "switch", "--rollback"],
    ]
    assert "rolling switch" in result.output
    table = result.output[result.output.index("rolling switch") :]
    assert re.search(r"│ b\s+│ - -> -\s+│ failed", table) or "rolled back" in table
    assert re.search(r"│ a\s+│ -\s+│ untouched", table), table


def test_dry_run_shows_the_order_and_every_remote_command(tmp_path: Path, recorder: Path) -> None:
    config = mixed_config(tmp_path)
    result = cli(
        "switch", str(config), "--set", "instances.z.context=2048", "--hosts", "box,a",
        "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert recorded(recorder) == []
    out = result.output
    canary = out.index("rollout: canary: box")
    then = out.index("rollout: batch 1: a")
    ssh_lines = [ln for ln in out.splitlines() if ln.startswith("ssh ")]
    assert any("fleet-agent status" in ln for ln in ssh_lines)
    assert any("fleet-agent switch" in ln for ln in ssh_lines)
    assert all("admin@box" in ln and "BatchMode=yes" in ln for ln in ssh_lines)
    assert canary < out.index("fleet-agent switch") < then < out.index("nixos-rebuild switch")


def test_host_flags_are_one_at_a_time(tmp_path: Path, recorder: Path) -> None:
    config = mixed_config(tmp_path)
    result = cli("switch", str(config), "--host", "a", "--hosts", "a,b")
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "--hosts" in result.output and "--host" in result.output
    unknown = cli("switch", str(config), "--hosts", "a,c")
    assert unknown.exit_code == 2 and "no host 'c'" in unknown.output
    assert recorded(recorder) == []


def test_generations_of_several_hosts(tmp_path: Path, recorder: Path) -> None:
    config = mixed_config(tmp_path)
    cli("switch", str(config), "--hosts", "a", "--timeout", "1")
    listed = cli("generations", str(config), "--host", "a,b", "--json")
    assert listed.exit_code == 0, listed.output
    by_host = json.loads(listed.output)
    assert list(by_host) == ["a", "b"]
    assert [g["number"] for g in by_host["a"]] == [1] and by_host["b"] == []
