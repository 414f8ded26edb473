"""Progress of a run's long phases on its console: the warm-up's and the RL loop's steps, and the evaluations.

On a terminal a step phase is a bar with its status, elapsed time and ETA, and an evaluation a spinner. On anything
else (a log file, a pipe, CI), where a bar is only drawn when it ends, a step phase prints a line at its start, at
least ``every_s`` seconds apart, and at its last step, each with the seconds per step and the ETA; an evaluation
prints a line when it starts and one when it ends. A run sent to a file says where it is.

Not here: what a step does (``run.py``, ``loop.py``), or the metrics files (``tracking.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

EVERY_S = 30.0


def _clock_text(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class StepProgress:
    """``with StepProgress(console, "step", total) as progress: progress.update(done, status)``; ``start``: steps
    done before this process began (a resumed run), left out of the rate; ``unit``: what the rate is per."""

    def __init__(self, console: Any, label: str, total: int, start: int = 0, status: str = "",
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic, unit: str = "step") -> None:
        self.console, self.label, self.total, self.start, self.unit = console, label, total, start, unit
        self.status, self.every_s, self.clock = status, every_s, clock
        self.done = start
        self._bar: Any = None
        self._started = self._printed = 0.0
        self._first: tuple[float, int] | None = None  # (time, done) at the first update

    def __enter__(self) -> StepProgress:
        self._started = self._printed = self.clock()
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn(f"{self.label} {{task.completed}}/{{task.total}}"), BarColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.start, status=self.status)
        else:
            self._line()
        return self

    def update(self, done: int, status: str) -> None:
        """``done`` steps of ``total`` finished; ``status``: the last step's figures."""
        self.done, self.status = done, status
        if self._first is None:
            self._first = (self.clock(), done)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, status=status)
        elif done >= self.total or self.clock() - self._printed >= self.every_s:
            self._line()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def _line(self) -> None:
        now = self.clock()
        self._printed = now
        elapsed, steps = now - self._started, self.done - self.start
        timing = f"elapsed {_clock_text(elapsed)}"
        if steps > 0:  # timed from the first step's end where it can be: an evaluation before it is not a step
            since, first = self._first or (self._started, self.start)
            per_step = (now - since) / (self.done - first) if self.done > first else elapsed / steps
            timing = f"{per_step:.1f} s/{self.unit}  {timing}  ETA {_clock_text(per_step * (self.total - self.done))}"
        self.console.print(f"{self.label} {self.done}/{self.total}  {self.status}  {timing}".replace("    ", "  "),
                           highlight=False, soft_wrap=True)


@contextlib.contextmanager
def phase(console: Any, text: str, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """A spinner with ``text`` on a terminal; elsewhere a line when it starts and one with its time when it ends."""
    if console.is_terminal:
        with console.status(text):
            yield
        return
    started = clock()
    console.print(f"{text} ...", highlight=False, soft_wrap=True)
    yield
    console.print(f"{text}: done in {_clock_text(clock() - started)}", highlight=False, soft_wrap=True)
