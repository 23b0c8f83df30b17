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

Through sudo, the agent is root for whoever may ssh in: what it does is a deploy of this host,
and nothing else. The caller chooses no path: the directory, the units' directory and the
manager are this host's own (``/var/lib/llamanix/fleet``, ``/etc/systemd/system``, systemd),
and options that would steer them are refused. The host it names must be one of the config
received, of the kind this agent switches, and a plain file name. The directory is checked
before anything in it is read or written (this agent's own, mode 0700, no link, below
directories only root can change), and the files in it are opened without following links.
What the transient unit runs (``unit-switch``, ``unit-rollback``) takes no argument: it reads
its run's record in that directory, and refuses to run anywhere but in that unit.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
import tomlkit.items

from llamanix import __version__
from llamanix.bench.prompts import names_a_file
from llamanix.config.model import Config, suggest
from llamanix.core import file_reader
from llamanix.core import json_fields as jf
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.json_codec import JsonRecord, from_json_lenient
from llamanix.core.json_value import JsonObject
from llamanix.core.schema import TABLE_NAME
from llamanix.core.types import text_problem
from llamanix.external import systemctl
from llamanix.external.clock import now
from llamanix.external.files import atomic_write, locked
from llamanix.external.process import Runner
from llamanix.external.systemd_run import start_transient
from llamanix.fleet.commands import rollback_one_host, switch_one_host
from llamanix.fleet.protocol import (
    FORMATS,
    PROTOCOL,
    ConfigFormat,
    Hello,
    Op,
    RunReport,
    SwitchOrder,
)
from llamanix.hosts.listing import generation_rows
from llamanix.hosts.managers import user_units_dir
from llamanix.state.config_edit import parse_text
from llamanix.state.generations import HostState, ManagerKind
from llamanix.switch.switch_records import HostOutcome, RollbackOptions, SwitchOptions

Echo = Callable[[str], None]

UNIT = "llamanix-fleet"
SERVICE = f"{UNIT}.service"
SYSTEM_DIR = Path("/var/lib/llamanix/fleet")
# Where the system manager's units are: the only place a root agent's switch installs them.
SYSTEM_UNITS_DIR = Path("/etc/systemd/system")
# Another directory for the agent (tests, and hosts that keep state elsewhere); never through
# sudo, whose caller would choose it.
DIR_ENV = "LLAMANIX_FLEET_DIR"
# Where the system manager runs the run's unit (its cgroup, as /proc/self/cgroup names it).
SYSTEM_CGROUP = f"/system.slice/{SERVICE}"
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
            if not user and "SUDO_UID" in os.environ:
                raise UserError(
                    Problem(
                        DIR_ENV,
                        "",
                        f"is not for a fleet agent run through sudo: it keeps its state in "
                        f"{SYSTEM_DIR}",
                        f"leave {DIR_ENV} out",
                    )
                )
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
    def rollback_options(self) -> Path:
        """A rollback's options (its unit reads them)."""
        return self.root / "rollback-options.json"

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
        """Make the directory (mode 0700: only its owner reads the copy of the config and what
        the switches said), or check the one there."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with suppress(FileExistsError):
            os.mkdir(self.root, 0o700)
        self.check()

    def check_if_there(self) -> None:
        if os.path.lexists(self.root):
            self.check()

    def check(self) -> None:
        """Refuse a directory that is not this agent's alone: a link, another user's, one that
        others may read or write, or (for root) one below a directory that another user could
        change, who could then put a link in place of a file this agent writes."""
        root = str(self.root)
        st = os.lstat(self.root)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise UserError(
                Problem(
                    root,
                    "",
                    f"is {what}: the fleet agent keeps its state in a directory of its own",
                    "remove it; the next switch makes the directory",
                )
            )
        euid = os.geteuid()
        if st.st_uid != euid:
            raise UserError(
                Problem(
                    root,
                    "",
                    f"belongs to uid {st.st_uid}, not to the fleet agent's (uid {euid})",
                    f"see what it holds, then chown -R {euid} {root} or remove it",
                )
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode != 0o700:
            raise UserError(
                Problem(
                    root,
                    "",
                    f"has mode {mode:04o}: the fleet agent keeps its state where only it "
                    "reads and writes (0700)",
                    f"chmod 0700 {root}",
                )
            )
        if euid == 0:
            _check_above(self.root)


def _check_above(root: Path) -> None:
    """Every directory above a root agent's: root's, and writable by root alone (or sticky,
    as /tmp is: no one else can then move root's entries in it)."""
    real = Path(os.path.realpath(root.parent))
    for directory in (real, *real.parents):
        st = os.stat(directory)
        writable = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if st.st_uid != 0 or writable:
            raise UserError(
                Problem(
                    str(directory),
                    "",
                    f"holds the fleet agent's directory {root}, and another user could "
                    f"change it (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
                    "make it root's, and writable by root alone",
                )
            )


def _own_json(text: str) -> Any:
    """A record's JSON, as the reader parses it (no key twice, bounded nesting); ValueError
    when it does not parse."""
    try:
        return file_reader.parse_json(text, "record")
    except UserError as err:
        raise ValueError(err.problems[0].message) from None


def read_own(path: Path) -> str:
    """A file of the agent's directory: never through a link, only a regular file, at most
    the reader's bound (OSError for anything else)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = fh.read(file_reader.LIMIT + 1)
    if len(data) > file_reader.LIMIT:
        raise OSError(errno.EFBIG, "larger than a fleet record can be")
    return data.decode(errors="replace")


@dataclass(frozen=True)
class RunRecord(JsonRecord):
    """``run.json``: the last run started here, and whether its ending was reported; what
    the run's unit reads (the host, and the format of the config it switches)."""

    op: Op
    run: str
    host: str
    started: str
    reported: bool = False
    config_format: ConfigFormat = "toml"

    @staticmethod
    def read(d: FleetDir) -> RunRecord | None:
        """The last run's record; None before the first. One that does not read is one line
        naming the file: never taken for "no run yet", which would hide a run that goes on."""
        try:
            text = read_own(d.run_record)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise UserError(
                Problem(str(d.run_record), "", f"cannot be read: {err.strerror}")
            ) from None
        try:
            return RunRecord.from_json(_own_json(text), "")
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


def check_name(host: str, source: str) -> None:
    """The host's name as a caller sends it: one that names a file beside the config (its
    generations' directory) and prints as one line, before anything is read or written."""
    # The config's own name type (core.types): a name a config could never hold is refused
    # before anything is read, whatever config the caller sends with it.
    if text_problem(TABLE_NAME, host) is not None:
        raise UserError(
            Problem(
                source,
                "host",
                f"{json.dumps(host)} is not a host's name",
                "send the name of a host of the config",
            )
        )


def _check_host(config: Config, host: str, d: FleetDir, source: str) -> None:
    """``host`` is one of the config's, this machine (no target: the copy has its own
    host's taken out), of the kind this agent switches."""
    check_name(host, source)
    if host not in config.hosts:
        raise UserError(
            Problem(
                source,
                "host",
                f"no host {json.dumps(host)} in the config",
                suggest(host, tuple(config.hosts)),
            )
        )
    if config.hosts[host].target is not None:
        raise UserError(
            Problem(
                source,
                f"hosts.{host}.target",
                "is another machine: this fleet agent reads and switches only the host it "
                "was switched as",
                "name the host this machine is",
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
        return from_json_lenient(HostOutcome, _own_json(read_own(d.outcome)))
    except (OSError, ValueError):
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
    d: FleetDir, op: Op, host: str, fmt: ConfigFormat, run_timeout_s: float, runner: Runner
) -> RunRecord:
    """Start ``fleet-agent unit-OP`` of this very llamanix as the run's transient unit,
    stopped (SIGTERM, then SIGKILL 30 s later) once it ran ``run_timeout_s``: a run that
    hangs does not hold the host, nor the next switch of it, for ever. The unit takes no
    argument: what it runs is in the run's record and the options kept beside it."""
    for old in (d.outcome, d.log):
        old.unlink(missing_ok=True)
    record = RunRecord(op, secrets.token_hex(8), host, now(), config_format=fmt)
    record.save(d)
    limit = ["timeout", "--kill-after=30", f"{run_timeout_s:g}"]
    command = [*limit, sys.executable, "-m", "llamanix", "fleet-agent", f"unit-{op}"]
    # A transient unit starts from its manager's environment, not this one's (neither is set
    # through sudo, which keeps none of the caller's environment).
    env = {k: os.environ[k] for k in ("PYTHONPATH", DIR_ENV) if k in os.environ}
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


def _refuse_steering(
    source: str, manager: ManagerKind | None, units_dir: Path | None, sets: tuple[str, ...] = ()
) -> None:
    """Options a controller never sends to a host over ssh, which would steer where a root
    switch writes: the manager and the units' directory are this host's own, and the config
    arrives with --set applied."""
    fields = (("manager", manager), ("units_dir", units_dir), ("sets", sets or None))
    for name, value in fields:
        if value is not None:
            raise UserError(
                Problem(
                    source,
                    f"options.{name}",
                    "is not the caller's to choose: the fleet agent switches this host's own "
                    "units, with its own manager, to the config it receives",
                    f"leave {name} out (llamanix switch sends none to a host over ssh)",
                )
            )


def _refuse_prompts_file(source: str, opts: SwitchOptions) -> None:
    """The bench gate's prompts as a named set: a file would be one of this host's, read by
    root for the caller."""
    spec = opts.gate_prompts
    if spec is not None and names_a_file(spec):
        raise UserError(
            Problem(
                source,
                "options.gate_prompts",
                f"{json.dumps(spec)} names a file, which the fleet agent does not read for "
                "its caller",
                "use builtin, realtext or agent:N prompts for a host over ssh",
            )
        )


def start_switch(
    d: FleetDir, host: str, order: SwitchOrder, runner: Runner, echo: Echo
) -> RunRecord:
    """Check the request and the config received (one line per problem, before anything is
    written), keep them, and start the switch's unit (after waiting up to the options' --wait
    for a run that still goes on)."""
    source = "llamanix fleet-agent switch: stdin"
    opts, fmt = order.options, order.config_format
    _refuse_steering(source, opts.manager, opts.units_dir, opts.sets)
    _refuse_prompts_file(source, opts)
    opts.gate_kind(source)  # bad options: one line, nothing written
    check_name(host, source)
    d.make()
    with locked(d.lock):
        path = d.config(fmt)
        local = local_text(order.config, host, fmt, path)
        _check_host(parse_text(path, local), host, d, str(path))
        _settle_previous(d, runner, echo, opts.wait_s)
        # The first switch has no copy to go back to: the text is the copy from the start.
        atomic_write(path if not path.exists() else d.next_config(fmt), local, mode=0o600)
        atomic_write(d.options, json.dumps(opts.to_json()) + "\n", mode=0o600)
        return _start(d, "switch", host, fmt, opts.run_timeout_s, runner)


def local_config(d: FleetDir, host: str) -> tuple[Path, Config] | None:
    """The agent's copy of the config and what it says, once ``host`` is checked to be the
    host this machine was switched as; None before the first switch."""
    path = d.existing_config()
    if path is None:
        return None
    check_name(host, str(path))
    try:
        text = read_own(path)
    except OSError as err:
        raise UserError(Problem(str(path), "", f"cannot be read: {err.strerror}")) from None
    config = parse_text(path, text)
    _check_host(config, host, d, str(path))
    return path, config


def start_rollback(
    d: FleetDir, host: str, opts: RollbackOptions, runner: Runner, echo: Echo
) -> RunRecord:
    _refuse_steering("llamanix fleet-agent rollback: stdin", opts.manager, opts.units_dir)
    check_name(host, "llamanix fleet-agent rollback: stdin")
    d.make()
    with locked(d.lock):
        found = local_config(d, host)
        if found is None or not HostState.beside(found[0], host).generations():
            raise UserError(
                Problem(
                    str(d.root),
                    "host",
                    f"host '{host}' has no generations here",
                    "switch it first",
                )
            )
        _settle_previous(d, runner, echo, opts.wait_s)
        kept = RollbackOptions(opts.to, opts.timeout_s)
        atomic_write(d.rollback_options, json.dumps(kept.to_json()) + "\n", mode=0o600)
        fmt: ConfigFormat = "json" if found[0].suffix == ".json" else "toml"
        return _start(d, "rollback", host, fmt, opts.run_timeout_s, runner)


def _print_log(path: Path, pos: int, echo: Echo, final: bool) -> int:
    """Echo the log's complete lines from byte ``pos`` on (every line when ``final``);
    where the next read starts."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return pos
    with os.fdopen(fd, "rb") as fh:
        fh.seek(pos)
        data = fh.read()
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
    found = local_config(d, host)
    if found is None:
        return []
    path, config = found
    return [row.to_json() for row in generation_rows(config, HostState.beside(path, host))]


# --- inside the unit ---------------------------------------------------------------------------


def _cgroups(pid: str) -> dict[str, str]:
    """A process's cgroup in the hierarchies systemd keeps its units in: the unified one and,
    on a hybrid or legacy machine, name=systemd."""
    found: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers in ("", "name=systemd"):
            found[controllers] = path
    return found


def in_run_unit(d: FleetDir) -> bool:
    """Whether this process runs in the run's unit, which only the manager puts a process in.
    For root, the system manager's: its cgroup is system.slice/llamanix-fleet.service beside
    the manager's own init.scope (a user's own manager could give a unit of its own the same
    name, but under the user's slice). A container without a cgroup namespace of its own sees
    the host's path above both."""
    if d.user:
        return True  # a user's agent does nothing its user could not
    try:
        own, manager = _cgroups("self"), _cgroups("1")
    except OSError:
        return False
    for hierarchy, path in own.items():
        init = manager.get(hierarchy, "")
        root = init.removesuffix("/init.scope") if init.endswith("/init.scope") else ""
        if path == root + SYSTEM_CGROUP:
            return True
    return False


def unit_record(d: FleetDir, op: Op) -> RunRecord:
    """The run the unit runs, as its agent recorded it (one line when this is not that unit,
    or there is no such run)."""
    source = f"llamanix fleet-agent unit-{op}"
    if not in_run_unit(d):
        raise UserError(
            Problem(
                source,
                "",
                f"runs only as the fleet's own unit {SERVICE}, which `llamanix fleet-agent "
                f"{op}` starts",
                f"run llamanix {op} from the controller",
            )
        )
    d.check()
    record = RunRecord.read(d)
    if record is None or record.op != op:
        raise UserError(Problem(str(d.run_record), "", f"records no fleet {op} to run"))
    return record


def _own_manager(d: FleetDir) -> tuple[ManagerKind, Path]:
    """The manager this agent switches with, and its units' directory: this host's own."""
    return ("systemd-user", user_units_dir()) if d.user else ("systemd", SYSTEM_UNITS_DIR)


@contextmanager
def _logged(d: FleetDir, echo: Echo) -> Iterator[Echo]:
    """``echo`` (the journal) that also appends each line to the run's log, which the agent
    follows (created in the agent's directory, never through a link)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(d.log, flags, 0o600)
    except OSError as err:
        raise UserError(Problem(str(d.log), "", f"cannot be written: {err.strerror}")) from None
    with os.fdopen(fd, "a", buffering=1) as fh:

        def both(line: str) -> None:
            echo(line)
            fh.write(line + "\n")
            fh.flush()

        yield both


def _write_outcome(d: FleetDir, outcome: HostOutcome) -> None:
    atomic_write(d.outcome, json.dumps(outcome.to_json()) + "\n", mode=0o600)


def unit_switch(d: FleetDir, echo: Echo) -> HostOutcome:
    """The switch itself, in the unit: the kept copy switched to the text received with the
    options received (the ordinary switch, gate and restore) by this host's own manager, its
    outcome written for the agent."""
    record = unit_record(d, "switch")
    host, fmt = record.host, record.config_format
    path, upcoming = d.config(fmt), d.next_config(fmt)
    manager, units_dir = _own_manager(d)
    with _logged(d, echo) as log:
        try:
            opts = replace(_read_options(d), manager=manager, units_dir=units_dir)
            new_text = read_own(upcoming) if os.path.lexists(upcoming) else None
            outcome = switch_one_host(path, host, opts, Runner(echo=log), log, new_text)
        except (UserError, ExternalCommandError) as err:
            log(f"{host}: {err}")
            outcome = HostOutcome(host, "failed", detail=str(err))
        finally:
            upcoming.unlink(missing_ok=True)
        _write_outcome(d, outcome)
    return outcome


def _read_options(d: FleetDir) -> SwitchOptions:
    try:
        return SwitchOptions.from_json(_own_json(read_own(d.options)), "options")
    except (OSError, ValueError) as err:
        raise UserError(Problem(str(d.options), "", f"not the switch's options: {err}")) from None


def _read_rollback_options(d: FleetDir) -> RollbackOptions:
    path = d.rollback_options
    try:
        return RollbackOptions.from_json(_own_json(read_own(path)), "options")
    except (OSError, ValueError) as err:
        raise UserError(Problem(str(path), "", f"not the rollback's options: {err}")) from None


def unit_rollback(d: FleetDir, echo: Echo) -> HostOutcome:
    """The rollback itself, in the unit, as ``llamanix rollback`` runs it here with this
    host's own manager."""
    host = unit_record(d, "rollback").host
    path = d.existing_config()
    manager, units_dir = _own_manager(d)
    with _logged(d, echo) as log:
        before = HostState.beside(path, host).current() if path else None
        previous = before.number if before else None
        started = time.monotonic()
        try:
            if path is None:
                raise UserError(Problem(str(d.root), "", "no config here"))
            kept = _read_rollback_options(d)
            opts = RollbackOptions(kept.to, kept.timeout_s, manager=manager, units_dir=units_dir)
            number = rollback_one_host(path, host, opts, Runner(echo=log), log)
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
