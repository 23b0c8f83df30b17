"""Prometheus and promtool (Debian's ``prometheus`` package): their argv, built here and only
here, and a run of each.

promtool checks a config (with the rule files it names) and a rules file; a Prometheus server
is started on a rendered config for the tests and benchmarks (loopback, its own storage
directory, stopped with its process group).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import Child, run_captured, spawn

PROMTOOL = "promtool"
PROMETHEUS = "prometheus"
INSTALL = "install Debian's prometheus package (apt-get install prometheus)"


@dataclass(frozen=True)
class Check:
    ok: bool
    output: str


def promtool_check_config_argv(config: Path) -> list[str]:
    return [PROMTOOL, "check", "config", str(config)]


def promtool_check_rules_argv(rules: Path) -> list[str]:
    return [PROMTOOL, "check", "rules", str(rules)]


def _check(argv: list[str]) -> Check:
    try:
        done = run_captured(argv, timeout_s=60)
    except ExternalCommandError as err:
        raise ExternalCommandError(f"{err} ({INSTALL})") from None
    return Check(done.returncode == 0, (done.stdout + done.stderr).strip())


def check_config(config: Path) -> Check:
    """``promtool check config``: the config, and every rule file it names."""
    return _check(promtool_check_config_argv(config))


def check_rules(rules: Path) -> Check:
    return _check(promtool_check_rules_argv(rules))


def prometheus_argv(config: Path, storage: Path, listen: str) -> list[str]:
    """A Prometheus server on ``listen`` (HOST:PORT) that keeps its data in ``storage``."""
    return [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={storage}",
        f"--web.listen-address={listen}",
        # Warnings and errors only: its log is read when something failed.
        "--log.level=warn",
    ]


def start_prometheus(config: Path, storage: Path, listen: str, log: IO[Any]) -> Child:
    """Start Prometheus in a process group of its own (stop it with its group)."""
    try:
        return spawn(prometheus_argv(config, storage, listen), stdout=log)
    except OSError as err:
        raise ExternalCommandError(f"cannot run {PROMETHEUS}: {err.strerror} ({INSTALL})") from None
