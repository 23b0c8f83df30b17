"""A signal to a command that started llama-servers leaves none of them running.

Each command that starts a llama-server (``smoke``, ``demo`` and the ``llamanix up`` it runs as
a child, ``up`` itself) is run as the real process, and SIGTERM (what ``timeout``, a CI runner
or systemd send) or SIGINT (Ctrl-C) goes to that process alone once its server is starting or
serving. Afterwards no process of the run may be alive: every process a test starts carries a
tag of its own in its environment, so the check sees exactly that test's processes, whatever
else runs on the machine. ``lossless`` and ``bench`` only talk to servers given by URL, and
``build-server`` starts no server.

The exit code is the shell's 128 + the signal's number with one line on stderr, except for
``up``, for which a stop signal is its ordinary end (exit 0, as test_deploy_e2e checks).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llamanix.external import interrupt, signals
from llamanix.server.server_process import free_port, processes_with_env
from llamanix.testbed.demo import DEMO_MODEL
from llamanix.testbed.synth import synth_model

TOOLS = Path(__file__).resolve().parent.parent / "tools"
TAG_ENV = "LLAMANIX_SIGNAL_TEST"
POLL_S = 0.05
EXIT_S = 60.0  # a stop is SIGTERM, a wait of at most 10 s, then SIGKILL; demo stops up too


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: list[str]

    @property
    def is_server(self) -> bool:
        """A serving llama-server, not a ``--help`` or ``--version`` probe of the binary: a
        started server always has a --port."""
        return bool(self.argv) and Path(self.argv[0]).name == "llama-server" and bool(self.port)

    @property
    def port(self) -> int | None:
        if "--port" in self.argv[:-1]:
            return int(self.argv[self.argv.index("--port") + 1])
        return None


def tagged(tag: str) -> list[Proc]:
    """The live processes of one test (its tag in their environment)."""
    found = []
    for pid in processes_with_env(TAG_ENV, tag):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        found.append(Proc(pid, ppid, [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]))
    return found


def healthy(server: Proc) -> bool:
    if server.port is None:
        return False
    try:
        return httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


# When to send the signal, judged from the test's processes.
Phase = Callable[[list[Proc]], bool]


def starting(procs: list[Proc]) -> bool:
    """A llama-server exists: the command is waiting for it to load."""
    return any(p.is_server for p in procs)


def serving(procs: list[Proc]) -> bool:
    return any(p.is_server and healthy(p) for p in procs)


def serving_under_up(procs: list[Proc]) -> bool:
    """A llama-server that `llamanix up` started answers: demo is in its deploy loop."""
    ups = {p.pid for p in procs if "up" in p.argv and "llamanix" in p.argv}
    return any(p.is_server and p.ppid in ups and healthy(p) for p in procs)


@dataclass(frozen=True)
class Case:
    command: str
    phase: Phase
    deadline_s: float

    @property
    def id(self) -> str:
        return f"{self.command}-{self.phase.__name__}"


CASES = [
    Case("smoke", starting, 60),
    Case("smoke", serving, 60),
    Case("up", starting, 60),
    Case("up", serving, 60),
    Case("demo", serving, 120),
    Case("demo", serving_under_up, 240),
]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_model(DEMO_MODEL, tmp_path_factory.mktemp("signals") / "small.gguf")


def command_argv(command: str, binary: Path, model: Path, work: Path) -> list[str]:
    if command == "smoke":
        # Long answers, so the server is still serving when the signal comes.
        return [
            "check",
            "smoke",
            "--binary",
            str(binary),
            "--model",
            str(model),
            "--tokens",
            "4096",
        ]
    if command == "demo":
        return ["testbed", "demo", "--binary", str(binary), "--tokens", "2", "--runs", "1"]
    (work / "llamanix.toml").write_text(
        f'[hosts.dev]\nkind = "systemd"\nbinaries = {{ upstream = "{binary}" }}\n'
        "\n[instances.chat]\n"
        f'model = "{model}"\nport = {free_port()}\ncontext = 512\nthreads = 1\n'
    )
    return ["up", str(work / "llamanix.toml"), "--host", "dev"]


def _default_signals() -> None:
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored
    # (in llamanix too, on purpose): the command under test gets the default dispositions.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def cleanup(tag: str) -> Iterator[None]:
    """Whatever the test's outcome, none of its processes outlives it."""
    try:
        yield
    finally:
        for proc in tagged(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


def run_and_signal(
    argv: list[str], sig: signal.Signals, phase: Phase, deadline_s: float, work: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``llamanix ARGV``, signal it once ``phase`` holds, wait for it and check that
    none of its processes is left; the process and its stderr."""
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        TAG_ENV: tag,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TOOLS), os.environ.get("PYTHONPATH")])),
    }
    stdout, stderr = work / "stdout", work / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llamanix", *argv],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=_default_signals,
        )
    with cleanup(tag):
        deadline = time.monotonic() + deadline_s
        try:
            while not phase(tagged(tag)):
                assert proc.poll() is None, (
                    f"exited {proc.returncode} first:\n{stderr.read_text(errors='replace')}"
                )
                assert time.monotonic() < deadline, f"{phase.__name__} within {deadline_s:g}s"
                time.sleep(POLL_S)
            proc.send_signal(sig)
            proc.wait(timeout=EXIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # The stops are synchronous; the grace covers only the kernel tearing processes down.
        grace = time.monotonic() + 2.0
        while (left := tagged(tag)) and time.monotonic() < grace:
            time.sleep(POLL_S)
        assert not left, f"still running after {sig.name}: {[p.argv[:3] for p in left]}"
    return proc, stderr.read_text(errors="replace")


@pytest.mark.server
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_signal_stops_every_server(
    case: Case, sig: signal.Signals, llama_server_bin: Path, small_model: Path, tmp_path: Path
) -> None:
    argv = command_argv(case.command, llama_server_bin, small_model, tmp_path)
    proc, stderr = run_and_signal(argv, sig, case.phase, case.deadline_s, tmp_path)
    assert "Traceback" not in stderr, stderr
    if case.command == "up":
        assert proc.returncode == 0, stderr
        return
    assert proc.returncode == 128 + sig, stderr
    assert stderr.strip().splitlines()[-1] == f"llamanix: stopped by {sig.name}", stderr


@pytest.mark.server
def test_a_hangup_stops_the_server_too(
    llama_server_bin: Path, small_model: Path, tmp_path: Path
) -> None:
    """A closed terminal (SIGHUP) stops the server as SIGTERM does."""
    argv = command_argv("smoke", llama_server_bin, small_model, tmp_path)
    proc, stderr = run_and_signal(argv, signal.SIGHUP, serving, 60, tmp_path)
    assert proc.returncode == 128 + signal.SIGHUP, stderr
    assert stderr.strip().splitlines()[-1] == "llamanix: stopped by SIGHUP", stderr


# --- the handlers themselves, in this process ------------------------------------------------


def test_a_signal_in_a_deferred_block_is_raised_at_its_end_and_a_second_is_ignored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    reached_end = False
    with interrupt.handled():
        with pytest.raises(interrupt.Interrupted) as raised, interrupt.deferred():
            signal.raise_signal(signal.SIGTERM)
            reached_end = True
        # The cleanup the first signal started is not cut short by another.
        signal.raise_signal(signal.SIGINT)
    assert reached_end
    assert raised.value.signum == signal.SIGTERM and raised.value.exit_code == 143
    assert isinstance(raised.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_ignored_signal_stays_ignored() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupt.handled():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)  # nohup's promise: nothing happens
    finally:
        signal.signal(signal.SIGHUP, before)


# --- external/signals: the one way a signal is sent ---------------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_signals_reach_a_process_and_its_group_and_a_gone_one_is_no_error() -> None:
    """Real children: a process stopped by pid, a process group (a shell and its sleep) by its
    id, a child by its own handle; signalling each again, once gone, raises nothing."""
    one = subprocess.Popen(["sleep", "60"])
    group = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    # SIGINT as a child has it by default: a run started in the background by a shell (a CI
    # job, `cmd &`) ignores SIGINT, and its children inherit that.
    child = subprocess.Popen(["sleep", "60"], preexec_fn=_default_sigint)
    signals.signal_process(one.pid, signal.SIGTERM)
    signals.signal_group(group.pid, signal.SIGKILL)
    signals.signal_child(child, signal.SIGINT)
    assert one.wait(10) == -signal.SIGTERM
    assert group.wait(10) == -signal.SIGKILL
    assert child.wait(10) == -signal.SIGINT
    # Pids are handed out in turn: the waited-for ones are not another process's this soon.
    signals.signal_process(one.pid, signal.SIGTERM)
    signals.signal_group(group.pid, signal.SIGKILL)
    signals.signal_child(child, signal.SIGINT)  # waited for: its pid is no longer its own


def test_this_process_ends_on_the_spot() -> None:
    """kill_this_process: no finally block runs, and the exit is SIGKILL's."""
    code = (
        "from llamanix.external.signals import kill_this_process\n"
        "try:\n    kill_this_process()\nfinally:\n    print('finally ran')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TOOLS)},
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == ""
