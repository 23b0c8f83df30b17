"""One function per systemctl command llamanix runs (argv asserted by the tests)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from llamanix.core.errors import ExternalCommandError
from llamanix.core.process_end import signal_name
from llamanix.external.process import Runner


def _base(user: bool) -> list[str]:
    return ["systemctl", "--user"] if user else ["systemctl"]


def daemon_reload(runner: Runner, user: bool) -> None:
    runner.run([*_base(user), "daemon-reload"])


def reset_failed(runner: Runner, user: bool, units: Sequence[str]) -> None:
    """Forget the units' failed state and start count: a deliberate switch is not a crash loop,
    and systemd counts every start, restarts by hand included, against StartLimitBurst=."""
    if units:
        runner.run([*_base(user), "reset-failed", *units], check=False)


def restart(runner: Runner, user: bool, units: Sequence[str], check: bool = True) -> bool:
    """Restart ``units``; False when one of them did not start (with ``check=False``)."""
    if not units:
        return True
    return runner.run([*_base(user), "restart", *units], check=check).returncode == 0


def try_restart(runner: Runner, user: bool, units: Sequence[str]) -> None:
    """Restart those of ``units`` that run; one that does not, or is not loaded, is left so."""
    if units:
        runner.run([*_base(user), "try-restart", *units], check=False)


def enable(runner: Runner, user: bool, units: Sequence[str]) -> None:
    if units:
        runner.run([*_base(user), "enable", *units])


def disable_now(runner: Runner, user: bool, units: Sequence[str]) -> None:
    if units:
        runner.run([*_base(user), "disable", "--now", *units])


def stop(runner: Runner, user: bool, units: Sequence[str]) -> None:
    """Stop ``units``; one that is not loaded is no error (``check=False``)."""
    if units:
        runner.run([*_base(user), "stop", *units], check=False)


@dataclass(frozen=True)
class UnitState:
    """What systemd says of a unit (``systemctl show``), read back typed."""

    unit: str
    active_state: str  # active, activating, failed, inactive ...
    sub_state: str  # running, auto-restart (failed, and waiting for RestartSec=) ...
    result: str  # success, exit-code, signal, timeout, start-limit-hit ...
    restarts: int
    main_status: int | None  # the main process's last exit status, or its signal's number
    load_state: str = "unknown"  # loaded, not-found (never started, or collected) ...
    main_pid: int | None = None  # None: no main process now
    # When the main process started, on CLOCK_MONOTONIC (time.monotonic()'s clock), seconds.
    main_started: float | None = None
    # How the main process last ended: "exited", "killed" or "dumped" (a signal's number is
    # then ``main_status``), "" where systemd has not seen it end.
    main_code: str = ""

    @property
    def killed_by(self) -> int | None:
        """The signal that ended the main process, or None."""
        if self.main_code in ("killed", "dumped") and self.main_status:
            return self.main_status
        return None

    @property
    def serving(self) -> bool:
        return self.active_state == "active"

    @property
    def runs(self) -> bool:
        """Whether its process still runs (or is being started or stopped): a service with
        RemainAfterExit= whose process ended is "active (exited)", not running."""
        if self.active_state in ("activating", "deactivating", "reloading", "refreshing"):
            return True
        return self.active_state == "active" and self.sub_state not in ("exited", "dead")

    def describe(self) -> str:
        status = f", exit status {self.main_status}" if self.main_status else ""
        if self.killed_by is not None:
            status = f", {signal_name(self.killed_by)}"
        restarts = f", {self.restarts} restarts" if self.restarts else ""
        state = self.active_state
        if self.sub_state == "auto-restart":
            state = "failed, restart pending"
        elif self.active_state == "failed":
            # Restart=on-failure ended: the start limit (StartLimitBurst=) was hit.
            state = "failed, not restarting"
        return f"{self.unit} {state} ({self.result}{status}{restarts})"


SHOW_PROPERTIES = (
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainCode",
    "LoadState",
    "MainPID",
    "ExecMainStartTimestampMonotonic",
)


# systemd's ExecMainCode is the waitid() si_code: CLD_EXITED 1, CLD_KILLED 2, CLD_DUMPED 3.
EXEC_MAIN_CODES = {"1": "exited", "2": "killed", "3": "dumped"}


def show_argv(user: bool, unit: str) -> list[str]:
    return [*_base(user), "show", unit, "--property", ",".join(SHOW_PROPERTIES)]


def show(user: bool, unit: str) -> UnitState:
    """The unit's state now; a query, so it runs in dry runs too and prints nothing."""
    argv = show_argv(user, unit)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ExternalCommandError(f"{' '.join(argv)}: {err}") from None
    if done.returncode != 0:
        raise ExternalCommandError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    status = found.get("ExecMainStatus", "")
    return UnitState(
        unit=unit,
        active_state=found.get("ActiveState", "unknown"),
        sub_state=found.get("SubState", "unknown"),
        result=found.get("Result", "unknown"),
        restarts=int(found.get("NRestarts") or 0),
        main_status=int(status) if status.isdigit() else None,
        load_state=found.get("LoadState", "unknown"),
        main_code=EXEC_MAIN_CODES.get(found.get("ExecMainCode", ""), ""),
        main_pid=int(pid) if (pid := found.get("MainPID", "")).isdigit() and pid != "0" else None,
        main_started=(
            int(started) / 1e6
            if (started := found.get("ExecMainStartTimestampMonotonic", "")).isdigit()
            and started != "0"
            else None
        ),
    )


@dataclass(frozen=True)
class ListedUnit:
    """One line of ``systemctl list-units``: a unit systemd has loaded, its file there or not
    (a running unit whose file was deleted stays loaded, as ``not-found``)."""

    unit: str
    load_state: str
    active_state: str
    sub_state: str


def list_units_argv(user: bool, pattern: str) -> list[str]:
    return [*_base(user), "list-units", "--all", "--plain", "--no-legend", "--full", pattern]


def list_units(user: bool, pattern: str) -> list[ListedUnit]:
    """Every unit systemd has loaded whose name matches ``pattern``, whatever its state; a
    query (dry runs too). A systemctl that fails says nothing of what is there: that is
    ``ExternalCommandError``, never an empty list."""
    argv = list_units_argv(user, pattern)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ExternalCommandError(f"{' '.join(argv)}: {err}") from None
    if done.returncode != 0:
        raise ExternalCommandError(f"{' '.join(argv)} failed: {done.stderr.strip()[:300]}")
    found = []
    for line in done.stdout.splitlines():
        # A failed unit's line starts with a marker ("●") on some versions.
        words = line.replace("\u25cf", " ").split()
        if len(words) >= 4:
            found.append(ListedUnit(words[0], words[1], words[2], words[3]))
    return found
