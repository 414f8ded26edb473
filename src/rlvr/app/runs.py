"""``rlvr runs``: the runs made on this machine, with status, steps, best reward, held-out accuracy and disk use.

Which runs: every run folder in the run index (``home.indexed_runs``: each ``rlvr train`` and ``rlvr sft`` run,
fresh or resumed, wherever its folder is), and the run folders under ``./runs`` (runs made before the index); or,
given a root, the run folders directly under it.

A run's status comes from its ``status.json`` (written by ``rlvr train`` and ``rlvr sft``: ``status.py``):
``running``, ``finished``, ``failed`` or ``interrupted``; a run marked running whose process is gone shows as
``died``. A run that ended (interrupted, failed, died) before its first step says so: ``interrupted before its
first step``, or ``interrupted in warm-up step 4/10`` when its warm-up had begun. Disk use counts the run folder (its
checkpoints live there) and the checkpoints of older runs that live under ``$RLVR_HOME/checkpoints``.

What it is not: a tracker (``rlvr.rl.tracking``) or a plotter (``rlvr.rl.plot``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.errors import RunFileError
from rlvr.fileio import read_jsonl
from rlvr.home import RUN_FILES, indexed_runs
from rlvr.rl.checkpoints import disk_use
from rlvr.rl.run_record import RunRecord

RUNS = Path("runs")
"""Where ``rlvr train`` puts run folders by default, relative to the current folder."""
ENDED = ("interrupted", "failed", "died")


@dataclass
class RunInfo:
    """One run folder, summarised."""

    path: str
    status: str
    """``running``, ``finished``, ``interrupted``, ``failed``, ``died`` (marked running, its process gone) or
    ``unknown``; with where it stopped when it ended before its first step (``interrupted before its first
    step``)."""
    kind: str
    """The recipe of an ``rlvr train`` run, ``sft`` for an ``rlvr sft`` run, ``loop`` for the loop library's."""
    steps_done: int
    steps: int | None
    best_reward: float | None
    baseline_accuracy: float | None
    after_accuracy: float | None
    disk_bytes: int = 0
    """What the run holds on disk, checkpoints included."""


def list_runs(root: str | Path | None = None) -> list[RunInfo]:
    """The runs of this machine (the run index and ``./runs``), or the run folders directly under ``root``; newest
    first (by their last status change)."""
    folders = _run_folders(Path(root)) if root is not None else [*indexed_runs(), *_run_folders(RUNS)]
    unique = {folder.resolve(): folder for folder in reversed(folders)}  # one entry per folder, as first listed
    return [describe_run(p) for p in sorted(unique.values(), key=_last_change, reverse=True)]


def _run_folders(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.is_dir() and any((p / name).exists() for name in RUN_FILES)]


def _last_change(path: Path) -> float:
    """When the run last changed state (its status.json), else when its folder did."""
    for candidate in (path / "status.json", path):
        try:
            return candidate.stat().st_mtime
        except OSError:
            continue
    return 0.0


def describe_run(path: Path) -> RunInfo:
    """Summarise one run folder from its files."""
    record = _read_json(path / "status.json")
    status = record.get("status", "unknown")
    if status == "running" and not _alive(record.get("pid")):
        status = "died"
    rewards, steps_done = [], 0
    if (path / "metrics.jsonl").exists():
        for row in read_jsonl(path / "metrics.jsonl", bad_lines="skip"):
            steps_done = max(steps_done, int(row.get("step", -1)) + 1)
            value = row.get("env/all/reward/mean")
            if isinstance(value, (int, float)) and math.isfinite(value):
                rewards.append(value)
    config = _read_config(path)
    steps = config.get("steps")
    if status in ENDED and steps_done == 0:
        status = f"{status} {_before_first_step(path, config)}"
    summary = _read_json(path / "summary.json")
    return RunInfo(path=str(path), status=status, kind=_kind(path, config),
                   steps_done=steps_done, steps=steps,
                   best_reward=max(rewards) if rewards else None,
                   baseline_accuracy=summary.get("baseline", {}).get("test/correct"),
                   after_accuracy=summary.get("after", {}).get("test/correct"), disk_bytes=disk_use(path))


def _before_first_step(path: Path, config: dict) -> str:
    """Where a run that ended before its first RL step was: in its warm-up (the warm-up steps logged), or before."""
    warmup = path / "warmup.jsonl"
    done = max((int(row.get("step", -1)) + 1 for row in read_jsonl(warmup, bad_lines="skip")), default=0) \
        if warmup.exists() else 0
    if done:
        total = (config.get("warmup") or {}).get("steps", "?")
        return f"in warm-up step {done}/{total}"
    return "before its first step"


def _read_config(path: Path) -> dict:
    """The run's config.yaml as a dict (empty when missing or unreadable)."""
    import yaml

    try:
        values = yaml.safe_load((path / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return values if isinstance(values, dict) else {}


def shown_path(path: str | Path) -> str:
    """A run folder as ``rlvr runs`` names it: relative to the current folder when inside it, else absolute."""
    absolute = Path(path).absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def format_bytes(count: int) -> str:
    """``count`` bytes for a person: ``812 B``, ``66.2 MB``, ``1.3 GB``."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kind(path: Path, config: dict[str, Any]) -> str:
    """The task column: an ``rlvr train`` run's recipe, ``sft`` for an ``rlvr sft`` run, ``loop`` for a run of the
    loop library alone (its run record says which), ``?`` for a folder without a readable config."""
    if not config:
        return "?"
    if "recipe" in config:
        return str(config["recipe"])
    try:
        return "sft" if RunRecord(path).kind == "sft" else "loop"
    except RunFileError:
        return "?"
