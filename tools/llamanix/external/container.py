"""The programs behind the host test bed: mmdebstrap, systemd-nspawn and nsenter.

One function per program, each building its exact argv (tests assert them) and running it. The
orchestration (caching, booting, installing, tearing down) lives in ``llamanix.testbed.hosts``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from llamanix.core.errors import ExternalCommandError

# A pinned mirror's Release files may be past their Valid-Until date; the packages are still
# the distribution's own, checked against its keyring.
APT_OPTIONS = ('Acquire::Check-Valid-Until "false"', 'Acquire::Check-Date "false"')


def mmdebstrap_argv(suite: str, packages: Sequence[str], out: Path) -> list[str]:
    """A minimal Debian root file system as a tarball, from the distribution's packages only."""
    argv = ["mmdebstrap", "--variant=apt", "--format=tar", "--include=" + ",".join(packages)]
    argv += [f"--aptopt={option}" for option in APT_OPTIONS]
    return [*argv, suite, str(out)]


def mmdebstrap(suite: str, packages: Sequence[str], out: Path, log: IO[str]) -> None:
    argv = mmdebstrap_argv(suite, packages, out)
    try:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    except OSError as err:
        raise ExternalCommandError(
            f"cannot run mmdebstrap ({err.strerror}): apt-get install mmdebstrap"
        ) from None
    if done.returncode != 0:
        raise ExternalCommandError(f"mmdebstrap {suite} failed (exit {done.returncode})")


@dataclass(frozen=True)
class Bridge:
    """Where a container's network goes instead of loopback only: its ``host0`` is one end of a
    veth pair whose other end joins ``bridge`` inside the named network namespace ``netns``."""

    netns: str
    bridge: str


def nspawn_boot_argv(
    root: Path, machine: str, bridge: Bridge | None = None, cgroups: Sequence[Path] = ()
) -> list[str]:
    """Boot ``root`` with systemd as PID 1: no registration with a machined, no unit of its own
    (it stays in the caller's cgroup), and a network namespace holding only loopback, or with
    ``bridge`` a veth to that bridge. nspawn makes the veth pair in the network namespace it
    runs in, so it runs inside ``bridge.netns``: entered with ``nsenter --net``, which execs it
    (its pid is nspawn's own) and changes nothing else. ``ip netns exec`` would also mount a
    fresh /sys, without the cgroup file system nspawn needs. With ``cgroups`` (directories from
    ``cgroups.make_own``), a shell joins them first and execs the rest, so nspawn starts there
    and puts the container under them."""
    network = f"--network-bridge={bridge.bridge}" if bridge else "--private-network"
    argv = [
        "systemd-nspawn",
        "--boot",
        "--register=no",
        "--keep-unit",
        network,
        f"--machine={machine}",
        f"--directory={root}",
    ]
    if bridge:
        argv = ["nsenter", f"--net=/run/netns/{bridge.netns}", "--", *argv]
    if cgroups:
        join = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 1; '
        join += 'shift; n=$((n - 1)); done; exec "$@"'
        argv = ["sh", "-c", join, "sh", str(len(cgroups)), *map(str, cgroups), *argv]
    return argv


def nspawn_boot(
    root: Path,
    machine: str,
    log: IO[str],
    bridge: Bridge | None = None,
    cgroups: Sequence[Path] = (),
) -> subprocess.Popen[bytes]:
    """Start the container; its console goes to ``log``. The caller owns the process."""
    try:
        return subprocess.Popen(
            nspawn_boot_argv(root, machine, bridge, cgroups),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as err:
        raise ExternalCommandError(
            f"cannot run systemd-nspawn ({err.strerror}): apt-get install systemd-container"
        ) from None


def nsenter_argv(
    pid: int,
    argv: Sequence[str],
    uid: int | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """``argv`` inside every namespace of ``pid`` (the container's systemd), as root or as
    ``uid`` (with that user's groups), with exactly ``env`` when given."""
    words = ["nsenter", f"--target={pid}", "--all"]
    if uid is not None:
        words += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--init-groups"]
    if env is not None:
        words += ["env", "-i", *(f"{k}={v}" for k, v in sorted(env.items()))]
    return [*words, *argv]


def nsenter(
    pid: int,
    argv: Sequence[str],
    *,
    uid: int | None = None,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    timeout_s: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside the container and wait; output captured, exit code not checked."""
    full = nsenter_argv(pid, argv, uid, env)
    try:
        return subprocess.run(
            full,
            input=input_text,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise ExternalCommandError(f"{' '.join(argv)}: no answer in {timeout_s:g}s") from err
    except OSError as err:
        raise ExternalCommandError(f"cannot run nsenter ({err.strerror})") from None


def nsenter_interactive(pid: int, argv: Sequence[str]) -> int:
    """``argv`` inside the container on this terminal (a developer's shell); its exit code."""
    return subprocess.call(nsenter_argv(pid, argv))
