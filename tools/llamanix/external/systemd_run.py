"""systemd-run: start a command as a transient service that the host's systemd owns.

A fleet switch runs this way on a remote host (fleet/agent.py): the unit is in its own
cgroup under PID 1 (or the user's manager), not in the ssh session's, so a dropped connection
or a killed agent neither stops it half-way nor leaves it without a record of how it ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamanix.external.process import Runner


def systemd_run_argv(
    user: bool,
    unit: str,
    description: str,
    properties: Sequence[str],
    env: Mapping[str, str],
    command: Sequence[str],
) -> list[str]:
    """``systemd-run`` for ``command`` as ``unit``.service; ``env``: what the unit gets of the
    caller's environment (a transient unit starts from the manager's, not the caller's)."""
    argv = ["systemd-run", *(["--user"] if user else []), f"--unit={unit}"]
    argv.append(f"--description={description}")
    argv += [f"--property={p}" for p in properties]
    argv += [f"--setenv={k}={v}" for k, v in sorted(env.items())]
    return [*argv, "--quiet", "--", *command]


def start_transient(
    runner: Runner,
    user: bool,
    unit: str,
    description: str,
    properties: Sequence[str],
    env: Mapping[str, str],
    command: Sequence[str],
) -> None:
    """Start the unit; returns once systemd started its process (the start job is done)."""
    runner.run(systemd_run_argv(user, unit, description, properties, env, command))
