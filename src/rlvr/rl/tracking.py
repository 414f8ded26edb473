"""Experiment tracking: every run writes ``metrics.jsonl``; MLflow, TensorBoard and W&B mirror it when asked.

    with open_trackers(["mlflow"], run_dir, config=asdict(config)) as tracker:
        tracker.log({"env/all/reward/mean": 0.4}, step=0)

Each backend is an optional extra imported only when named; an unknown name or a missing package is an error that
names the extra to install, raised before any training starts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from rlvr.errors import ConfigurationError


class Tracker(Protocol):
    """One destination for a run's metrics."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlTracker:
    """``metrics.jsonl`` in the run folder: one JSON object per step, appended (a resumed run continues it)."""

    def __init__(self, run_dir: Path) -> None:
        self.file = open(Path(run_dir) / "metrics.jsonl", "a")  # closed by close()

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


BACKENDS: dict[str, Any] = {}
"""Tracker name -> factory(run_dir, config) for the optional backends."""


class Trackers:
    """All of a run's trackers as one: logs to each, closes each."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log(self, metrics: dict[str, float], step: int) -> None:
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for tracker in self.trackers:
            tracker.log(finite if tracker is not self.trackers[0] else metrics, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_trackers(names: list[str], run_dir: str | Path, config: dict[str, Any] | None = None) -> Trackers:
    """metrics.jsonl plus the named optional backends, opened now so a missing package fails before training."""
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ConfigurationError(f"trackers={names}: unknown {unknown}; choose from {sorted(BACKENDS)}")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    trackers: list[Tracker] = [JsonlTracker(Path(run_dir))]
    for name in names:
        trackers.append(BACKENDS[name](Path(run_dir), config or {}))
    return Trackers(trackers)
