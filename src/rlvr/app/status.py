"""A run's ``status.json`` through its life, and the clean stop around it: ``running``, then ``finished``,
``failed`` (with the error) or ``interrupted`` (with the step its last checkpoint reached and the command that
continues it).

    with running(run_dir, console, stopped=lambda: Stopped(7, "step 7/20", "rlvr resume runs/x")) as stop:
        train(..., stop=stop)          # SIGTERM / Ctrl-C set ``stop`` (``stop.py``) inside the block

A stop ends the block with RunInterrupted (``exit_code`` 128 + the signal) after the run is marked and the command
printed. ``rlvr runs`` reads these files; a run marked running whose process is gone shows as ``died``. Every run
entering the block (a fresh or resumed ``rlvr train`` or ``rlvr sft`` run) is added to the run index
(``home.index_run``), so ``rlvr runs`` finds it wherever its folder is.

:func:`stopped_at` tells where a stopped run stands from its run record (``rlvr.rl.run_record``), for ``rlvr train``
and ``rlvr sft`` alike.

What it is not: the checkpoint a stop writes (the loop's ``finish_step``, the warm-up's and sft's step callbacks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.app.commands import user_command
from rlvr.errors import RunInterrupted
from rlvr.fileio import write_atomic
from rlvr.home import index_run, run_index
from rlvr.rl.run_record import RunRecord
from rlvr.rl.stop import StopRequest

__all__ = ["Stopped", "mark", "running", "stopped_at", "write_status"]

logger = logging.getLogger("rlvr.run")


@dataclass
class Stopped:
    """Where a stopped run stands, as its status and the console tell it."""

    step: int
    """The step its last checkpoint reached (0: none yet)."""
    where: str
    """The same for a person: ``step 7/20``, ``warm-up step 4/10``."""
    command: str
    """The one command that continues it."""
    note: str = ""
    """What the command does, when not a plain resume."""


def stopped_at(record: RunRecord, steps: int, warmup_steps: int = 0) -> Stopped:
    """Where a stopped run stands, from what its record reached (``RunRecord.reached``): the step of its last
    checkpoint (0 in the warm-up of ``warmup_steps`` or before any), and the command that continues it; ``rlvr
    eval`` when training reached ``steps`` and only the final evaluation was stopped."""
    reached = record.reached()
    resume = user_command("resume", str(record.run_dir))
    if reached is None:
        return Stopped(0, "step 0", resume, "no checkpoint yet; start it again (from step 0) with:")
    if reached.kind == "warmup":
        return Stopped(0, f"warm-up step {reached.step}/{warmup_steps}", resume)
    where = f"step {reached.step}/{steps}"
    if reached.step >= steps:
        return Stopped(reached.step, where, user_command("eval", "--checkpoint", str(record.run_dir)),
                       "training is complete; its final evaluation was stopped. Evaluate it with:")
    return Stopped(reached.step, where, resume)


def write_status(run_dir: Path, status: str, **extra: Any) -> None:
    record = {"status": status, "pid": os.getpid(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}
    write_atomic(Path(run_dir) / "status.json", json.dumps(record))


def mark(run_dir: Path, status: str, **extra: Any) -> None:
    """``write_status`` where a run is ending on an error already: a status that cannot be written (the disk that
    just filled) is logged, and the run's own error is the one raised."""
    try:
        write_status(run_dir, status, **extra)
    except OSError as exc:
        logger.warning("could not mark %s %s in its status.json (%s); `rlvr runs` will show it as died",
                       run_dir, status, exc)


@contextlib.contextmanager
def running(run_dir: Path, console: Any, stopped: Callable[[], Stopped], **extra: Any) -> Iterator[StopRequest]:
    """Mark ``run_dir`` running for the block (``extra``: more fields of every status record), with SIGTERM and
    Ctrl-C asking the yielded StopRequest for a clean stop; then finished, failed or interrupted."""
    write_status(run_dir, "running", **extra)
    try:
        index_run(run_dir)
    except OSError as exc:  # the run goes on; only `rlvr runs` run elsewhere misses it
        logger.warning("could not add %s to the run index under %s (%s); `rlvr runs` lists it only given its parent "
                       "folder (rlvr runs PARENT)", run_dir, run_index(), exc)
    stop = StopRequest()
    try:
        with stop.on_signals(lambda text: console.print(text, highlight=False, soft_wrap=True)):
            yield stop
    except KeyboardInterrupt as exc:  # RunInterrupted, or Ctrl-C where no handler could be installed
        signum = exc.signum if isinstance(exc, RunInterrupted) else signal.SIGINT
        name, where = signal.Signals(signum).name, stopped()
        mark(run_dir, "interrupted", step=where.step, at=where.where, signal=name, resume=where.command, **extra)
        console.print(f"stopped by {name}: {where.note or f'checkpoint at {where.where}. Resume with:'}",
                      highlight=False, soft_wrap=True, markup=False)
        console.print(f"  {where.command}", highlight=False, soft_wrap=True, markup=False)
        raise RunInterrupted(signum, where.step, f"stopped by {name} at {where.where}") from None
    except BaseException as exc:
        mark(run_dir, "failed", error=f"{type(exc).__name__}: {exc}", **extra)
        raise
    write_status(run_dir, "finished", **extra)
