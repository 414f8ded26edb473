"""A clean stop: SIGTERM or Ctrl-C end a run where a step ends, with a checkpoint, or at once where nothing is lost.

    stop = StopRequest()
    with stop.on_signals(console.print):      # SIGTERM, SIGINT -> stop.request(signum); handlers restored after
        loop.train(config, source, stop=stop)  # raises RunInterrupted after checkpointing the step it reached

The first signal asks for a stop. A step in flight is finished, checkpointed, and the loop raises
:class:`~rlvr.errors.RunInterrupted` (a ``KeyboardInterrupt``, so no ``except Exception`` swallows it); work inside
:meth:`StopRequest.abandonable` (evaluations, set-up: nothing a checkpoint would keep) ends at once. The second
signal ends the run at once wherever it is, with what the last checkpoint holds; after it, the default handlers are
back, so a third ends the process. The run application marks the run ``interrupted`` and prints how to resume it;
``rlvr`` exits with 128 + the signal (143 for SIGTERM, 130 for Ctrl-C).

What it is not: the checkpoint (``phases.finish_step`` writes it), the run's status file (``run.py``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from rlvr.errors import RunInterrupted

__all__ = ["SIGNALS", "StopRequest"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Whether a run was asked to stop, and by which signal; see the module docstring."""

    def __init__(self) -> None:
        self.signum: int | None = None
        """The signal that asked for the stop (None: none yet)."""
        self._abandonable = 0
        self._handler: Callable[[int, object], None] | None = None  # while ``on_signals`` holds the signals

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def request(self, signum: int) -> None:
        """Ask for a stop: the first time where the step in flight ends (at once inside ``abandonable``), the
        second time at once (raises RunInterrupted in the caller, the main thread when a signal handler calls it)."""
        again = self.signum is not None
        self.signum = signum
        if again or self._abandonable:
            raise RunInterrupted(signum)

    def check(self) -> None:
        """Raise RunInterrupted if a stop was asked for (where nothing is in flight)."""
        if self.signum is not None:
            raise RunInterrupted(self.signum)

    @contextlib.contextmanager
    def abandonable(self) -> Iterator[None]:
        """Work that a stop ends at once, since nothing of it would be kept (an evaluation, loading a model)."""
        self.check()
        self._abandonable += 1
        try:
            yield
        finally:
            self._abandonable -= 1

    @contextlib.contextmanager
    def on_signals(self, say: Callable[[str], None] | None = None) -> Iterator[StopRequest]:
        """SIGTERM and SIGINT call :meth:`request` inside the block (the previous handlers come back after it);
        ``say`` tells the person what the first signal does. Outside the main thread signals cannot be caught, and
        the block changes nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, _frame: object) -> None:
            if self.signum is not None or self._abandonable:
                _restore(previous)  # from here on, a further signal acts as it did before the run
            elif say is not None:
                say(f"{signal.Signals(signum).name}: finishing the step in flight, then writing a checkpoint "
                    "(Ctrl-C again stops at once)")
            self.request(signum)

        previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
        self._handler = handler
        try:
            yield self
        finally:
            self._handler = None
            _restore(previous)

    def reclaim_signals(self) -> None:
        """Take SIGTERM and SIGINT back after a library took them (``ray.init`` installs handlers of its own that
        end the process at once); nothing outside ``on_signals`` or after the first signal."""
        if self._handler is not None and self.signum is None and \
                threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, self._handler)


Handler = Callable[[int, FrameType | None], Any] | int | None
"""What ``signal.signal`` takes and returns: a handler, ``SIG_DFL``/``SIG_IGN``, or None (not set from Python)."""


def _restore(handlers: dict[signal.Signals, Handler]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
