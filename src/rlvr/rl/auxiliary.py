"""Auxiliary outputs of a run: a failure there is logged and counted, and training goes on.

    outputs = AuxiliaryOutputs()
    outputs.run("rollout page", rollout_log.write, step, records)   # None (and a logged warning) if it raised

Auxiliary are the outputs a person looks at but no later step reads: the rollout pages, the curves, the tracker
backends (MLflow, TensorBoard, W&B). Whatever a model writes, or a full disk, or a broken plotting install, they must
not end a run that is otherwise training. The run's own records are not auxiliary: ``metrics.jsonl``,
``checkpoints.jsonl``, the checkpoints and ``config.yaml`` are what a resume and every reader depend on, and a
failure to write them ends the run loudly.

The loop reports the count so far as ``aux/failures`` in each step's metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("rlvr.auxiliary")

T = TypeVar("T")


class AuxiliaryOutputs:
    """Runs auxiliary outputs, counting failures by output name instead of raising them."""

    def __init__(self) -> None:
        self.failures: dict[str, int] = {}
        """Output name -> failures so far."""

    def run(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``, or None when it raised an ``Exception`` (logged with its traceback, counted)."""
        try:
            return fn(*args, **kwargs)
        except Exception:
            self.failures[name] = self.failures.get(name, 0) + 1
            logger.warning("%s failed (%d so far); training goes on without it", name, self.failures[name],
                           exc_info=True)
            return None

    @property
    def total(self) -> int:
        """Failures of every output so far."""
        return sum(self.failures.values())
