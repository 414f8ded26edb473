"""How many CPU threads an engine computes on when other rlvr processes on the machine compute too.

torch's OpenMP threads spin while they wait for each other. Two processes that each run as many threads as the machine
has cores take turns on the cores mid-spin, and each runs several times slower than half its speed alone
(``docs/performance.md``, "Two processes on one machine"). So each engine that computes says so in ``$RLVR_HOME/busy/``
(one file per process, touched at most once a second while it works), and before each job, and every second of a long
decode, it counts the other processes whose file was touched in the last two seconds and takes ``threads // (1 +
others)`` threads (at least one), where ``threads`` is torch's count when the engine started. Alone, it keeps them all.

The numerics policy's ``threads=N`` (``rlvr.numerics``: the ``threads`` key or ``RLVR_THREADS``) fixes this process's
count instead (it still marks itself computing, so the others share with it). A sum split over 1 thread or 2 rounds
differently in the last bits, so two runs of one seed end bit for bit alike only at a fixed count; the test suite fixes
it for that reason.

Not here: GPU engines (their CPU threads only feed the device, and are left alone), or processes that are not rlvr
engines (the reward sandbox, other programs).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.numerics import active

logger = logging.getLogger(__name__)

FRESH_S = 2.0
"""A process counts as computing if its file was touched this recently."""
EVERY_S = 1.0
"""How often a working engine touches its file and counts the others."""
STALE_S = 3600.0
"""A file untouched this long (its process killed) is removed when seen."""

_current = threading.local()


def fixed_threads() -> int | None:
    """The active policy's fixed thread count (``rlvr.numerics.active``: the ``threads`` config key or
    ``RLVR_THREADS``), or None when unset; ConfigurationError naming the fix when it is not a positive integer."""
    return active().threads


class CoreShare:
    """One engine's share of the cores; ``claim`` runs on the engine's thread (torch's thread count is that
    thread's)."""

    def __init__(self, folder: Path, threads: int, fixed: int | None = None,
                 set_threads: Callable[[int], None] = torch.set_num_threads, every_s: float = EVERY_S,
                 fresh_s: float = FRESH_S) -> None:
        self.folder = folder
        self.threads = threads
        self.fixed = fixed
        self.path = folder / str(os.getpid())
        self._set_threads = set_threads
        self._every_s = every_s
        self._fresh_s = fresh_s
        self._next = 0.0
        self._current: int | None = None
        self._broken = False
        atexit.register(self.release)

    def claim(self) -> int:
        """The thread count this engine computes on now, set on the calling thread: at most once every
        ``every_s``, it marks this process as computing and counts the others that are."""
        now = time.monotonic()
        if now < self._next and self._current is not None:
            return self._current
        self._next = now + self._every_s
        others = self._others()  # a fixed count still marks this process as computing, so that others share
        count = self.fixed or max(1, self.threads // (1 + others))
        if count != self._current:
            self._set_threads(count)
            self._current = count
        return count

    def _others(self) -> int:
        """Touch this process's file; the number of other processes whose file is fresh. A folder that cannot be
        written is reported once, and the engine then keeps its threads."""
        if self._broken:
            return 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            now, others = time.time(), 0
            for entry in os.scandir(self.folder):
                if entry.name == self.path.name:
                    continue
                with contextlib.suppress(FileNotFoundError):  # another process removed it meanwhile
                    age = now - entry.stat().st_mtime
                    if age < self._fresh_s:
                        others += 1
                    elif age > STALE_S:
                        os.unlink(entry.path)
            return others
        except OSError as err:
            self._broken = True
            logger.warning("rlvr cannot share the cores with other rlvr processes (%s): this engine keeps %d "
                           "threads; set RLVR_HOME to a writable folder, or RLVR_THREADS to fix the count", err,
                           self.threads)
            return 0

    def run(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the share's threads, with ``tick`` reaching this share meanwhile."""
        self.claim()
        _current.share = self
        try:
            return fn(*args, **kwargs)
        finally:
            _current.share = None

    def release(self) -> None:
        """Stop counting as computing (an engine that shuts down)."""
        with contextlib.suppress(OSError):
            self.path.unlink()


def tick() -> None:
    """Inside a long job (a decode's token loop): claim the running engine's share again, which costs a clock
    reading except once a second."""
    share = getattr(_current, "share", None)
    if share is not None:
        share.claim()
