"""Signals llamanix sends to processes: one function each, the only ``os.kill``, ``os.killpg``
and ``send_signal`` outside this layer's own liveness check (``process.alive``).

As with the programs llamanix runs, every signal it sends goes through ``external/``, where
tests/test_layers.py can hold it. Installing a handler is not sending a signal: that stays where
the handler's code is (``interrupt``, the ``up`` supervisor). Every caller here is stopping
something, so a process or group that is already gone is not an error.
"""

from __future__ import annotations

import contextlib
import os
import signal

from llamanix.external.process import Child, TextChild


def signal_process(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process ``pid``; nothing when it is gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of group ``pgid``; nothing when the group is gone (or, as
    for a group left with only zombies, no longer one this process may signal)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_child(child: Child | TextChild, sig: signal.Signals) -> None:
    """Send ``sig`` to a child this process started; nothing once it has been waited for (its
    pid may belong to another process by then)."""
    child.send_signal(sig)


def kill_this_process() -> None:
    """SIGKILL to this very process: it ends here, with no ``finally`` and no ``atexit``."""
    os.kill(os.getpid(), signal.SIGKILL)


def interrupt_this_process() -> None:
    """SIGINT to this very process, as a Ctrl-C sends it: under ``interrupt.handled()`` the
    main thread raises at its next instruction, and the ``finally`` blocks run."""
    os.kill(os.getpid(), signal.SIGINT)
