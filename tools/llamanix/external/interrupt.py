"""SIGINT, SIGTERM and SIGHUP as one exception, so a command stops what it started.

Python turns SIGINT into KeyboardInterrupt, which runs the ``finally`` blocks and context
managers that stop a command's llama-servers. SIGTERM (what ``timeout``, CI runners and
systemd send) and SIGHUP (a closed terminal) would end the process on the spot instead, and
the servers, each in a session of its own, would keep serving. Inside ``handled()`` all three
raise :class:`Interrupted` in the main thread, so every signal takes the Ctrl-C path.

The first signal raises; later ones are ignored, so a second Ctrl-C cannot cut short the
cleanup the first one started (each stop is bounded: SIGTERM, a wait, then SIGKILL).
``deferred()`` holds a signal back over the few statements that must not be cut in two, such as
starting a child and recording it, and raises it when they are done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; a subclass of KeyboardInterrupt so it is handled as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a command a signal ended."""
        return 128 + self.signum


@dataclass
class _State:
    installed: bool = False
    depth: int = 0  # nesting of deferred() in the main thread
    pending: int | None = None
    raised: bool = False


_state = _State()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.raised:
        return
    if _state.depth:
        _state.pending = signum
        return
    _state.raised = True
    raise Interrupted(signum)


@contextmanager
def handled() -> Iterator[None]:
    """Within the block a stop signal raises Interrupted; the previous handlers after it.

    A signal that was ignored on entry stays ignored (``nohup``, a shell's background job).
    Outside the main thread, where Python runs no signal handler, this does nothing.
    """
    if not _in_main_thread() or _state.installed:
        yield
        return
    previous: dict[signal.Signals, Any] = {}
    _state.installed, _state.depth, _state.pending, _state.raised = True, 0, None, False
    try:
        for sig in SIGNALS:
            if signal.getsignal(sig) != signal.SIG_IGN:
                previous[sig] = signal.signal(sig, _on_signal)
        yield
    finally:
        for sig, handler in previous.items():
            # None: a handler set outside Python, which cannot be put back; the default is.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        _state.installed = False


@contextmanager
def deferred() -> Iterator[None]:
    """A stop signal that arrives within the block is raised when the block ends."""
    if not _in_main_thread():
        yield
        return
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        pending = _state.pending
        if _state.depth == 0 and pending is not None and not _state.raised:
            _state.pending, _state.raised = None, True
            raise Interrupted(pending)
