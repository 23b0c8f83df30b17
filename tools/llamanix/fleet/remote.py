"""A remote plain-systemd host (``kind = "systemd"`` or ``"systemd-user"`` with a ``target``):
switched by its own installed llamanix, over the user's OpenSSH.

This side runs ``ssh TARGET -- sudo -n llamanix fleet-agent OP`` (no sudo for systemd-user, as
nixos-rebuild's --sudo), hands the request on ssh's stdin (the protocol, the host's name and, for
a switch, its config and options: never on a command line, which the host's sudoers line
allows only as it is), and prints what the agent prints, each line prefixed with the host's
name.
The agent (fleet/agent.py) keeps the host's generations there and runs the switch as a
transient unit of the host's own systemd, so a dropped connection does not stop it half-way;
its last line is the outcome (fleet/protocol.py).

Every way this can fail before an outcome is one line: the host cannot be reached, it has no
llamanix (or not on sudo's PATH), sudo wants a password, or its llamanix speaks another fleet
protocol or none yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from llamanix import __version__
from llamanix.config.model import Config
from llamanix.core.address import SshTarget
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_value import JsonObject
from llamanix.external.process import Runner
from llamanix.external.ssh import SSH_FAILED, SshResult, run_ssh, ssh_argv
from llamanix.fleet.protocol import (
    AGENT_COMMANDS,
    ANSWER,
    DATA,
    EXIT_USER_ERROR,
    GENERATIONS,
    PROTOCOL,
    AgentCommand,
    AgentRequest,
    CacheStep,
    ConfigFormat,
    Hello,
    RunReport,
    SwitchOrder,
    parse_started,
)
from llamanix.switch.switch_records import Echo, HostOutcome, RollbackOptions, SwitchOptions

RemoteKind = Literal["systemd", "systemd-user"]

# docs/debian.md's install, plus the link that puts llamanix on sudo's secure_path (and on the
# PATH ssh gives a plain command: /usr/local/bin is on both).
INSTALL = (
    "sudo python3 -m venv /opt/llamanix && sudo /opt/llamanix/bin/pip install ./llamanix && "
    "sudo ln -s /opt/llamanix/bin/llamanix /usr/local/bin/llamanix"
)
UPGRADE = "sudo /opt/llamanix/bin/pip install --upgrade ./llamanix"


class RemoteUnreachable(ExternalCommandError):
    """ssh could not reach the host (exit 255): nothing ran there."""


class RemoteLost(RemoteUnreachable):
    """ssh lost the host during a run, or its agent stopped following the run at its
    deadline: the run goes on there by itself."""


@dataclass(frozen=True)
class RemoteHost:
    name: str
    target: SshTarget
    kind: RemoteKind
    config_format: ConfigFormat = "toml"
    source: str = ""  # the config that names it, for messages

    @property
    def sudo(self) -> bool:
        return self.kind == "systemd"

    def llamanix(self) -> list[str]:
        """The remote llamanix as this side runs it: through ``sudo -n`` (never a password
        prompt: it would wait for an answer no one can give) for system units."""
        return ["sudo", "-n", "llamanix"] if self.sudo else ["llamanix"]


def remote_host(config: Config, name: str) -> RemoteHost | None:
    """The host as a remote plain-systemd host; None when it is not one (no target, or a
    NixOS host, which nixos-rebuild --target-host switches)."""
    host = config.hosts[name]
    if not host.runs_own_switch or host.target is None:
        return None
    kind: RemoteKind = "systemd" if host.kind == "systemd" else "systemd-user"
    fmt: ConfigFormat = "json" if Path(config.source).suffix == ".json" else "toml"
    return RemoteHost(name, host.target, kind, fmt, config.source)


def agent_argv(rh: RemoteHost, op: AgentCommand) -> list[str]:
    """The command the remote side runs (ssh hands it to the login shell, quoted): the
    command's name and nothing else, as the sudoers line allows it."""
    return [*rh.llamanix(), "fleet-agent", op]


def remote_argv(rh: RemoteHost, op: AgentCommand) -> list[str]:
    """The full ssh argv of one agent command (what --dry-run prints)."""
    return ssh_argv(rh.target, agent_argv(rh, op))


def agent_request(
    rh: RemoteHost,
    *,
    order: SwitchOrder | None = None,
    rollback: RollbackOptions | None = None,
    follow_timeout_s: float | None = None,
    window_s: float | None = None,
    cache: CacheStep | None = None,
) -> str:
    """What goes on the agent's stdin: this side's protocol, the host's name, and what the
    command needs besides (``AgentRequest``)."""
    return AgentRequest(
        PROTOCOL, rh.name, order, rollback, follow_timeout_s, window_s, cache
    ).text()


def switch_order(rh: RemoteHost, new_text: str, opts: SwitchOptions) -> SwitchOrder:
    """What the agent gets on stdin: the config and the options that mean something there
    (--set is applied already; the manager overrides are refused for a remote host)."""
    return SwitchOrder(rh.config_format, new_text, replace(opts, sets=()))


# --- one agent command -------------------------------------------------------------------------


@dataclass
class _Reply:
    """What the agent said: its hello, the run it started, its last line, and how ssh ended."""

    hello: Hello | None = None
    started: str | None = None
    report: RunReport | None = None
    generations: list[JsonObject] | None = None
    # A cache move's command: its answer, and the data lines it printed.
    answer: JsonObject | None = None
    data: list[str] = field(default_factory=list)
    result: SshResult = field(default_factory=lambda: SshResult(0, ()))


class _Lost(Exception):
    """ssh lost the connection after the agent answered (its work may go on there)."""

    def __init__(self, reply: _Reply) -> None:
        super().__init__(reply.result.last_error)
        self.reply = reply


def _prefixed(name: str, line: str) -> str:
    # The agent's own switch already names the host at the start of some lines.
    return line if line.startswith(f"{name}: ") else f"{name}: {line}"


def _call(
    rh: RemoteHost,
    op: AgentCommand,
    request: str,
    runner: Runner,
    echo: Echo,
    show: bool = True,
) -> _Reply:
    """Run one agent command over ssh with ``request`` (``agent_request``) on its stdin, echo
    its progress, and read its machine lines; the one-line errors of a command that did not
    get to answer are raised here."""
    reply = _Reply()

    def on_line(line: str) -> None:
        hello = Hello.parse(line)
        if hello is not None:
            reply.hello = hello
            return
        started = parse_started(line)
        if started is not None:
            reply.started = started
            return
        report = RunReport.parse(line)
        if report is not None:
            reply.report = report
            return
        if line.startswith(DATA):
            reply.data.append(line[len(DATA) :])
            return
        if line.startswith(ANSWER):
            try:
                found = json.loads(line[len(ANSWER) :])
            except ValueError:
                found = None
            if isinstance(found, dict):
                reply.answer = found
            return
        if line.startswith(GENERATIONS):
            try:
                found = json.loads(line[len(GENERATIONS) :])
            except ValueError:
                found = None
            if isinstance(found, list):
                reply.generations = [item for item in found if isinstance(item, dict)]
            return
        echo(_prefixed(rh.name, line))

    argv = agent_argv(rh, op)
    reply.result = run_ssh(runner, rh.target, argv, on_line, request, show)
    if runner.dry_run:
        return reply
    _check(rh, reply, runner)
    # An answer came: what else was said on stderr (ssh's warnings) is shown, not an error.
    for line in reply.result.stderr:
        if line.strip():
            echo(_prefixed(rh.name, line))
    return reply


def _check(rh: RemoteHost, reply: _Reply, runner: Runner) -> None:
    result, hello = reply.result, reply.hello
    said = result.last_error
    if result.returncode == SSH_FAILED:
        if hello is None:
            raise RemoteUnreachable(
                f"{rh.name}: cannot reach {rh.target} over ssh: {said or 'ssh exited 255'}"
            )
        raise _Lost(reply)
    if hello is None:
        text = "\n".join(result.stderr)
        if result.returncode == 127 or "command not found" in text:
            raise UserError(Problem(rh.name, "", _missing(rh)))
        if "sudo:" in text and ("password" in text or "terminal is required" in text):
            raise UserError(Problem(rh.name, "", _needs_password(rh)))
        if "No such command" in text or _OLD_AGENT in text:
            version = _remote_version(rh, runner)
            speaks = "an older fleet protocol" if _OLD_AGENT in text else "no fleet protocol"
            raise UserError(
                Problem(
                    rh.name,
                    "",
                    f"llamanix {version} on {rh.target} speaks {speaks}, this one "
                    f"{PROTOCOL}; upgrade it there: {UPGRADE}",
                )
            )
        raise ExternalCommandError(
            f"{rh.name}: llamanix fleet-agent on {rh.target} exited with {result.returncode}: "
            f"{said or 'no error message'}"
        )
    if hello.protocol != PROTOCOL:
        fix = (
            f"upgrade it there: {UPGRADE}"
            if hello.protocol < PROTOCOL
            else f"upgrade llamanix here ({__version__})"
        )
        raise UserError(
            Problem(
                rh.name,
                "",
                f"llamanix {hello.version} on {rh.target} speaks fleet protocol "
                f"{hello.protocol}, this one {PROTOCOL}; {fix}",
            )
        )
    if reply.report is None and reply.generations is None and reply.answer is None:
        if result.returncode == EXIT_USER_ERROR and said:
            raise UserError(Problem(rh.name, "", f"{rh.target}: {said}"))
        raise ExternalCommandError(
            f"{rh.name}: the fleet agent on {rh.target} exited with {result.returncode} "
            f"without an outcome: {said or 'no error message'}"
        )


# What an agent of protocol 2 or before says to a command line without its --protocol (it
# prints no hello before its options are read).
_OLD_AGENT = "Missing option '--protocol'"


def _missing(rh: RemoteHost) -> str:
    where = "sudo's PATH" if rh.sudo else "the PATH of commands run over ssh"
    return f"{rh.target} has no llamanix on {where}; install it there: {INSTALL}"


# Where sudo's secure_path finds llamanix (docs/fleet.md "Installing it there").
SUDO_LLAMANIX = "/usr/local/bin/llamanix"


def sudoers_line(user: str) -> str:
    """What lets ``user`` run, through ``sudo -n``, the fleet agent's commands that a
    controller calls, each exactly as it calls them (no argument: the request comes on
    stdin), and nothing else of llamanix (nor any other program) as root. No wildcard: sudo's
    ``*`` matches spaces, so ``fleet-agent *`` would let through every other subcommand and
    argument too."""
    commands = ", ".join(f"{SUDO_LLAMANIX} fleet-agent {op}" for op in AGENT_COMMANDS)
    return f"{user} ALL=(root) NOPASSWD: {commands}"


def _needs_password(rh: RemoteHost) -> str:
    user = rh.target.user or "the ssh user"
    return (
        f"sudo on {rh.target} asks {user} for a password, and a fleet switch cannot answer it; "
        f"allow it there: echo '{sudoers_line(user)}' | sudo tee /etc/sudoers.d/llamanix"
    )


def _remote_version(rh: RemoteHost, runner: Runner) -> str:
    """The remote llamanix's version (``llamanix --version``, without sudo: the sudoers line
    allows the agent's commands alone), or "(version unknown)"."""
    lines: list[str] = []
    try:
        run_ssh(runner, rh.target, ["llamanix", "--version"], lines.append, show=False)
    except ExternalCommandError:
        return "(version unknown)"
    words = " ".join(lines).split()
    return words[-1] if "version" in words else "(version unknown)"


def _outcome(rh: RemoteHost, op: str, report: RunReport | None, follow_s: float) -> HostOutcome:
    """The host's outcome of ``op``, as its agent reported it; ``RemoteLost`` when the run
    still went on when the agent stopped following it."""
    if report is not None and report.running:
        raise RemoteLost(
            f"{rh.name}: the {report.summary()} on {rh.target} after {follow_s:g} s "
            f"(--follow-timeout); it goes on there by itself: {_generations_hint(rh)}"
        )
    if report is None or report.outcome is None:
        unit = report.unit if report else "no report"
        detail = f"the fleet {op} on {rh.target} ended without an outcome ({unit})"
        return HostOutcome(rh.name, "failed", detail=detail)
    return replace(report.outcome, host=rh.name)


def _generations_hint(rh: RemoteHost) -> str:
    return f"`llamanix generations {rh.source} --host {rh.name}` shows how it ended"


def _after_lost(
    rh: RemoteHost, op: str, lost: _Lost, follow_s: float, runner: Runner, echo: Echo
) -> HostOutcome:
    """The connection dropped while the agent ran ``op``: the unit goes on there by itself.
    Follow it again through ``status`` once (for ``follow_s`` at most); the outcome when the
    run is the one started. ``RemoteLost`` when it cannot be followed; ``RemoteUnreachable``
    when it may not have started."""
    said = lost.reply.result.last_error or "ssh exited 255"
    started = lost.reply.started
    if started is None:
        raise RemoteUnreachable(
            f"{rh.name}: lost {rh.target} over ssh during the {op} ({said}); it may not have "
            "started there"
        )
    gone = RemoteLost(
        f"{rh.name}: lost {rh.target} over ssh during the {op} ({said}); it goes on there by "
        f"itself: {_generations_hint(rh)}"
    )
    echo(f"{rh.name}: lost the ssh connection ({said}); following the {op} there again")
    try:
        reply = _call(rh, "status", _status_request(rh, follow_s), runner, echo, show=False)
    except (ExternalCommandError, _Lost):
        raise gone from None
    if reply.report is None or reply.report.run != started:
        raise gone
    return _outcome(rh, op, reply.report, follow_s)


def _status_request(rh: RemoteHost, follow_s: float) -> str:
    return agent_request(rh, follow_timeout_s=follow_s)


# --- what the rest of llamanix calls -----------------------------------------------------------


def _refuse_local_options(rh: RemoteHost, manager: str | None, units_dir: Path | None) -> None:
    if manager is not None or units_dir is not None:
        raise UserError(
            Problem(
                rh.source,
                f"hosts.{rh.name}.target",
                "--manager and --units-dir are for hosts switched from this machine; "
                f"{rh.name} is switched by its own llamanix over ssh",
                f"leave them out, or switch {rh.name} on that machine",
            )
        )


def remote_switch(
    rh: RemoteHost, new_text: str, opts: SwitchOptions, runner: Runner, echo: Echo
) -> HostOutcome:
    """Switch the remote host to ``new_text`` (the whole config, its --set applied); it is
    gated there and restores itself when the gate fails. With ``runner.dry_run`` the ssh argv
    is printed and nothing runs."""
    _refuse_local_options(rh, opts.manager, opts.units_dir)
    opts.gate_kind(rh.source)  # bad options: one line before anything connects
    echo(f"{rh.name}: switching over ssh ({rh.target})")
    request = agent_request(rh, order=switch_order(rh, new_text, opts))
    dry_note = f"the config and options go on ssh's stdin; {rh.target} switches its own copy"
    return _run_order(rh, "switch", request, dry_note, opts.follow_s, runner, echo)


def remote_rollback(
    rh: RemoteHost, opts: RollbackOptions, runner: Runner, echo: Echo
) -> HostOutcome:
    """Serve an earlier generation of the remote host again (``opts.to``: its number; None:
    the newest good one before the current), as ``llamanix rollback`` does there, waiting up
    to ``opts.wait_s`` for a run that still goes on there."""
    _refuse_local_options(rh, opts.manager, opts.units_dir)
    echo(f"{rh.name}: rolling back over ssh ({rh.target})")
    request = agent_request(rh, rollback=opts)
    dry_note = f"on ssh's stdin: {request}"
    return _run_order(rh, "rollback", request, dry_note, opts.follow_s, runner, echo)


def _run_order(
    rh: RemoteHost,
    op: Literal["switch", "rollback"],
    request: str,
    dry_note: str,
    follow_s: float,
    runner: Runner,
    echo: Echo,
) -> HostOutcome:
    """Send ``request`` to the host's agent for ``op`` on ssh's stdin and follow the run to
    its outcome, once again through ``status`` when the connection drops."""
    try:
        reply = _call(rh, op, request, runner, echo)
    except _Lost as lost:
        return _after_lost(rh, op, lost, follow_s, runner, echo)
    if runner.dry_run:
        runner.note(dry_note)
        return HostOutcome(rh.name, "dry-run")
    return _outcome(rh, op, reply.report, follow_s)


def _call_quietly(
    rh: RemoteHost, op: AgentCommand, request: str, runner: Runner, echo: Echo
) -> _Reply:
    """``_call`` without echoing the agent's lines, for a command whose answer the caller
    reads; ``RemoteUnreachable`` when ssh cannot reach the host or loses it."""
    try:
        return _call(rh, op, request, runner, echo, show=False)
    except _Lost as lost:
        raise RemoteUnreachable(
            f"{rh.name}: lost {rh.target} over ssh: {lost.reply.result.last_error}"
        ) from None


def remote_status(rh: RemoteHost, follow_s: float, runner: Runner, echo: Echo) -> RunReport:
    """How the last fleet switch or rollback on the host ended; one that still runs is
    followed for ``follow_s`` at most (its progress echoed; ``running`` when it still runs
    then)."""
    request = _status_request(rh, follow_s)
    reply = _call_quietly(rh, "status", request, runner, echo)
    if runner.dry_run:
        runner.note(f"on ssh's stdin: {request}")
        return RunReport(None)
    assert reply.report is not None  # _check saw to it
    return reply.report


def remote_generations(rh: RemoteHost, runner: Runner) -> list[JsonObject]:
    """The remote host's generations, as ``llamanix generations --json`` lists them there."""
    reply = _call_quietly(rh, "generations", agent_request(rh), runner, runner.echo)
    return reply.generations or []


def remote_cache_step(
    rh: RemoteHost, step: CacheStep, runner: Runner, echo: Echo
) -> tuple[JsonObject, list[str]]:
    """One step of a cache move (switch/cache_moves.py), which the host's ``switch`` runs (a
    part of the switch: no command of its own in the sudoers line): its answer and the data
    lines it printed. ``RemoteUnreachable`` when ssh cannot reach the host or loses it; a dry
    run prints the ssh argv and answers nothing."""
    request = agent_request(rh, cache=step)
    reply = _call_quietly(rh, "switch", request, runner, echo)
    if runner.dry_run:
        runner.note(f"on ssh's stdin: {request}")
    return reply.answer or {}, reply.data
