"""``rlvr runs``: the run folders under a root, with status, steps, best reward, held-out accuracy and disk use.

A run's status comes from its ``status.json`` (written by ``rlvr train`` and ``rlvr sft``: ``status.py``):
``running``, ``finished``, ``failed`` or ``interrupted``; a run marked running whose process is gone shows as
``died``. Disk use counts the run folder (its checkpoints live there) and the checkpoints of older runs that live
under ``$RLVR_HOME/checkpoints``.

What it is not: a tracker (``rlvr.rl.tracking``) or a plotter (``rlvr.rl.plot``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from rlvr.fileio import read_jsonl
from rlvr.rl.checkpoints import disk_use


@dataclass
class RunInfo:
    """One run folder, summarised."""

    path: str
    status: str
    steps_done: int
    steps: int | None
    best_reward: float | None
    baseline_accuracy: float | None
    after_accuracy: float | None
    disk_bytes: int = 0
    """What the run holds on disk, checkpoints included."""


def list_runs(root: str | Path = "runs") -> list[RunInfo]:
    """Every run folder directly under ``root`` (newest first)."""
    root = Path(root)
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and ((p / "metrics.jsonl").exists()
                                                            or (p / "status.json").exists())]
    return [describe_run(p) for p in sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True)]


def describe_run(path: Path) -> RunInfo:
    """Summarise one run folder from its files."""
    status = _read_json(path / "status.json").get("status", "unknown")
    if status == "running" and not _alive(_read_json(path / "status.json").get("pid")):
        status = "died"
    rewards, steps_done = [], 0
    if (path / "metrics.jsonl").exists():
        for row in read_jsonl(path / "metrics.jsonl", bad_lines="skip"):
            steps_done = max(steps_done, int(row.get("step", -1)) + 1)
            value = row.get("env/all/reward/mean")
            if isinstance(value, (int, float)) and math.isfinite(value):
                rewards.append(value)
    steps = None
    if (path / "config.yaml").exists():
        import yaml

        steps = (yaml.safe_load((path / "config.yaml").read_text()) or {}).get("steps")
    summary = _read_json(path / "summary.json")
    return RunInfo(path=str(path), status=status, steps_done=steps_done, steps=steps,
                   best_reward=max(rewards) if rewards else None,
                   baseline_accuracy=summary.get("baseline", {}).get("test/correct"),
                   after_accuracy=summary.get("after", {}).get("test/correct"), disk_bytes=disk_use(path))


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
