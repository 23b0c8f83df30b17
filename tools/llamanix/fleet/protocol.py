"""What a fleet switch's two sides say to each other over ssh: the controller (fleet/remote.py)
runs ``llamanix fleet-agent COMMAND`` on the remote host (fleet/agent.py), with no other
argument, hands it what to do on stdin (an ``AgentRequest``: the protocol, the host, and for a
switch the config and the options, as JSON), and reads its stdout.

Nothing but the command's name is on the command line, so that the host's sudoers line names
each command exactly, with no wildcard: sudo's ``*`` matches spaces too, and would let any
argument through to root (fleet/remote.py ``sudoers_line``).

The agent's stdout is progress lines for the user, plus machine lines, each one line of JSON
after a fixed prefix: first ``HELLO`` (the protocol it speaks and its version; before it
checks the protocol asked for, so a controller of another protocol can say which), then
``STARTED`` once a switch or rollback runs there (its run's id), last ``OUTCOME`` (switch,
rollback, status), ``GENERATIONS``, or a cache move step's ``ANSWER``. Its exit code: 0 passed
or unchanged, 1 failed, 2 a one-line user error on stderr, 3 another protocol.

Bump ``PROTOCOL`` when either side's words change in a way the other cannot read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal, get_args

from llamanix.core import json_fields as jf
from llamanix.core.json_codec import OMIT_NONE, JsonRecord, from_json_lenient
from llamanix.switch.switch_records import HostOutcome, RollbackOptions, SwitchOptions

PROTOCOL = 3
HELLO = "llamanix-fleet-agent: "
# The switch or rollback started there: its run's id (a later status names the same run).
STARTED = "llamanix-fleet-started: "
OUTCOME = "llamanix-fleet-outcome: "
GENERATIONS = "llamanix-fleet-generations: "
# A cache move's steps (switch/cache_moves.py): their one answer, and the lines of a file's
# bytes (base64) that the ``send`` step prints (``take`` gets them back in its request).
ANSWER = "llamanix-fleet-answer: "
DATA = "llamanix-fleet-data: "
EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INCOMPATIBLE = 3

# What a fleet run does on the remote host.
Op = Literal["switch", "rollback"]
OPS: tuple[Op, ...] = get_args(Op)
# The agent's commands that a controller runs (through sudo, for a ``systemd`` host): the
# sudoers line names these, and no other.
AgentCommand = Literal["switch", "rollback", "status", "generations", "top"]
AGENT_COMMANDS: tuple[AgentCommand, ...] = get_args(AgentCommand)
# The steps of a rolling switch's cache move (fleet/cache_move.py), each a request to the
# host's ``switch`` (part of the switch, so no command of its own for sudo to allow).
CacheStepName = Literal["save", "send", "take", "route"]
CACHE_STEPS: tuple[CacheStepName, ...] = get_args(CacheStepName)
# How the config is spelled: the agent keeps its copy in the controller's format.
ConfigFormat = Literal["toml", "json"]
FORMATS: tuple[ConfigFormat, ...] = get_args(ConfigFormat)


@dataclass(frozen=True)
class SwitchOrder(JsonRecord):
    """What a switch hands the agent on ssh's stdin (never on a command line): the whole config
    with --set applied, in its format, and the switch's options (--set and the options for
    hosts switched from the controller left out)."""

    config_format: ConfigFormat
    config: str
    options: SwitchOptions

    def text(self) -> str:
        return self.to_text()

    @staticmethod
    def parse(text: str, source: str) -> SwitchOrder:
        """The order on stdin; ValueError naming what is wrong with it."""
        return SwitchOrder.from_text(text, source)


@dataclass(frozen=True)
class CacheStep(JsonRecord):
    """One step of a cache move, in the request to ``switch`` instead of its ``order``:
    ``order`` is the step's JSON object (an instance's name, a file name ``save`` wrote, a
    moved file's header, the gateway's routes: each checked on the host, which derives every
    path from its own config and a fixed file name); ``data``: ``take``'s bytes, as the base64
    lines ``send`` printed."""

    step: CacheStepName
    order: str
    data: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentRequest(JsonRecord):
    """What every agent command reads on stdin, one JSON record: the protocol the controller
    speaks, the host it takes this machine for (a host of the config, which the agent checks),
    and what the command needs besides."""

    protocol: int
    host: str
    # switch: the config and its options.
    order: SwitchOrder | None = field(default=None, metadata=OMIT_NONE)
    # rollback: its options.
    rollback: RollbackOptions | None = field(default=None, metadata=OMIT_NONE)
    # status: follow a run that still goes on this long at most (None: the agent's default).
    follow_timeout_s: float | None = field(default=None, metadata=OMIT_NONE)
    # top: read twice this many seconds apart and take the rates over that window (None: once).
    window_s: float | None = field(default=None, metadata=OMIT_NONE)
    # switch, as a step of a rolling switch's cache move (instead of its order).
    cache: CacheStep | None = field(default=None, metadata=OMIT_NONE)

    def text(self) -> str:
        return self.to_text()

    @staticmethod
    def protocol_of(text: str) -> int | None:
        """The protocol a request names, read before the rest (whose shape is that
        protocol's); None when it names none."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        found = data.get("protocol") if isinstance(data, dict) else None
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    @staticmethod
    def parse(text: str, source: str) -> AgentRequest:
        """The request on stdin; ValueError naming what is wrong with it."""
        return AgentRequest.from_text(text, source)


@dataclass(frozen=True)
class Hello(JsonRecord):
    """The agent's first line: the protocol it speaks and the llamanix version it is."""

    protocol: int
    version: str = "?"

    def line(self) -> str:
        return HELLO + json.dumps(self.to_json())

    @staticmethod
    def parse(line: str) -> Hello | None:
        if not line.startswith(HELLO):
            return None
        try:
            return Hello.from_json(json.loads(line[len(HELLO) :]), "hello")
        except ValueError:
            return None


@dataclass(frozen=True)
class RunReport(JsonRecord):
    """How the last fleet run on a host ended (or that there was none): the agent's last line.

    ``unit``: systemd's word on the transient unit ("exited 0", "failed (signal)", "gone" after
    a reboot); ``reported``: whether an agent had already printed this ending before (a switch
    whose ssh connection dropped was not)."""

    op: Op | None
    run: str | None = None  # the run's id, as STARTED said it
    host: str | None = None
    started: str | None = None
    unit: str = ""
    reported: bool = False
    outcome: HostOutcome | None = None
    # It still ran when the agent stopped following it (at its deadline): it goes on there.
    running: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome is not None and self.outcome.ok

    def summary(self) -> str:
        """One line: what ran, when, how it ended."""
        if self.op is None:
            return "no fleet switch or rollback has run there yet"
        what = f"fleet {self.op} of {self.host} started {self.started}"
        if self.running:
            return f"{what} still runs"
        if self.outcome is None:
            ended = f"ended without an outcome ({self.unit or 'unknown'})"
        else:
            o = self.outcome
            ended = o.result
            if o.generation is not None:
                ended += f", generation {o.generation}"
            if o.detail:
                ended += f": {o.detail}"
        return f"{what}: {ended}{'' if self.reported else ' (not reported before)'}"

    def line(self) -> str:
        return OUTCOME + json.dumps(self.to_json())

    @staticmethod
    def parse(line: str) -> RunReport | None:
        if not line.startswith(OUTCOME):
            return None
        try:
            # Leniently: an outcome this version cannot read is no outcome, not no report.
            return from_json_lenient(RunReport, json.loads(line[len(OUTCOME) :]), "outcome")
        except ValueError:
            return None


def started_line(run: str) -> str:
    return STARTED + json.dumps({"run": run})


def parse_started(line: str) -> str | None:
    """The run's id of a ``STARTED`` line; None for any other line."""
    if not line.startswith(STARTED):
        return None
    try:
        return jf.text(jf.table(json.loads(line[len(STARTED) :])).get("run"))
    except ValueError:
        return None
