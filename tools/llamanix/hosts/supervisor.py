"""``llamanix up``: a small service manager for machines (and tests) without systemd.

It runs a host's instances in the foreground from a render directory (``llamanix-NAME.service``,
``NAME.argv.json``, ``manifest.json``): the command line is ``NAME.argv.json`` (the unit's
ExecStart with the real key file path in place of systemd's credential), the environment and
the restart policy (``Restart=``, ``RestartSec=``, ``StartLimitBurst=``,
``StartLimitIntervalSec=``) are read from the unit.

Control: ``up`` polls the directory's ``manifest.json`` (which ``switch`` and ``render`` write
last, atomically). When it changes, the instances whose command line, environment or policy
changed are restarted, new ones started and removed ones stopped. After every change of state
``up`` writes ``up-status.json`` beside the manifest (the manifest's hash, and per instance a
key of what it runs, its state and the last error), which is how ``switch`` learns that the
new set has been picked up and whether each instance came up. A file needs no extra IPC, works
the same for any number of readers, and survives a reader that crashes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from llamanix.config.argv import SLOT_SAVE_FLAG, state_dir_spec
from llamanix.core import file_reader
from llamanix.core.errors import ExternalCommandError, Problem, UserError
from llamanix.core.process_end import describe_returncode
from llamanix.external.llama_server import ServerStartError
from llamanix.external.process import CommandTimedOut, run_captured
from llamanix.render import systemd
from llamanix.render.manifest import MANIFEST, Manifest
from llamanix.server.server_process import LlamaServer, tail
from llamanix.state.up_status import (
    STATUS,
    UpInstance,
    UpState,
    UpStatus,
    read_status,
    write_status,
)

POLL_S = 0.25
# llama-server has no readiness notification; a model load of this long is treated as failed.
DEFAULT_START_TIMEOUT_S = 300.0
_TIME = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?")
_UNITS_S = {None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}

Log = Callable[[str], None]


def parse_timespan(text: str) -> float:
    """systemd time spans as the renderer writes them: ``10s``, ``10min``, ``500ms``, ``5``."""
    total = 0.0
    pos = 0
    text = text.strip()
    for match in _TIME.finditer(text):
        if text[pos : match.start()].strip():
            break
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a time span: {text!r}")
    return total


@dataclass(frozen=True)
class ServiceSpec:
    """What ``up`` runs for one instance, and how it restarts it."""

    name: str
    unit: str
    argv: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    restart: str = "on-failure"
    restart_sec: float = 10.0
    start_limit_burst: int = 5
    start_limit_interval_s: float = 600.0
    # ExecStartPost= commands (the readiness check) with systemd's $MAINPID still in place, and
    # the credential files (LoadCredential=) they may name as %d/NAME.
    start_post: tuple[tuple[str, ...], ...] = ()
    credentials: tuple[tuple[str, str], ...] = ()
    start_timeout_s: float | None = None

    def start_post_argv(self, pid: int) -> list[list[str]]:
        """The ExecStartPost= commands as ``up`` runs them for the server with this pid."""
        creds = dict(self.credentials)

        def word(w: str) -> str:
            if w == "$MAINPID":
                return str(pid)
            m = re.fullmatch(r"%d/(.+)", w)
            if m and m.group(1) in creds:
                return creds[m.group(1)]
            return w.replace("%%", "%").replace("$$", "$")

        return [[word(w) for w in argv] for argv in self.start_post]

    @property
    def key(self) -> str:
        data = json.dumps(
            [
                self.argv,
                self.environment,
                self.restart,
                self.restart_sec,
                self.start_limit_burst,
                self.start_limit_interval_s,
                self.start_post,
                self.start_timeout_s,
            ]
        )
        return hashlib.sha256(data.encode()).hexdigest()[:16]


def unit_settings(text: str) -> dict[str, list[str]]:
    """``Key=value`` lines of a unit (all sections; keys may repeat), read as systemd reads
    them (render/systemd.py: continuation lines joined, comments dropped)."""
    out: dict[str, list[str]] = {}
    for section in systemd.read_unit(text).values():
        for key, values in section.items():
            out.setdefault(key, []).extend(values)
    return out


def expand_specifiers(value: str, cache_dir: Path) -> str:
    # %C is systemd's cache directory; under ``up`` it is the render directory's cache/.
    return systemd.expand_specifiers(value, {"C": str(cache_dir)})


def state_dir(units_dir: Path, name: str) -> Path:
    """Where ``up`` keeps an instance's state directory (systemd's %S/llamanix-NAME)."""
    return units_dir / "state" / f"llamanix-{name}"


def expand_argv(argv: list[str], units_dir: Path, name: str) -> tuple[str, ...]:
    """The argv as ``up`` runs it: the state directory a warm switch saves caches to (named by
    its systemd specifier, the one word of an argv file that is not taken literally) is the
    render directory's state/llamanix-NAME."""
    spec = state_dir_spec(name)
    return tuple(
        str(state_dir(units_dir, name)) if w == spec and i and argv[i - 1] == SLOT_SAVE_FLAG else w
        for i, w in enumerate(argv)
    )


def unit_environment(values: list[str], cache_dir: Path) -> list[tuple[str, str]]:
    """Environment= lines as systemd reads them (render/systemd.py, the writer's reader)."""
    env: list[tuple[str, str]] = []
    for value in values:
        env += systemd.assignments(value, {"C": str(cache_dir)})
    return env


def one_line(message: str) -> str:
    """A start failure in one line: its first line and the log's last line (llama-server
    ends its log with why it exits, e.g. "exiting due to model loading error")."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) < 2:
        return lines[0] if lines else message
    last = re.sub(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ", "", lines[-1])  # llama.cpp's time and level
    return f"{lines[0].rstrip(':')}: {last}"


def manifest_digest(units_dir: Path) -> str | None:
    path = units_dir / MANIFEST
    try:
        data = file_reader.read_bytes(path, source=str(path))
    except file_reader.FileRefused as err:
        if err.errno == errno.ENOENT:
            return None
        raise
    return hashlib.sha256(data).hexdigest()


def _exec_argv(line: str) -> tuple[str, ...]:
    """An Exec*= line's words, as systemd reads them. Its privilege prefix ("+": run outside
    the sandbox, as root) means nothing here: ``up`` runs every command as its own user,
    unsandboxed."""
    return tuple(systemd.exec_argv(line)[1])


def load_specs(units_dir: Path) -> dict[str, ServiceSpec]:
    """The services a render directory describes; UserError when it is not a render."""
    manifest = Manifest.load(units_dir, "run llamanix up CONFIG or llamanix render first")
    cache = units_dir / "cache"
    specs: dict[str, ServiceSpec] = {}
    for name, entry in manifest.instances.items():
        unit = entry.unit
        try:
            argv = file_reader.read_json(units_dir / f"{name}.argv.json")
            settings = unit_settings(file_reader.read_text(units_dir / unit))
        except file_reader.FileRefused as err:
            raise UserError(Problem(str(units_dir), name, f"incomplete render: {err}")) from None
        if not isinstance(argv, list):
            raise UserError(
                Problem(str(units_dir), name, f"incomplete render: {name}.argv.json is not a list")
            )
        try:
            specs[name] = ServiceSpec(
                name=name,
                unit=unit,
                argv=expand_argv([str(a) for a in argv], units_dir, name),
                environment=tuple(unit_environment(settings.get("Environment", []), cache)),
                restart=settings.get("Restart", ["no"])[-1],
                restart_sec=parse_timespan(settings.get("RestartSec", ["100ms"])[-1]),
                start_limit_burst=int(settings.get("StartLimitBurst", ["5"])[-1]),
                start_limit_interval_s=parse_timespan(
                    settings.get("StartLimitIntervalSec", ["10s"])[-1]
                ),
                start_post=tuple(_exec_argv(v) for v in settings.get("ExecStartPost", [])),
                credentials=tuple(
                    tuple(systemd.expand_specifiers(v).split(":", 1))  # type: ignore[misc]
                    for v in settings.get("LoadCredential", [])
                    if ":" in v
                ),
                start_timeout_s=(
                    parse_timespan(settings["TimeoutStartSec"][-1])
                    if "TimeoutStartSec" in settings
                    else None
                ),
            )
        except ValueError as err:
            raise UserError(Problem(str(units_dir / unit), "", str(err))) from None
    return specs


@dataclass
class InstanceState:
    spec: ServiceSpec
    state: UpState = "starting"
    pid: int | None = None
    url: str | None = None
    starts: int = 0
    last_error: str | None = None

    def entry(self) -> UpInstance:
        return UpInstance(
            self.spec.key, self.state, self.pid, self.url, self.starts, self.last_error
        )


@dataclass
class ServiceRunner:
    """One instance: start, watch, restart per its policy, until told to stop."""

    spec: ServiceSpec
    log_dir: Path
    start_timeout_s: float
    on_change: Callable[[], None]
    log: Log
    status: InstanceState = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _server: LlamaServer | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.status = InstanceState(self.spec)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.spec.name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()
        server = self._server
        if server is not None:
            server.stop()  # also ends a start that is still waiting for /health

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._server is not None:
            self._server.stop()

    def _set(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.status, key, value)
        self.on_change()

    def _run(self) -> None:
        name = self.spec.name
        starts: deque[float] = deque()
        env = {**os.environ, **dict(self.spec.environment)}
        for key, value in self.spec.environment:
            if key in ("HOME", "LLAMA_CACHE"):
                Path(value).mkdir(parents=True, exist_ok=True)
        for flag, value in itertools.pairwise(self.spec.argv):
            if flag == SLOT_SAVE_FLAG:
                # As StateDirectory= makes it; llama-server refuses a path that is no directory.
                Path(value).mkdir(mode=0o700, parents=True, exist_ok=True)
        while not self._stop.is_set():
            now = time.monotonic()
            while starts and now - starts[0] > self.spec.start_limit_interval_s:
                starts.popleft()
            if len(starts) >= self.spec.start_limit_burst:
                # One line, as systemd's "Start request repeated too quickly", with the cause.
                self.log(
                    f"[{name}] start limit hit ({len(starts)} starts within "
                    f"{self.spec.start_limit_interval_s:g}s, StartLimitBurst="
                    f"{self.spec.start_limit_burst}); not restarting. Last error: "
                    f"{self.status.last_error}"
                )
                self._set(state="failed", pid=None)
                return
            starts.append(now)
            server = LlamaServer(
                list(self.spec.argv),
                self.log_dir / f"{name}.log",
                env=env,
                start_timeout_s=self.start_timeout_s,
            )
            self._server = server
            self._set(state="starting", starts=self.status.starts + 1, pid=None)
            try:
                server.start()
            except (ServerStartError, ExternalCommandError) as err:
                if self._stop.is_set():
                    break
                error = one_line(str(err))
                self.log(f"[{name}] failed to start: {error}")
                if not self._restart_after(error):
                    return
                continue
            if self._stop.is_set():
                break
            not_ready = self._start_post(server, env)
            if not_ready is not None:
                server.stop()
                if self._stop.is_set():
                    break
                self.log(f"[{name}] failed to start: {not_ready}")
                if not self._restart_after(not_ready):
                    return
                continue
            self.log(f"[{name}] serving at {server.url} (pid {server.pid})")
            self._set(state="running", pid=server.pid, url=server.url, last_error=None)
            assert server.process is not None
            while not self._stop.is_set() and server.process.poll() is None:
                with contextlib.suppress(Exception):
                    server.process.wait(timeout=POLL_S)
            if self._stop.is_set():
                break
            code = server.process.returncode
            server.stop()
            error = f"{describe_returncode(code)}: {tail(server.log_text(), 3)}"
            self.log(f"[{name}] {error}")
            if code == 0 and self.spec.restart == "on-failure":
                self._set(state="exited", pid=None, last_error=error)
                return
            if not self._restart_after(error):
                return
        if self._server is not None:
            self._server.stop()
        self._set(state="stopped", pid=None)

    def _start_post(self, server: LlamaServer, env: dict[str, str]) -> str | None:
        """Run ExecStartPost= as systemd would; the first failure's line, or None."""
        assert server.pid is not None
        timeout = self.spec.start_timeout_s or self.start_timeout_s
        for argv in self.spec.start_post_argv(server.pid):
            try:
                done = run_captured(argv, env=env, timeout_s=timeout)
            except CommandTimedOut:
                return f"ExecStartPost timed out after {timeout:g}s: {argv[0]}"
            except ExternalCommandError as err:
                return f"ExecStartPost {err}"
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                return f"ExecStartPost exited with {done.returncode}: {lines[-1] if lines else ''}"
        return None

    def _restart_after(self, error: str) -> bool:
        if self.spec.restart not in ("on-failure", "always", "on-abnormal"):
            self._set(state="failed", pid=None, last_error=error)
            return False
        self._set(state="restarting", pid=None, last_error=error)
        self.log(f"[{self.spec.name}] restarting in {self.spec.restart_sec:g}s")
        return not self._stop.wait(self.spec.restart_sec)


@dataclass
class Supervisor:
    """Runs every instance of a render directory and follows changes to it."""

    units_dir: Path
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    log: Log = print
    runners: dict[str, ServiceRunner] = field(default_factory=dict)
    digest: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _shutdown: threading.Event = field(default_factory=threading.Event)

    def claim(self) -> None:
        other = read_status(self.units_dir)
        if other is not None and other.pid != os.getpid():
            raise UserError(
                Problem(
                    str(self.units_dir),
                    "",
                    f"llamanix up (pid {other.pid}) already manages this directory",
                    "stop that one first",
                )
            )

    def write_status(self) -> None:
        with self._lock:
            instances = {n: r.status.entry() for n, r in self.runners.items()}
            write_status(self.units_dir, UpStatus(os.getpid(), self.digest, instances))

    def apply(self, specs: dict[str, ServiceSpec]) -> None:
        """Stop what went away or changed, start what is new or changed."""
        going = [n for n, r in self.runners.items() if specs.get(n) != r.spec]
        for name in going:
            self.runners[name].request_stop()
        for name in going:
            with self._lock:
                runner = self.runners.pop(name)
            runner.join()  # outside the lock: the runner writes the status while it stops
            self.log(f"[{name}] stopped")
        for name, spec in specs.items():
            if name not in self.runners:
                runner = ServiceRunner(
                    spec, self.units_dir / "logs", self.start_timeout_s, self.write_status, self.log
                )
                with self._lock:
                    self.runners[name] = runner
                runner.start()
        self.write_status()

    def stop_all(self) -> None:
        with self._lock:
            runners = list(self.runners.values())
            self.runners.clear()
        for runner in runners:
            runner.request_stop()
        for runner in runners:
            runner.join()

    def shutdown(self, *_: object) -> None:
        self._shutdown.set()

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM; then stop every instance and remove the status file."""
        self.claim()
        previous: dict[signal.Signals, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, self._on_signal)
        try:
            while not self._shutdown.is_set():
                digest = manifest_digest(self.units_dir)
                if digest != self.digest:
                    try:
                        specs = load_specs(self.units_dir)
                    except UserError as err:
                        self.log(f"up: ignoring {self.units_dir}: {err}")
                        specs = None
                    self.digest = digest
                    if specs is not None:
                        self.log(f"up: applying {self.units_dir / MANIFEST}")
                        self.apply(specs)
                self._shutdown.wait(POLL_S)
        finally:
            self.log("up: stopping all instances")
            self.stop_all()
            (self.units_dir / STATUS).unlink(missing_ok=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._shutdown.set()
