"""How a llama-server process ended, in words a user can act on.

A server killed by a signal is named by the signal, never reported as "not ready after 120 s"
or "exit status 4". SIGILL gets its cause and its fix: an illegal instruction in a build that
ran until its first batch means code for another CPU (a ``-march=native`` build moved to
another machine, or AVX-512/AMX code a VM advertises but cannot run).
"""

from __future__ import annotations

import signal

SIGILL_CAUSE = "a build for another CPU"
SIGILL_FIX = (
    "rebuild llama-server for this machine's CPU without -march=native or GGML_NATIVE "
    "(the test bed's build: llamanix testbed build-server)"
)


# Signals a process gets from its own fault, not from whoever stops it (SIGTERM, SIGKILL): these
# are what "the server died" means. SIGSYS is a system call the unit's filter forbids.
FAULT_SIGNALS = frozenset(
    {signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS}
)


def signal_name(signum: int) -> str:
    """``SIGILL`` for 4; ``signal 99`` for a number this platform has no name for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def died_of(signum: int) -> str:
    """``llama-server died: illegal instruction (SIGILL) — a build for another CPU; rebuild …``"""
    name = signal_name(signum)
    words = (signal.strsignal(signum) or name).lower()
    line = f"llama-server died: {words} ({name})"
    if signum == signal.SIGILL:
        line += f" — {SIGILL_CAUSE}; {SIGILL_FIX}"
    return line


def describe_returncode(code: int) -> str:
    """A child's return code as Python's subprocess gives it (a signal is ``-N``)."""
    if code < 0:
        return died_of(-code)
    return f"llama-server exited with code {code}"
