"""Experiment tracking: every run writes ``metrics.jsonl``; MLflow, TensorBoard and W&B mirror it when asked.

    with open_trackers(["mlflow"], run_dir, config=asdict(config)) as tracker:
        tracker.log({"env/all/reward/mean": 0.4}, step=0)

Each backend (``BACKENDS``: ``mlflow``, ``tensorboard``, ``wandb``) is an optional extra imported only when named; an
unknown name or a missing package is an error naming the extra to install, raised before any training starts. All
three stay in the run folder unless the user points them elsewhere (``MLFLOW_TRACKING_URI``, ``WANDB_MODE``), with
their telemetry off unless the user turns it on. Metric names reach every backend as logged, except where a backend
refuses a character (MLflow: :func:`mlflow_name` writes ``:`` as ``.``). Where each one writes and how to browse it:
``docs/training.md`` ("Trackers").

On a resume, ``metrics.jsonl`` (the run's record) first loses its rows of the steps the resume re-runs (those at or
after the checkpoint's step), so it holds each step once. The backends cannot take rows back: each resume is a new
MLflow run / W&B run / TensorBoard event file, so the interrupted one keeps the steps it logged after its last
checkpoint, and the resumed one logs them again.

Not here: artifacts (checkpoints, rollout pages), continuing one MLflow or W&B run across a resume, marking a crashed
run as failed in the backends (``close`` does not know why it was called).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Protocol

from rlvr.errors import ConfigurationError
from rlvr.fileio import jsonl_line, open_jsonl, read_jsonl, write_atomic
from rlvr.rl.auxiliary import AuxiliaryOutputs

logger = logging.getLogger("rlvr.tracking")


class Tracker(Protocol):
    """One destination for a run's metrics."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlTracker:
    """``metrics.jsonl`` in the run folder: one JSON object per step, appended (a resumed run continues it; a torn
    last line left by a killed process is cut off first).

    ``start_step`` (a resume's first step): rows of that step and later, logged before the run was stopped, are
    dropped first (the file rewritten atomically), so the file holds each step once, as the resumed run logs it."""

    def __init__(self, run_dir: Path, start_step: int | None = None) -> None:
        path = Path(run_dir) / "metrics.jsonl"
        if start_step is not None and path.exists():
            drop_rows_from(path, start_step)
        self.file = open_jsonl(path)  # closed by close()

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.file.write(jsonl_line({"step": step, **metrics}))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (``{"distributed": {"backend": "local"}}`` -> ``distributed.backend``); lists and
    other non-scalars as JSON text, so every value is a str, int, float, bool or None."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, f"{name}."))
        elif value is None or isinstance(value, str | int | float | bool):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


def _missing(tracker: str, error: ImportError) -> ConfigurationError:
    return ConfigurationError(f"trackers=[{tracker!r}] needs: pip install 'rlvr[{tracker}]' ({error})")


# MLflow


_MLFLOW_FORBIDDEN = re.compile(r"[^\w\-. /]")
_MLFLOW_PARAM_CHARS = 6000  # MLflow's longest param value
_MLFLOW_BATCH = {"params": 100, "metrics": 1000}  # MLflow's largest log_batch


def mlflow_name(name: str) -> str:
    """``name`` as MLflow accepts it on every OS: ``:`` becomes ``.``, any other character MLflow refuses ``_``."""
    return _MLFLOW_FORBIDDEN.sub("_", name.replace(":", "."))


class MlflowTracker:
    """One MLflow run in the experiment named after the run folder, in ``RUN_DIR/mlruns/mlflow.db``."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # MLflow reads it at import and at each event
        try:
            import alembic  # noqa: F401  the SQLite store needs these two; mlflow-skinny does not bring them
            import sqlalchemy  # noqa: F401
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise _missing("mlflow", error) from error
        self._metric = Metric
        store = (run_dir / "mlruns").resolve()
        user_uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not user_uri:
            store.mkdir(exist_ok=True)
        self.client = MlflowClient(tracking_uri=user_uri or f"sqlite:///{(store / 'mlflow.db').as_posix()}")
        name = run_dir.resolve().name
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:  # artifacts beside the store, not in ./mlartifacts of whatever the working directory is
            artifacts = None if user_uri else (store / "artifacts").as_uri()
            experiment_id = self.client.create_experiment(name, artifact_location=artifacts)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        params = [Param(mlflow_name(k), str(v)[:_MLFLOW_PARAM_CHARS]) for k, v in flatten_config(config).items()]
        for i in range(0, len(params), _MLFLOW_BATCH["params"]):
            self.client.log_batch(self.run_id, params=params[i:i + _MLFLOW_BATCH["params"]])
        self._names: dict[str, str] = {}  # MLflow name -> the name logged, to catch two names becoming one

    def log(self, metrics: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            name = mlflow_name(key)
            if self._names.setdefault(name, key) != key:
                logger.warning("MLflow: metrics %r and %r are both logged as %r", self._names[name], key, name)
            batch.append(self._metric(name, float(value), now_ms, step))
        for i in range(0, len(batch), _MLFLOW_BATCH["metrics"]):
            self.client.log_batch(self.run_id, metrics=batch[i:i + _MLFLOW_BATCH["metrics"]])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


# TensorBoard


class TensorBoardTracker:
    """tensorboardX event files in ``RUN_DIR/tensorboard``, one scalar per metric, tags as logged."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            from tensorboardX import FileWriter
            from tensorboardX.proto.summary_pb2 import Summary
            from tensorboardX.summary import text
        except ImportError as error:
            raise _missing("tensorboard", error) from error
        self._summary = Summary
        self.writer = FileWriter(str(run_dir / "tensorboard"))
        if config:  # indented four spaces: TensorBoard's text tab shows markdown, this as code
            body = "\n".join("    " + line for line in json.dumps(config, indent=2, default=str).splitlines())
            self.writer.add_summary(text("config", body), 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self.writer.add_summary(self._summary(value=values), step)
        self.writer.flush()  # one write per training step: cheap, and a killed run keeps its curves

    def close(self) -> None:
        self.writer.close()


# Weights & Biases


class WandbTracker:
    """A W&B run in ``RUN_DIR/wandb``: offline unless the user's ``WANDB_MODE`` says otherwise."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # wandb-core reports its errors to W&B otherwise
        try:
            import wandb
        except ImportError as error:
            raise _missing("wandb", error) from error
        # An explicit mode= beats WANDB_MODE inside wandb, so pass the user's choice on ourselves.
        mode = os.environ.get("WANDB_MODE") or "offline"
        self.run = wandb.init(project="rlvr", name=run_dir.resolve().name, dir=str(run_dir), config=config,
                              mode=mode)  # type: ignore[arg-type]  # WANDB_MODE as set; wandb validates it itself

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def drop_rows_from(path: Path, step: int) -> int:
    """Rewrite the JSONL file ``path`` atomically without its rows whose ``step`` is ``step`` or later; returns how
    many rows were dropped."""
    rows = read_jsonl(path)
    kept = [row for row in rows if row.get("step", -1) < step]
    if len(kept) < len(rows):
        write_atomic(path, b"".join(jsonl_line(row) for row in kept))
    return len(rows) - len(kept)


BACKENDS: dict[str, Any] = {"mlflow": MlflowTracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker}
"""Tracker name -> factory(run_dir, config) for the optional backends; each name is also its extra's name."""


class Trackers:
    """All of a run's trackers as one: logs to each, closes each.

    The first is ``metrics.jsonl``, the run's own record: its failures raise. The others are auxiliary outputs: a
    backend that fails is logged and counted in ``auxiliary`` and training goes on."""

    def __init__(self, trackers: list[Tracker], auxiliary: AuxiliaryOutputs | None = None) -> None:
        self.trackers = trackers
        self.auxiliary = auxiliary or AuxiliaryOutputs()

    def log(self, metrics: dict[str, float], step: int) -> None:
        primary, *backends = self.trackers
        primary.log(metrics, step)
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for tracker in backends:
            self.auxiliary.run(f"tracker {type(tracker).__name__}", tracker.log, finite, step)

    def close(self) -> None:
        if not self.trackers:
            return
        primary, *backends = self.trackers
        for tracker in backends:
            self.auxiliary.run(f"tracker {type(tracker).__name__}", tracker.close)
        primary.close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_trackers(names: list[str], run_dir: str | Path, config: dict[str, Any] | None = None,
                  auxiliary: AuxiliaryOutputs | None = None, start_step: int | None = None) -> Trackers:
    """metrics.jsonl plus the named optional backends, opened now so a missing package fails before training; the
    backends' later failures are counted in ``auxiliary``. ``start_step`` (a resume): metrics.jsonl's rows from that
    step on are dropped first (see ``JsonlTracker``)."""
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ConfigurationError(f"trackers={names}: unknown {unknown}; choose from {sorted(BACKENDS)}")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    trackers: list[Tracker] = [JsonlTracker(Path(run_dir), start_step)]
    try:
        for name in names:
            trackers.append(BACKENDS[name](Path(run_dir), config or {}))
    except BaseException:  # close what did open (the JSONL file, an MLflow run) before the error reaches the user
        Trackers(trackers).close()
        raise
    return Trackers(trackers, auxiliary)
