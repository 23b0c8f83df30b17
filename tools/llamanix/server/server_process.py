"""Run one llama-server as a child process: started, waited for, and always stopped.

Used by the tests, the demo, smoke runs, ``up`` and the benchmarks. The server gets its own
process group so that stopping it stops everything it started; its stdout and stderr go to a
log file that errors quote from. Its own session also keeps a terminal's Ctrl-C from reaching
it: llamanix stops it, on that signal or any other (llamanix.external.interrupt), and a start
or a stop that a signal interrupts still leaves no server behind.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from llamanix.core.address import connect_host, url_host
from llamanix.core.process_end import describe_returncode
from llamanix.external import interrupt
from llamanix.external.llama_server import ServerStartError, start_server
from llamanix.external.process import Child, wait_exit
from llamanix.external.signals import signal_group

DEFAULT_HOST = "127.0.0.1"
POLL_INTERVAL_S = 0.1


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _option_value(argv: Sequence[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def with_listen_address(argv: Sequence[str], host: str = DEFAULT_HOST) -> list[str]:
    """``argv`` plus ``--host``/``--port`` where it lacks them (the port: a free one)."""
    out = list(argv)
    if _option_value(out, "--host") is None:
        out += ["--host", host]
    if _option_value(out, "--port") is None:
        out += ["--port", str(free_port())]
    return out


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class LlamaServer:
    """A llama-server child process; use as a context manager or call start()/stop().

    ``argv`` is the full command line, program first. ``env`` replaces the inherited
    environment when given.
    """

    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 10.0
    process: Child | None = field(default=None, init=False, repr=False)
    command: list[str] = field(default_factory=list, init=False)

    @property
    def host(self) -> str:
        return connect_host(_option_value(self.command, "--host") or DEFAULT_HOST)

    @property
    def port(self) -> int:
        value = _option_value(self.command, "--port")
        if value is None:
            raise RuntimeError("LlamaServer.port read before start()")
        return int(value)

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> LlamaServer:
        """Start the process and return once GET /health answers 200."""
        if self.process is not None:
            raise RuntimeError("LlamaServer already started")
        self.command = with_listen_address(self.argv)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # A signal between the fork and the assignment would leave a server no stop()
            # knows of; deferred, it is raised once self.process is set, and stops it.
            with self.log_path.open("wb") as log, interrupt.deferred():
                self.process = start_server(self.command, log, self.env)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        # The HTTP client is imported when a server is waited on, not by every importer
        # (`up`'s supervisor records, `plan`).
        from llamanix.server.client import LlamaClient, NotServing

        assert self.process is not None
        process = self.process
        with LlamaClient(self.url, timeout_s=5.0) as client:
            try:
                client.wait_healthy(self.start_timeout_s, alive=lambda: process.poll() is None)
            except NotServing:
                code = process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"{describe_returncode(code)} before it was ready "
                        f"(log {self.log_path}):\n{tail(self.log_text())}"
                    ) from None
                raise ServerStartError(
                    f"llama-server not healthy after {self.start_timeout_s:g}s "
                    f"(log {self.log_path}):\n{tail(self.log_text())}"
                ) from None

    def stop(self) -> int | None:
        """Stop the process group (SIGTERM, then SIGKILL); return the exit code."""
        proc = self.process
        if proc is None:
            return None
        # A stop signal must not cut a stop short (between the check and the SIGTERM, or in
        # the wait before the SIGKILL): it is raised once the server is gone.
        with interrupt.deferred():
            if proc.poll() is None:
                self._signal_group(proc.pid, signal.SIGTERM)
                if wait_exit(proc, self.stop_timeout_s) is None:
                    self._signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            # Anything the server forked shares its group; leave none of it behind.
            self._signal_group(proc.pid, signal.SIGKILL)
        return proc.returncode

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        signal_group(pgid, sig)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def processes_with_env(key: str, value: str) -> list[int]:
    """PIDs of live processes whose environment holds ``key=value`` (Linux /proc).

    Tests tag the servers they start this way, so a leak check finds exactly their own
    processes even while other llama-servers run on the machine.
    """
    needle = f"{key}={value}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)
