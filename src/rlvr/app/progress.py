"""Progress of a run's long phases on its console: the warm-up's and the RL loop's steps, and the evaluations.

On a terminal a step phase is a bar with its status, elapsed time and ETA, and an evaluation (inside a phase or on
its own) a bar of problems answered. On anything else (a log file, a pipe, CI), where a bar is only drawn when it
ends, each prints a line at its start, at least ``every_s`` seconds apart, and at its end, with the seconds per step
(or problem) and the ETA. A run sent to a file says where it is.

The rate and ETA are timed from the end of the first step this process ran: that step also carries one-off work
(loading the model, the first compilations), so a line after it alone says how long it took and that the ETA comes
with the next. Evaluations are timed on their own, not as steps.

:func:`make_console` is the console run commands print to: off a terminal it never wraps lines, so paths and
commands stay whole for copying and grep.

:func:`clipped_warning` is the one line a run or an evaluation prints when more than a quarter of its answers hit
``max_tokens``.

Not here: what a step does (``run.py``, ``loop.py``), or the metrics files (``tracking.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

EVERY_S = 30.0
UNWRAPPED_WIDTH = 1000
"""The width of a console that is not a terminal: text is never wrapped (soft wrap), tables are as wide as their
content up to this."""


def make_console(stderr: bool = False) -> Any:
    """A rich Console on stdout (or stderr): rich's own on a terminal; elsewhere one that never wraps a line (rich
    would wrap at 80 columns, splitting paths and commands)."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, soft_wrap=True, width=UNWRAPPED_WIDTH)


def _clock_text(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class StepProgress:
    """``with StepProgress(console, "step", total) as progress: progress.update(done, status)``; ``start``: steps
    done before this process began (a resumed run), left out of the rate; ``unit``: what the rate is per.
    ``progress.evaluation(what, problems)`` shows an evaluation inside the phase."""

    def __init__(self, console: Any, label: str, total: int, start: int = 0, status: str = "",
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic, unit: str = "step") -> None:
        self.console, self.label, self.total, self.start, self.unit = console, label, total, start, unit
        self.status, self.every_s, self.clock = status, every_s, clock
        self.done = start
        self._bar: Any = None
        self._started = self._printed = 0.0
        self._first: tuple[float, int] | None = None  # (time, done) at the first update
        self._idle_since: float | None = None  # when the last evaluation before the first step ended

    def __enter__(self) -> StepProgress:
        self._started = self._printed = self.clock()
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            # The ETA is the rate since the first update (rich's default, the last 30 s, has no rate at all once a
            # step takes longer than that); rich leaves the first update's own time out.
            self._bar = Progress(TextColumn("{task.description} {task.completed}/{task.total}"), BarColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=self.console, get_time=self.clock, speed_estimate_period=10**9)
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

    @contextlib.contextmanager
    def evaluation(self, what: str, problems: int) -> Iterator[Callable[[int], None]]:
        """Show an evaluation of ``problems`` inside this phase (``what``: e.g. "evaluating the baseline"); yields
        the callable to give the problems answered so far. The steps' rate leaves it out."""
        if self._bar is not None:
            task = self._bar.add_task(f"{what}: answered", total=problems, status="")
            try:
                yield lambda answered: self._bar.update(task, completed=answered)
            finally:
                self._bar.remove_task(task)
        else:
            with evaluation(self.console, what, problems, clock=self.clock, every_s=self.every_s) as answered:
                yield answered
        if self._first is None:
            self._idle_since = self.clock()

    def _line(self) -> None:
        now = self.clock()
        self._printed = now
        elapsed, steps = now - self._started, self.done - self.start
        timing = f"elapsed {_clock_text(elapsed)}"
        if steps > 0 and self._first is not None and self.done > self._first[1]:  # timed from the first step's end
            since, first = self._first
            per_step = (now - since) / (self.done - first)
            timing = f"{per_step:.1f} s/{self.unit}  {timing}  ETA {_clock_text(per_step * (self.total - self.done))}"
        elif steps > 0:  # one update so far: its time holds one-off work (and an evaluation before it)
            took = now - (self._idle_since if self._idle_since is not None else self._started)
            if steps == 1 and self.done < self.total:  # a rate from it alone would mislead: say what it holds
                timing = f"first {self.unit} {took:.1f} s (with set-up; ETA from the next)  {timing}"
            else:
                per_step = took / steps
                timing = (f"{per_step:.1f} s/{self.unit}  {timing}  "
                          f"ETA {_clock_text(per_step * (self.total - self.done))}")
        self.console.print(f"{self.label} {self.done}/{self.total}  {self.status}  {timing}".replace("    ", "  "),
                           highlight=False, soft_wrap=True)


@contextlib.contextmanager
def evaluation(console: Any, what: str, problems: int, clock: Callable[[], float] = time.monotonic,
               every_s: float = EVERY_S) -> Iterator[Callable[[int], None]]:
    """An evaluation of ``problems`` shown on its own (outside a step phase): problems answered, rate and ETA."""
    with StepProgress(console, f"{what}: answered", problems, every_s=every_s, clock=clock, unit="problem") as shown:
        yield lambda answered: shown.update(answered, "")


CLIPPED_WARNING = 0.25
"""The share of answers cut at ``max_tokens`` above which a run or an evaluation warns."""


def clipped_warning(share: float | None, max_tokens: int, what: str) -> str | None:
    """The one-line warning when more than a quarter of ``what`` (e.g. "the training answers of step 3") hit
    ``max_tokens``, with the fix; None below that (or when the share is not known)."""
    if share is None or not share > CLIPPED_WARNING:
        return None
    return (f"warning: {share:.0%} of {what} hit max_tokens={max_tokens} and were cut off; their rewards judge "
            f"unfinished answers. Raise the budget, e.g. max_tokens={2 * max_tokens}")


class ClippedWatch:
    """Prints :func:`clipped_warning` on ``console`` once per kind of answer (training, held-out) in a run."""

    def __init__(self, console: Any, max_tokens: int) -> None:
        self.console, self.max_tokens = console, max_tokens
        self.warned: set[str] = set()

    def check(self, kind: str, share: float | None, what: str) -> None:
        """Warn about ``what`` (answers of ``kind``) unless ``kind`` was warned about already."""
        text = clipped_warning(share, self.max_tokens, what)
        if text is not None and kind not in self.warned:
            self.warned.add(kind)
            self.console.print(text, style="yellow", highlight=False, soft_wrap=True, markup=False)

