"""The options of ``switch`` and ``rollback``, declared once: each decorator adds its options
and hands the command one record built from them (``opts``), so no command fills a
SwitchOptions or RollbackOptions by hand. A remote host's agent gets the same record as JSON
(fleet.protocol), not as options of its own."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import click

from llamanix.cli.options import DIRECTORY, OneOf, timeout_option
from llamanix.state.gate_records import ACTIONS, GATES
from llamanix.state.generations import MANAGERS
from llamanix.state.warm_records import DEFAULT_LIMIT_GIB
from llamanix.switch.gate import DEFAULT_MAX_RUNS
from llamanix.switch.switch_records import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_RUN_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    FOLLOW_GRACE_S,
    RollbackOptions,
    SwitchOptions,
)

Command = Callable[..., None]
Decorator = Callable[[Command], Command]

TIMEOUT_HELP = "Seconds each instance may take to become healthy."


def wait_option(what: str) -> Decorator:
    """``--wait SECONDS``: how long to wait for the lock that ``what`` names."""
    return click.option(
        "--wait",
        "wait_s",
        type=click.FloatRange(min=0),
        default=0.0,
        show_default=True,
        metavar="SECONDS",
        help=f"Wait this long for {what} to finish.",
    )


WAIT = wait_option(
    "another switch, rollback or tidy of the same host (or another command writing the same "
    "units on this machine)"
)
# pin locks the flake (its flake.lock), not a host.
PIN_WAIT = wait_option("another pin of the same flake")

# A remote host's run: how long it may take there, and how long its agent follows it.
_REMOTE_RUN: tuple[Decorator, ...] = (
    click.option(
        "--run-timeout",
        "run_timeout_s",
        type=click.FloatRange(min=1),
        default=DEFAULT_RUN_TIMEOUT_S,
        show_default=True,
        metavar="SECONDS",
        help="Remote plain-systemd hosts: stop the switch running there (its unit) once it "
        "ran this long; the next switch of the host tidies what it left.",
    ),
    click.option(
        "--follow-timeout",
        "follow_timeout_s",
        type=click.FloatRange(min=0),
        metavar="SECONDS",
        help="Remote plain-systemd hosts: follow the run there this long at most, then leave "
        f"it to end by itself (default: --run-timeout plus {FOLLOW_GRACE_S:g} s).",
    ),
)

_MANAGER: tuple[Decorator, ...] = (
    click.option(
        "--manager",
        type=OneOf(MANAGERS),
        help="Override the host's kind: 'up' installs into the directory a running "
        "`llamanix up` watches (no systemd needed).",
    ),
    click.option(
        "--units-dir",
        type=DIRECTORY,
        help="Where units are installed (default: /etc/systemd/system, "
        "~/.config/systemd/user, or .llamanix-state/HOST/up for --manager up).",
    ),
)

_SWITCH: tuple[Decorator, ...] = (
    click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="Change the config first, e.g. instances.qwen.variant=ik (repeatable).",
    ),
    click.option(
        "--gate",
        type=OneOf(GATES),
        help="What a changed instance must pass (default: health; bench with a threshold).",
    ),
    click.option("--min-tok-s", type=float, help="bench gate: minimum decode tok/s."),
    click.option(
        "--max-regression",
        type=float,
        metavar="PCT",
        help="bench gate: the largest tolerated drop in %, judged by a 95% interval of "
        "candidate/baseline decode speed (the baseline measured just before the switch).",
    ),
    click.option(
        "--max-runs",
        type=int,
        default=DEFAULT_MAX_RUNS,
        show_default=True,
        help="bench gate: most candidate runs while the interval straddles the threshold.",
    ),
    click.option(
        "--inconclusive",
        type=OneOf(ACTIONS),
        default="keep",
        show_default=True,
        help="bench gate: what a still-inconclusive comparison after --max-runs ends as.",
    ),
    click.option(
        "--on-drift",
        type=OneOf(ACTIONS),
        default="keep",
        show_default=True,
        help="bench gate: a regression is confirmed by measuring the baseline again after the "
        "rollback; when the candidate matches that second baseline (the machine moved, not the "
        "change), keep the switch or leave it rolled back.",
    ),
    click.option(
        "--gate-prompts",
        metavar="SPEC",
        help="bench gate: the prompts measured, one per run in turn, as bench's --prompts "
        "names them (default builtin:fibonacci; e.g. realtext:edit, raw text for a base "
        "model): speculation pays on some text and costs on other text.",
    ),
    timeout_option(DEFAULT_TIMEOUT_S, TIMEOUT_HELP),
    click.option(
        "--drain-timeout",
        "drain_timeout_s",
        type=click.FloatRange(min=0),
        default=DEFAULT_DRAIN_TIMEOUT_S,
        show_default=True,
        metavar="SECONDS",
        help="Before a server restarts, wait at most this long for it to finish the requests "
        "in flight (systemd hosts; 0: restart at once). Each restart's gap is printed and "
        "recorded.",
    ),
    click.option(
        "--warm-limit",
        "warm_limit_gib",
        type=click.FloatRange(min=0),
        default=DEFAULT_LIMIT_GIB,
        show_default=True,
        metavar="GIB",
        help="warm_switch instances: save at most this much of one server's caches before its "
        "restart (a slot whose file would pass it starts cold).",
    ),
    click.option(
        "--blue-green",
        is_flag=True,
        help="systemd hosts: start each changed server's new render on a second port, send "
        "other machines' new requests to it, and only then stop the old server; where two "
        "copies do not fit (VRAM), restart as usual and say why.",
    ),
    WAIT,
    *_MANAGER,
    *_REMOTE_RUN,
)

_ROLLBACK: tuple[Decorator, ...] = (
    click.option(
        "--to",
        "to",
        type=int,
        metavar="N",
        help="Generation number (default: the newest good one before the current).",
    ),
    timeout_option(DEFAULT_TIMEOUT_S, TIMEOUT_HELP),
    WAIT,
    *_MANAGER,
    *_REMOTE_RUN,
)


def _record_options(record: type[Any], options: tuple[Decorator, ...]) -> Decorator:
    """A decorator adding ``options`` (each named as a field of ``record``) that hands the
    command ``opts``, the record built from their values."""
    names = tuple(f.name for f in dataclasses.fields(record))

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def with_opts(*args: Any, **kwargs: Any) -> None:
            opts = record(**{name: kwargs.pop(name) for name in names})
            command(*args, opts=opts, **kwargs)

        decorated: Command = with_opts
        for option in reversed(options):
            decorated = option(decorated)
        return decorated

    return decorate


# Every option of SwitchOptions, in --help's order; the command gets ``opts: SwitchOptions``.
switch_options = _record_options(SwitchOptions, _SWITCH)
# Every option of RollbackOptions; the command gets ``opts: RollbackOptions``.
rollback_options = _record_options(RollbackOptions, _ROLLBACK)
