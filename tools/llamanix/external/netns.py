"""The programs behind the fleet bed's network: ``ip`` (namespaces, links, addresses) and
``unshare``, which gives the bed's controller a home of its own.

One function per use, each building its exact argv. The orchestration (which namespace, which
addresses, when to tear down) lives in ``llamanix.testbed.fleet``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from llamanix.core.errors import ExternalCommandError
from llamanix.external.process import CommandTimedOut, Finished, TextChild, run_captured


def ip_argv(args: Sequence[str], netns: str | None = None) -> list[str]:
    """``ip ARGS`` in ``netns`` (``ip -n``), or in this process's own namespace."""
    return ["ip", *(["-n", netns] if netns else []), *args]


def ip(args: Sequence[str], netns: str | None = None) -> Finished:
    """Run ``ip``; an ``ExternalCommandError`` with its message when it fails."""
    argv = ip_argv(args, netns)
    done = run_captured(argv, timeout_s=30)
    if done.returncode != 0:
        raise ExternalCommandError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


def ip_json(args: Sequence[str], netns: str | None = None) -> object:
    """``ip -j ARGS``, parsed (unchecked: the caller reads what it needs)."""
    out = ip(["-j", *args], netns).stdout.strip()
    value: object = json.loads(out) if out else []
    return value


def exec_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` in the network namespace ``netns``, a program of this machine otherwise."""
    return ["ip", "netns", "exec", netns, *argv]


def home_holder_argv(netns: str, upper: Path, work: Path) -> list[str]:
    """A process that holds a mount namespace of its own, in ``netns``, where /root is an
    overlay: this machine's /root below, ``upper`` above. What runs in it (``enter_argv``)
    writes under its home into ``upper`` only, and finds there the files put there
    (``~/.ssh/config``). ssh takes ``~`` from the password database, never from $HOME, so only
    a home at the account's own path gives it a private config; the overlay keeps what else the
    account has there (an interpreter under /root) in sight. The mount does not propagate out
    of that namespace, and goes with it when the holder ends. One holder, one mount: two
    overlays on one upper directory at once are undefined."""
    script = 'mount -t overlay overlay -o "lowerdir=/root,upperdir=$1,workdir=$2" /root'
    script += " && exec sleep infinity"
    words = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
    return exec_argv(netns, [*words, "sh", str(upper), str(work)])


def enter_argv(holder: int, env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """``argv`` in the network and mount namespaces of process ``holder``, with exactly
    ``env``."""
    words = ["nsenter", f"--target={holder}", "--net", "--mount", "--", "env", "-i"]
    return [*words, *(f"{k}={v}" for k, v in sorted(env.items())), *argv]


def run_in(
    argv: Sequence[str],
    *,
    input_text: str | None = None,
    timeout_s: float,
) -> Finished:
    """Run a full argv (from ``exec_argv`` or ``enter_argv``) to its end, output captured;
    any exit code is returned. ``CommandTimedOut`` past ``timeout_s``."""
    try:
        return run_captured(argv, input_text=input_text, timeout_s=timeout_s)
    except CommandTimedOut:
        # The whole command line: the program alone is always nsenter here.
        raise CommandTimedOut(f"{' '.join(argv)}: no answer in {timeout_s:g}s") from None


def spawn_in(argv: Sequence[str], *, stdout: IO[Any] | int | None, stdin_pipe: bool) -> TextChild:
    """Start a full argv (as for ``run_in``) in a session of its own, stderr with stdout (None:
    this process's), text mode, stdin a pipe or /dev/null; the caller waits for and stops it."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as err:
        raise ExternalCommandError(f"{argv[0]}: {err.strerror}") from None
