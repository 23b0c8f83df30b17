"""One function per systemctl command llamanix runs (argv asserted by the tests)."""

from __future__ import annotations

from collections.abc import Sequence

from llamanix.external.process import Runner


def _base(user: bool) -> list[str]:
    return ["systemctl", "--user"] if user else ["systemctl"]


def daemon_reload(runner: Runner, user: bool) -> None:
    runner.run([*_base(user), "daemon-reload"])


def restart(runner: Runner, user: bool, units: Sequence[str]) -> None:
    if units:
        runner.run([*_base(user), "restart", *units])


def enable(runner: Runner, user: bool, units: Sequence[str]) -> None:
    if units:
        runner.run([*_base(user), "enable", *units])


def disable_now(runner: Runner, user: bool, units: Sequence[str]) -> None:
    if units:
        runner.run([*_base(user), "disable", "--now", *units])
