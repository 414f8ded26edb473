"""Rollouts: a step's groups played and scored, from the loop's env dataset.

    rollouts = Rollouts(dataset, tokenizer, config, runner)            # runner: None unless the dataset asks for one
    parts = rollouts.start(step, sampler, params, parts=1)             # requests in flight, nothing awaited
    rollout = rollouts.collect(parts[0])                               # answers, scored: a Rollout

The training loops (``loop.py``) see only this class: ``start`` sends a step's batch (of its curriculum stage's
dataset, ``RLDataset.stage``) to the dataset's ``play.start`` without waiting, split into ``parts`` when the loop
streams minibatches; ``collect`` waits for one part and makes its ``Rollout``: the rewards the loop centres, and the
rollout-log records, built here from the played groups for every dataset. ``metrics`` are the step's ``env/all/...``
numbers, ``held_out`` the greedy evaluation, ``probe`` the tokens the loop checks the sampler's freshness on.

Every task is an env dataset: a ``ProblemSource`` reaches the loop as ``problems.SourceDataset``, whose one-turn
groups the run's reward runner scores (``docs/rollouts.md``). Where a runner scored a part, its ``BatchScores``
travel with it and give the reward metrics (failed calls, timeouts, a composite reward's parts).

Not here: advantages and datums (``advantages.py``, ``datums.py``, ``envs.trajectory_datums``), training.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rlvr import types
from rlvr.errors import ConfigurationError
from rlvr.rewards.runner import BatchScores
from rlvr.rl.config import LoopConfig
from rlvr.rl.envs import EnvGroupBuilder, PendingPart, PlayContext, RLDataset, Trajectory, clipped_share
from rlvr.rl.protocols import RewardScorer, SamplingAPI

__all__ = ["Rollout", "Rollouts", "StartedPart", "check_dataset"]


@dataclass
class Rollout:
    """Rollouts of some groups, scored: what the rest of the step trains on and logs."""

    trajectories: list[list[Trajectory]]
    """Per group, its trajectories."""
    rewards: list[list[float | None]]
    """Per group, each trajectory's reward (None: scoring failed, and the group is not trained on)."""
    records: list[dict[str, Any]]
    """Rollout-log records, one per trajectory in group order, without their advantage."""
    sampled_tokens: int
    """Tokens sampled in all."""
    reward_s: float
    """Seconds spent scoring (for envs: in their ``step`` calls)."""
    scores: BatchScores | None = None
    """Where the run's reward runner scored the part: its scores, one per trajectory in group order."""


def _stage_start(curriculum: dict[int, float], step: int) -> int:
    """The step at which the curriculum stage that ``step`` falls in starts (a key of ``curriculum``)."""
    return max(s for s in curriculum if s <= step)


def _part_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each of ``parts`` consecutive, near-equal parts of ``count`` items (a streamed step's)."""
    return list(itertools.pairwise([i * count // parts for i in range(parts + 1)]))


@dataclass
class StartedPart:
    """A pending part of a step's batch: its builders, their position in the batch, and the dataset's pending."""

    builders: list[EnvGroupBuilder]
    first: int
    pending: PendingPart


class Rollouts:
    """A batch of the loop's env dataset per step (of the curriculum stage's dataset, with a curriculum), played the
    dataset's way (its ``play``) and collected as ``Rollout``s. The dataset has at least one batch
    (``check_dataset``, which ``phases.open_run`` runs before any work)."""

    def __init__(self, dataset: RLDataset, tokenizer: Any, config: LoopConfig,
                 runner: RewardScorer | None = None) -> None:
        dataset.bind_tokenizer(tokenizer)
        self.dataset, self.tokenizer, self.config = dataset, tokenizer, config
        # every stage made now, so a dataset that cannot narrow (or a stage with no batch) is refused before any work
        self.stages = {step: dataset.stage(bound) for step, bound in sorted(config.curriculum.items())}
        for step, stage in self.stages.items():
            if len(stage) < 1:
                raise ConfigurationError(f"curriculum: {type(dataset).__name__}.stage({config.curriculum[step]}) "
                                         f"(from step {step}) has no batches: no group is that easy; raise the "
                                         "stage's max_difficulty")
        self._check_parts(self._dataset_at(0), len(self._dataset_at(0).batch_at(0)))  # before any sampling
        self.held_out_size = len(dataset.test_groups())  # groups (problems) held_out evaluates
        self._threads = ThreadPoolExecutor(1, thread_name_prefix="rlvr-rollouts")
        self.context = PlayContext(self._threads, config.max_turns, runner)

    def _dataset_at(self, step: int) -> RLDataset:
        """The dataset ``step`` draws its batch from: the curriculum stage it falls in, or the whole dataset."""
        if not self.stages:
            return self.dataset
        return self.stages[_stage_start(self.config.curriculum, step)]

    def start(self, step: int, sampler: SamplingAPI, params: types.SamplingParams, parts: int = 1) -> list[StartedPart]:
        """Send ``step``'s sampling requests with ``sampler``; returns ``parts`` pending parts, in order."""
        dataset = self._dataset_at(step)
        builders = list(dataset.batch_at(step))
        self._check_parts(dataset, len(builders), parts)
        bounds = _part_bounds(len(builders), parts)
        pending = dataset.play.start(sampler, [builders[a:b] for a, b in bounds], params, self.context)
        return [StartedPart(builders[a:b], a, p) for (a, b), p in zip(bounds, pending, strict=True)]

    def _check_parts(self, dataset: RLDataset, groups: int, parts: int | None = None) -> None:
        """Refuse to stream a batch of ``groups`` groups in more parts than it has groups."""
        parts = parts or self.config.stream_minibatches
        if parts > groups:
            raise ConfigurationError(f"stream_minibatches={parts}, but a batch of {type(dataset).__name__} holds "
                                     f"{groups} groups (problems_per_step, for a problem source): stream at most "
                                     f"{groups} parts")

    def collect(self, part: StartedPart) -> Rollout:
        """Wait for one pending part: its rewards (None where scoring failed) and rollout-log records."""
        played = part.pending.result()
        trajectories = [g.trajectories for g in played.groups]
        rewards: list[list[float | None]] = [[None if math.isnan(r) else r for r in g.total_rewards()]
                                             for g in played.groups]
        sampled = sum(len(t.action) for group in trajectories for trajectory in group for t in trajectory.transitions)
        records = [self._record(builder, part.first + b, t, r)
                   for b, (builder, group, rewards_G) in enumerate(zip(part.builders, played.groups, rewards,
                                                                       strict=True))
                   for t, r in zip(group.trajectories, rewards_G, strict=True)]
        return Rollout(trajectories, rewards, records, sampled, played.scoring_s, played.scores)

    def _record(self, builder: EnvGroupBuilder, position: int, trajectory: Trajectory,
                reward: float | None) -> dict[str, Any]:
        """A trajectory's rollout-log record (without its advantage): the loop's fields, then the trajectory's own."""
        failure = trajectory.failure or (None if trajectory.finished else f"cut at max_turns={self.config.max_turns}")
        response = trajectory.logs["response"] if "response" in trajectory.logs else self._conversation(trajectory)
        return {"problem_id": f"{type(builder).__name__}[{position}]",
                "prompt": self.tokenizer.decode(trajectory.transitions[0].observation),
                "response": response, "reward": reward, "parts": {}, "failure": failure, **trajectory.logs}

    def _conversation(self, trajectory: Trajectory) -> str:
        """What followed the first observation: the actions and the env's replies, as text."""
        if not trajectory.transitions:
            return ""
        first, last = trajectory.transitions[0], trajectory.transitions[-1]
        full = last.observation + last.action
        if full[:len(first.observation)] == first.observation:
            return self.tokenizer.decode(full[len(first.observation):])
        return "\n---\n".join(self.tokenizer.decode(t.action) for t in trajectory.transitions)

    def metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        """``env/all/...`` over every part of the step: the runner's scores where it scored them, else the episodes'
        rewards, turns, tokens and the envs' own numbers; and ``env/all/clipped``, the share of sampled turns cut at
        ``max_tokens`` (left out where no turn says)."""
        if rollouts and all(r.scores is not None for r in rollouts):
            metrics = _scored_metrics(rollouts)
        else:
            metrics = _episode_metrics(rollouts)
        clipped = clipped_share([turn for r in rollouts for group in r.trajectories for trajectory in group
                                 for turn in trajectory.transitions])
        if clipped is not None:
            metrics["env/all/clipped"] = clipped
        return metrics

    def step_metrics(self, step: int) -> dict[str, float]:
        """Numbers about what ``step`` trains on: the curriculum stage's hardest difficulty."""
        if not self.stages:
            return {}
        bound = self.config.curriculum[_stage_start(self.config.curriculum, step)]
        return {"curriculum/max_difficulty": self._dataset_at(step).hardest(bound)}

    def held_out(self, sampler: SamplingAPI, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        """Greedy evaluation on the dataset's held-out groups (empty: there are none); ``answered`` is given the
        number answered so far as answers come in."""
        if not self.held_out_size:
            return {}
        return self.dataset.play.evaluate(sampler, self.dataset.test_groups(), self.config.max_tokens, self.context,
                                          answered)

    def probe(self) -> list[int]:
        """Tokens whose logprobs the loop compares between sampler and trainer."""
        return list(self.dataset.get_batch(0)[0].make_envs()[0].initial_observation())[:16]

    def close(self) -> None:
        """Release the rollout thread."""
        self._threads.shutdown()


def _scored_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """The reward runner's numbers (``BatchScores.metrics``: failed calls, timeouts, a composite reward's parts), the
    ``correct`` and ``format`` parts where the reward has them (else correct = full reward), tokens per answer."""
    scores = BatchScores.concat([r.scores for r in rollouts if r.scores is not None])
    metrics = scores.metrics("env/all/reward")
    scored = [v for v in scores.scores if v is not None]
    for part in ("correct", "format"):  # the parts of format_correct, or: solved = full reward
        values = [v for v in scores.parts.get(part, []) if v is not None]
        if values:
            metrics[f"env/all/{part}"] = sum(values) / len(values)
    metrics.setdefault("env/all/correct", sum(v >= 1.0 for v in scored) / max(len(scored), 1))
    metrics["env/all/ac_tokens_per_turn"] = sum(r.sampled_tokens for r in rollouts) / len(scores.scores)
    return metrics


def _episode_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Rewards, turns, tokens, and the envs' own numbers (averaged over turns), over every episode of the step."""
    trajectories = [t for r in rollouts for group in r.trajectories for t in group]
    flat = [x for r in rollouts for rewards_G in r.rewards for x in rewards_G]
    scored = [x for x in flat if x is not None]  # None: the episode's scorer failed
    turns = [t for trajectory in trajectories for t in trajectory.transitions]
    sampled = sum(r.sampled_tokens for r in rollouts)
    metrics = {"env/all/reward/mean": sum(scored) / len(scored) if scored else math.nan,
               "env/all/reward/scored:sum": float(len(scored)),
               "env/all/reward/errors:sum": float(len(flat) - len(scored)),
               "env/all/correct": sum(x >= 1.0 for x in scored) / len(flat),
               "env/all/turns": len(turns) / len(flat), "env/all/ac_tokens_per_turn": sampled / max(len(turns), 1),
               "env/all/unfinished": sum(not t.finished for t in trajectories) / len(flat)}
    for key in sorted({k for t in turns for k in t.metrics}):  # the envs' own numbers, averaged over turns
        values = [t.metrics[key] for t in turns if key in t.metrics]
        metrics[f"env/all/{key}"] = sum(values) / len(values)
    return metrics


def check_dataset(config: LoopConfig, dataset: RLDataset) -> None:
    """What the loop cannot do with an env dataset, refused before any work."""
    if len(dataset) < 1:
        raise ConfigurationError(f"{type(dataset).__name__} has no batches; an env dataset needs at least one")
