"""The remote side of a fleet switch: what ``llamanix fleet-agent`` does on a plain-systemd host
that another machine switches over ssh (fleet/remote.py is that other side).

The agent keeps its own copy of the config in its directory (``/var/lib/llamanix/fleet`` for
root, mode 0700; ``~/.local/state/llamanix/fleet`` for a user's units), with ``target`` left out
of its own host's table: on this machine that host is local, so the ordinary switch runs it and
the host's generations live beside the copy (``.llamanix-state/HOST``).

A switch or rollback does not run in the ssh session: it runs as the transient unit
``llamanix-fleet.service`` of the host's own systemd (``systemd-run``), so a dropped connection
or a killed agent neither stops it half-way (the gate, and the restore after a failed gate,
finish by themselves) nor leaves it unrecorded (its outcome goes to ``outcome.json``). The
agent starts the unit, prints what the unit writes to ``run.log`` as it comes (the same lines
go to the journal), and once the unit's process has ended prints the outcome (the machine
line, fleet/protocol.py). ``status`` tells how the last run ended (following one that
still runs), and whether an agent reported that ending before.

The unit writes its progress to a file the agent reads, rather than the agent following the
journal: a user's journal needs persistent storage to be readable by that user, and a file
read after the process ended cannot miss a line.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import tomlkit
import tomlkit.exceptions
import tomlkit.items

from llamanix import __version__
from llamanix.core import file_reader
from llamanix.core import json_fields as jf
from llamanix.core.config import Config, suggest
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import JsonRecord, from_json_lenient
from llamanix.core.json_value import JsonObject
from llamanix.deploy.config_edit import lenient_parse, parse_text
from llamanix.deploy.fleet.commands import rollback, switch
from llamanix.deploy.fleet.protocol import (
    FORMATS,
    PROTOCOL,
    ConfigFormat,
    Hello,
    Op,
    RunReport,
    SwitchOrder,
)
from llamanix.deploy.generations import HostState
from llamanix.deploy.listing import generation_rows
from llamanix.deploy.switch_records import HostOutcome, RollbackOptions, SwitchOptions
from llamanix.external import systemctl
from llamanix.external.clock import now
from llamanix.external.files import atomic_write, locked
from llamanix.external.process import Runner
from llamanix.external.systemd_run import start_transient

Echo = Callable[[str], None]

UNIT = "llamanix-fleet"
SERVICE = f"{UNIT}.service"
SYSTEM_DIR = Path("/var/lib/llamanix/fleet")
# Another directory for the agent (tests, and hosts that keep state elsewhere).
DIR_ENV = "LLAMANIX_FLEET_DIR"
# How often a running unit is looked at while it is followed.
POLL_S = 0.2
# The exit status of coreutils' timeout when the run it started ran past its limit.
TIMED_OUT = 124


def hello() -> Hello:
    return Hello(PROTOCOL, __version__)


@dataclass(frozen=True)
class FleetDir:
    """The agent's directory, and whether it works with a user's units (not root)."""

    root: Path
    user: bool

    @staticmethod
    def here() -> FleetDir:
        user = os.geteuid() != 0
        override = os.environ.get(DIR_ENV)
        if override:
            return FleetDir(Path(override), user)
        if not user:
            return FleetDir(SYSTEM_DIR, False)
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return FleetDir(Path(state) / "llamanix" / "fleet", True)

    def config(self, fmt: ConfigFormat) -> Path:
        return self.root / f"llamanix.{fmt}"

    def next_config(self, fmt: ConfigFormat) -> Path:
        """The text a switch goes to, beside the copy the switch restores when its gate
        fails (the switch writes it over the copy once it passes)."""
        return self.root / f"llamanix.next.{fmt}"

    def existing_config(self) -> Path | None:
        return next((p for p in map(self.config, FORMATS) if p.is_file()), None)

    @property
    def options(self) -> Path:
        """The switch's options, beside the text it goes to (its unit reads them)."""
        return self.root / "switch-options.json"

    @property
    def run_record(self) -> Path:
        return self.root / "run.json"

    @property
    def outcome(self) -> Path:
        return self.root / "outcome.json"

    @property
    def log(self) -> Path:
        return self.root / "run.log"

    @property
    def lock(self) -> Path:
        return self.root / "agent.lock"

    def make(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Only its owner reads the copy of the config and what the switches said.
        os.chmod(self.root, 0o700)


@dataclass(frozen=True)
class RunRecord(JsonRecord):
    """``run.json``: the last run started here, and whether its ending was reported."""

    op: Op
    run: str
    host: str
    started: str
    reported: bool = False

    @staticmethod
    def read(d: FleetDir) -> RunRecord | None:
        """The last run's record; None before the first. One that does not read is one line
        naming the file: never taken for "no run yet", which would hide a run that goes on."""
        try:
            text = file_reader.text_if_present(d.run_record, source=str(d.run_record))
            if text is None:
                return None
            return RunRecord.from_json(file_reader.parse_json(text, str(d.run_record)), "")
        except file_reader.FileRefused as err:
            raise UserError(
                Problem(
                    str(d.run_record),
                    "",
                    f"not a fleet run's record: {err.problems[0].message}",
                    "see `systemctl status llamanix-fleet` there, then remove the file",
                )
            ) from None
        except ValueError as err:
            raise UserError(
                Problem(
                    str(d.run_record),
                    "",
                    f"not a fleet run's record: {err}",
                    "see `systemctl status llamanix-fleet` there, then remove the file",
                )
            ) from None

    def save(self, d: FleetDir) -> None:
        atomic_write(d.run_record, json.dumps(self.to_json()) + "\n", mode=0o600)


# --- the config copy ---------------------------------------------------------------------------


def local_text(text: str, host: str, fmt: ConfigFormat, source: Path) -> str:
    """The config as this host keeps it: ``text`` with ``target`` left out of the host's own
    table (comments and layout kept), so that on this machine the host is local."""
    if fmt == "json":
        try:
            data = json.loads(text)
        except ValueError as err:
            raise UserError(Problem(str(source), "", f"syntax error: {err}")) from None
        table = jf.table(jf.table(data).get("hosts")).get(host)
        if isinstance(table, dict):
            table.pop("target", None)
        return json.dumps(data, indent=2) + "\n"
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        raise UserError(Problem(str(source), "", f"TOML syntax error: {err}")) from None
    hosts = doc.get("hosts")
    table = hosts.get(host) if isinstance(hosts, dict) else None
    if isinstance(table, dict) and "target" in table:
        del table["target"]
    return tomlkit.dumps(doc)


def _check_host(config: Config, host: str, d: FleetDir, source: str) -> None:
    if host not in config.hosts:
        raise UserError(
            Problem(
                source,
                "--host",
                f"no host '{host}' in the config",
                suggest(host, tuple(config.hosts)),
            )
        )
    kind = config.hosts[host].kind
    want = "systemd-user" if d.user else "systemd"
    if kind != want:
        runs_as = "a user's (no sudo)" if d.user else "root's (through sudo)"
        raise UserError(
            Problem(
                source,
                f"hosts.{host}.kind",
                f"is '{kind}', but this fleet agent runs as {runs_as}",
                f"a '{want}' host is what it switches",
            )
        )


# --- the run's unit ----------------------------------------------------------------------------


def _unit_word(state: systemctl.UnitState) -> str:
    """systemd's word on how the unit is, for the report."""
    if state.load_state != "loaded":
        return "unit gone (collected, or the host rebooted)"
    if state.runs:
        return "running"
    if state.main_status == TIMED_OUT:
        return "stopped: it ran past its --run-timeout"
    status = f", exit status {state.main_status}" if state.main_status else ""
    return f"{state.active_state} ({state.result}{status})"


def _read_outcome(d: FleetDir) -> HostOutcome | None:
    try:
        data = file_reader.json_if_present(d.outcome, source=str(d.outcome))
        return None if data is None else from_json_lenient(HostOutcome, data)
    except (UserError, ValueError):
        return None


def _report(d: FleetDir, record: RunRecord, state: systemctl.UnitState) -> RunReport:
    return RunReport(
        record.op,
        record.run,
        record.host,
        record.started,
        _unit_word(state),
        record.reported,
        None if state.runs else _read_outcome(d),
        running=state.runs,
    )


def _settle_previous(d: FleetDir, runner: Runner, echo: Echo, wait_s: float) -> None:
    """Make way for a new run: wait up to ``wait_s`` for the last one to end, then refuse
    while it runs; say how it ended if no agent has yet; stop and forget its unit (a
    transient unit that ended stays loaded, with RemainAfterExit= or as failed, and its name
    would be taken)."""
    state = systemctl.show(d.user, SERVICE)
    deadline = time.monotonic() + wait_s
    while state.runs and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = systemctl.show(d.user, SERVICE)
    record = RunRecord.read(d)
    if state.runs:
        what = f"a fleet {record.op} started at {record.started}" if record else f"{SERVICE}"
        raise UserError(
            Problem(
                str(d.root),
                "",
                f"{what} still runs",
                "llamanix fleet-agent status follows it",
            )
        )
    if record is not None and not record.reported:
        echo(f"the previous {_report(d, record, state).summary()}")
        replace(record, reported=True).save(d)
    if state.load_state == "loaded":
        systemctl.stop(runner, d.user, [SERVICE])
        systemctl.reset_failed(runner, d.user, [SERVICE])


def _start(
    d: FleetDir, op: Op, host: str, args: Sequence[str], run_timeout_s: float, runner: Runner
) -> RunRecord:
    """Start ``fleet-agent ARGS`` of this very llamanix as the run's transient unit, stopped
    (SIGTERM, then SIGKILL 30 s later) once it ran ``run_timeout_s``: a run that hangs does
    not hold the host, nor the next switch of it, for ever."""
    for old in (d.outcome, d.log):
        old.unlink(missing_ok=True)
    record = RunRecord(op, secrets.token_hex(8), host, now())
    record.save(d)
    limit = ["timeout", "--kill-after=30", f"{run_timeout_s:g}"]
    command = [*limit, sys.executable, "-m", "llamanix", "fleet-agent", *args]
    command += ["--host", host, "--dir", str(d.root)]
    # A transient unit starts from its manager's environment, not this one's.
    env = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    properties = [
        "Type=exec",  # systemd-run fails when the program cannot be started
        "RemainAfterExit=yes",  # it stays loaded once done: its result can be read
        "StandardOutput=journal",
        "StandardError=journal",
    ]
    start_transient(
        runner, d.user, UNIT, f"llamanix fleet {op} of {host}", properties, env, command
    )
    return record


def start_switch(
    d: FleetDir, host: str, order: SwitchOrder, runner: Runner, echo: Echo
) -> RunRecord:
    """Check the config received (one line per problem, before anything is written), keep
    it and the options, and start the switch's unit (after waiting up to the options' --wait
    for a run that still goes on)."""
    opts, fmt = order.options, order.config_format
    opts.gate_kind("llamanix fleet-agent switch")  # bad options: one line, nothing written
    d.make()
    with locked(d.lock):
        _settle_previous(d, runner, echo, opts.wait_s)
        path = d.config(fmt)
        local = local_text(order.config, host, fmt, path)
        _check_host(parse_text(path, local), host, d, str(path))
        # The first switch has no copy to go back to: the text is the copy from the start.
        atomic_write(path if not path.exists() else d.next_config(fmt), local, mode=0o600)
        atomic_write(d.options, json.dumps(opts.to_json()) + "\n", mode=0o600)
        args = ["unit-switch", "--format", fmt]
        return _start(d, "switch", host, args, opts.run_timeout_s, runner)


def start_rollback(
    d: FleetDir, host: str, opts: RollbackOptions, runner: Runner, echo: Echo
) -> RunRecord:
    d.make()
    with locked(d.lock):
        _settle_previous(d, runner, echo, opts.wait_s)
        path = d.existing_config()
        if path is None or not HostState.beside(path, host).generations():
            raise UserError(
                Problem(
                    str(d.root),
                    "--host",
                    f"host '{host}' has no generations here",
                    "switch it first",
                )
            )
        args = ["unit-rollback", "--timeout", repr(opts.timeout_s)]
        args += ["--to", str(opts.to)] if opts.to is not None else []
        return _start(d, "rollback", host, args, opts.run_timeout_s, runner)


def _print_log(path: Path, pos: int, echo: Echo, final: bool) -> int:
    """Echo the log's complete lines from byte ``pos`` on (every line when ``final``);
    where the next read starts."""
    try:
        with path.open("rb") as fh:
            fh.seek(pos)
            data = fh.read()
    except FileNotFoundError:
        return pos
    end = len(data) if final else data.rfind(b"\n") + 1
    for line in data[:end].decode(errors="replace").splitlines():
        echo(line)
    return pos + end


def follow(d: FleetDir, record: RunRecord, echo: Echo, deadline_s: float) -> RunReport:
    """Echo the run's progress until its process has ended, or for ``deadline_s`` at most;
    how it ended (``running`` when it still runs then: it goes on by itself)."""
    pos = 0
    deadline = time.monotonic() + deadline_s
    while True:
        # The unit's state first: once it says ended, the log read after it is complete.
        state = systemctl.show(d.user, SERVICE)
        pos = _print_log(d.log, pos, echo, final=not state.runs)
        if not state.runs or time.monotonic() >= deadline:
            if state.runs:
                echo(
                    f"the fleet {record.op} of {record.host} started {record.started} still "
                    f"runs after {deadline_s:g} s of following; it goes on by itself"
                )
            return _report(d, record, state)
        time.sleep(POLL_S)


def status(d: FleetDir, echo: Echo, deadline_s: float) -> RunReport:
    """How the last run ended; one that still runs is followed for ``deadline_s`` at most."""
    record = RunRecord.read(d)
    if record is None:
        return RunReport(None)
    state = systemctl.show(d.user, SERVICE)
    if state.runs:
        echo(f"following the fleet {record.op} of {record.host} started {record.started}")
        return follow(d, record, echo, deadline_s)
    return _report(d, record, state)


def mark_reported(d: FleetDir, report: RunReport) -> None:
    """The run's ending was printed: the next agent need not say it again."""
    if report.run is None or report.running:
        return
    with locked(d.lock):
        record = RunRecord.read(d)
        # Only that run's: a switch started since has a record of its own.
        if record is not None and record.run == report.run and not record.reported:
            replace(record, reported=True).save(d)


def generations(d: FleetDir, host: str) -> list[JsonObject]:
    """The host's generations here, as ``llamanix generations --json`` lists them."""
    path = d.existing_config()
    if path is None:
        return []
    config = lenient_parse(path, file_reader.read_text(path, source=str(path)))
    if config is not None and host not in config.hosts:
        config = None
    return [row.to_json() for row in generation_rows(config, HostState.beside(path, host))]


# --- inside the unit ---------------------------------------------------------------------------


@contextmanager
def _logged(d: FleetDir, echo: Echo) -> Iterator[Echo]:
    """``echo`` (the journal) that also appends each line to the run's log, which the agent
    follows."""
    with d.log.open("a", buffering=1) as fh:

        def both(line: str) -> None:
            echo(line)
            fh.write(line + "\n")
            fh.flush()

        yield both


def _write_outcome(d: FleetDir, outcome: HostOutcome) -> None:
    atomic_write(d.outcome, json.dumps(outcome.to_json()) + "\n", mode=0o600)


def unit_switch(d: FleetDir, host: str, fmt: ConfigFormat, echo: Echo) -> HostOutcome:
    """The switch itself, in the unit: the kept copy switched to the text received with the
    options received (the ordinary switch, gate and restore), its outcome written for the
    agent."""
    path, upcoming = d.config(fmt), d.next_config(fmt)
    with _logged(d, echo) as log:
        try:
            opts = _read_options(d)
            new_text = file_reader.text_if_present(upcoming, source=str(upcoming))
            outcome = switch(path, host, opts, Runner(echo=log), log, new_text)
        except (UserError, ExternalCommandError) as err:
            log(f"{host}: {err}")
            outcome = HostOutcome(host, "failed", detail=str(err))
        finally:
            upcoming.unlink(missing_ok=True)
        _write_outcome(d, outcome)
    return outcome


def _read_options(d: FleetDir) -> SwitchOptions:
    try:
        data = file_reader.read_json(d.options, source=str(d.options))
        return SwitchOptions.from_json(data, "options")
    except file_reader.FileRefused as err:
        message = err.problems[0].message
    except ValueError as err:
        message = str(err)
    raise UserError(Problem(str(d.options), "", f"not the switch's options: {message}"))


def unit_rollback(
    d: FleetDir, host: str, to: int | None, timeout_s: float, echo: Echo
) -> HostOutcome:
    """The rollback itself, in the unit, as ``llamanix rollback`` runs it here."""
    path = d.existing_config()
    with _logged(d, echo) as log:
        before = HostState.beside(path, host).current() if path else None
        previous = before.number if before else None
        started = time.monotonic()
        try:
            if path is None:
                raise UserError(Problem(str(d.root), "--host", "no config here"))
            opts = RollbackOptions(to, timeout_s)
            number = rollback(path, host, opts, Runner(echo=log), log)
            # Out of service: the whole rollback, at most (its units restart within it).
            outcome = HostOutcome(
                host,
                "passed",
                number,
                previous=previous,
                out_of_service_s=time.monotonic() - started,
            )
        except (UserError, ExternalCommandError) as err:
            log(f"{host}: {err}")
            outcome = HostOutcome(host, "failed", detail=str(err), previous=previous)
        _write_outcome(d, outcome)
    return outcome
