"""The RLVR loop over an env dataset (a problem source becomes one): roll out groups, score, centre, train, log, save.

    result = train(LoopConfig(base_model="tiny", steps=10), source)    # {"before", "after", "plot", ...}

One function per mode, each a ``for step`` that reads top to bottom as the phases of ``phases.py``:

- :func:`train_sync` (the default): sample this step's groups with the current weights, score them, train.
- :func:`train_streamed` (``stream_minibatches``): the step's groups in parts, each trained on (its
  ``forward_backward`` sent) as soon as it is scored while later parts still sample. With ``num_substeps=1`` the
  update equals the synchronous one.
- :func:`train_off_policy` (``max_steps_off_policy``): later steps' rollouts stay in flight, sampled with the
  weights of the step that started them, while the current step trains; each batch is at most that many updates
  old (the importance-sampling losses correct for it). Combined with ``stream_minibatches``, a batch trains part
  by part.

:func:`train` sets the run up (``phases.open_run``: fresh, or resumed from the last checkpoint), evaluates before and
after, and runs the mode the config asks for. The loops drive only the client API, so they run alike on the
in-process engine, a server or Ray. Every task is an env dataset (``envs.RLDataset``): a ``ProblemSource`` becomes
``problems.SourceDataset``, one-turn groups scored by the run's reward workers; other datasets play turn by turn
and their envs score themselves. The dataset's held-out groups are the evaluation.

A curriculum (``LoopConfig.curriculum``) narrows the dataset to a difficulty stage (``RLDataset.stage``). Truncated
importance weights are ``loss_fn="cispo"`` with ``clip_low_threshold=0`` (see ``losses.cispo``). The algorithm
objects of the TenSafe cookbook live in ``integrations/tensafe``, the rollout pages in ``rollout_log.py``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from rlvr.rl.config import LoopConfig
from rlvr.rl.envs import RLDataset
from rlvr.rl.phases import (
    LoopRun,
    Progress,
    ShowEvaluation,
    StepWork,
    collect_part,
    finish_step,
    held_out,
    open_run,
    refresh_sampler,
    sampling_params,
    send_minibatch,
    send_optim,
)
from rlvr.rl.plot import plot_run
from rlvr.rl.rollouts import StartedPart
from rlvr.rl.stop import StopRequest
from rlvr.tasks.base import ProblemSource

__all__ = ["train", "train_off_policy", "train_streamed", "train_sync"]


def train(config: LoopConfig, source: ProblemSource | RLDataset, progress: Progress | None = None, *,
          stop: StopRequest | None = None, show_evaluation: ShowEvaluation | None = None) -> dict[str, Any]:
    """Run the loop on an env dataset, or on a problem source made one; returns the before/after held-out
    evaluations (absent for a dataset without held-out groups), the curves' path and the training client.

    ``progress`` is called after each step; ``show_evaluation`` shows the held-out evaluations as they go; ``stop``
    (set by a signal, ``stop.py``) ends the run with a checkpoint where the step in flight ends, or at once in the
    evaluations before and after, raising RunInterrupted."""
    mode = (train_off_policy if config.max_steps_off_policy else
            train_streamed if config.stream_minibatches else train_sync)
    results: dict[str, Any] = {}
    with open_run(config, source, progress, stop, show_evaluation) as run:
        if run.start_step == 0:
            with run.stop.abandonable():
                if before := held_out(run, "evaluating the baseline"):
                    results["before"] = before
        mode(run)
        with run.stop.abandonable():
            if after := held_out(run, "evaluating the trained model"):
                results["after"] = after
    lines = {f"{when} accuracy": results[when]["test/correct"] for when in ("before", "after") if when in results}
    results["plot"] = run.auxiliary.run("curves", plot_run, run.run_dir, extra=lines)
    results["training_client"] = run.training_client
    return results


def train_sync(run: LoopRun) -> None:
    """One step at a time: this step's groups, sampled with the current weights, scored and trained on."""
    config = run.config
    for step in range(run.start_step, config.steps):
        work = StepWork(step)

        # Refresh the sampler and check it really samples the current weights.
        sampler = refresh_sampler(run, work.metrics)

        # Roll out this step's groups with it.
        pending = run.rollouts.start(step, sampler, sampling_params(run))
        work.metrics.update({"async/steps_off_policy": 0, **run.rollouts.step_metrics(step)})

        # Collect and score them, centre each group's rewards, build datums, and train: num_substeps
        # minibatches, each a forward_backward and an optim_step, sent without waiting.
        _train_whole(run, work, pending[0])

        # Log, evaluate, checkpoint.
        finish_step(run, work)


def train_streamed(run: LoopRun) -> None:
    """Each step's groups in ``stream_minibatches`` parts, each trained on as soon as it is scored."""
    config = run.config
    for step in range(run.start_step, config.steps):
        work = StepWork(step)

        # Refresh the sampler and check it really samples the current weights.
        sampler = refresh_sampler(run, work.metrics)

        # Roll out this step's groups with it, as parts sent together.
        parts = run.rollouts.start(step, sampler, sampling_params(run), parts=config.stream_minibatches)
        work.metrics.update({"async/steps_off_policy": 0, **run.rollouts.step_metrics(step)})

        # Collect, score and train each part in turn while the later ones still sample; an optim_step
        # after every stream_minibatches / num_substeps parts.
        _train_parts(run, work, parts)

        # Log, evaluate, checkpoint.
        finish_step(run, work)


@dataclass
class _InFlight:
    """One step's rollouts, started."""

    step: int
    """The step it is for."""
    weights_step: int
    """The step whose weights sample it."""
    parts: list[StartedPart]
    """Its pending parts (several when streaming)."""


def train_off_policy(run: LoopRun) -> None:
    """``max_steps_off_policy`` later steps' rollouts in flight while the current step trains on the oldest."""
    config = run.config
    in_flight: collections.deque[_InFlight] = collections.deque()  # rollouts started, oldest first
    for step in range(run.start_step, config.steps):
        work = StepWork(step)

        # Refresh the sampler and check it really samples the current weights.
        sampler = refresh_sampler(run, work.metrics)

        # Start rollouts with it up to max_steps_off_policy steps ahead; this step trains on the oldest batch,
        # sampled with the weights of the step that started it (a resume starts its own again).
        first = in_flight[-1].step + 1 if in_flight else step
        for ahead in range(first, min(step + config.max_steps_off_policy, config.steps - 1) + 1):
            parts = run.rollouts.start(ahead, sampler, sampling_params(run), parts=config.stream_minibatches or 1)
            in_flight.append(_InFlight(ahead, step, parts))
        batch = in_flight.popleft()
        work.metrics.update({"async/steps_off_policy": step - batch.weights_step,
                             **run.rollouts.step_metrics(batch.step)})

        # Collect, score and train on it, whole or part by part as the synchronous and streamed modes do.
        if len(batch.parts) == 1:
            _train_whole(run, work, batch.parts[0])
        else:
            _train_parts(run, work, batch.parts)

        # Log, evaluate, checkpoint.
        finish_step(run, work)


def _train_whole(run: LoopRun, work: StepWork, pending: StartedPart) -> None:
    """Collect one batch, then train on its datums in ``num_substeps`` minibatches, each with an optim_step."""
    work.t_sample = work.seconds_so_far()
    datums, masks = collect_part(run, work, pending)
    size = -(-len(datums) // run.config.num_substeps)
    for first in range(0, len(datums), max(size, 1)):
        send_minibatch(run, work, datums[first:first + size], masks[first:first + size])
        send_optim(run, work)


def _train_parts(run: LoopRun, work: StepWork, parts: list[StartedPart]) -> None:
    """Collect and train on each part in turn (one forward_backward each), with an optim_step after every
    ``len(parts) / num_substeps`` parts."""
    work.t_sample = work.seconds_so_far()
    per_optim = len(parts) // run.config.num_substeps
    for i, pending in enumerate(parts):
        send_minibatch(run, work, *collect_part(run, work, pending))
        if (i + 1) % per_optim == 0:
            send_optim(run, work)

