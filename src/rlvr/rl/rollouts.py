"""Rollouts: a step's groups sampled and scored, from a problem source or from an env dataset.

    rollouts = ProblemRollouts(source, runner, tokenizer, config)        # or EnvRollouts(dataset, tokenizer, config)
    parts = rollouts.start(step, sampler, params, parts=1)             # requests in flight, nothing awaited
    rollout = rollouts.collect(parts[0])                               # answers, scored: a Rollout

The training loops (``loop.py``) see only this interface: ``start`` sends a step's sampling requests without
waiting (split into ``parts`` when the loop streams minibatches), ``collect`` waits for one part and scores it,
``held_out`` is the greedy evaluation, ``probe`` the tokens the loop checks the sampler's freshness on.

- :class:`ProblemRollouts`: ``problems_per_step`` problems of a ``ProblemSource`` per step (the curriculum stage
  of the step narrows them), ``group_size`` answers each, scored in killable reward workers: a reward that hangs
  or raises is counted and its trajectory carries NaN, never a silent 0.
- :class:`EnvRollouts`: a batch of an ``envs.RLDataset`` per step (of the curriculum stage's dataset,
  ``RLDataset.stage``), played turn by turn in a thread (so later steps' envs, or a streamed batch's later parts,
  play while the loop trains); the envs score themselves.

The two are to become one (``docs/rollouts.md``): a problem source as an env dataset whose one-turn envs are scored
by the reward workers.

Not here: advantages and datums (``advantages.py``, ``datums.py``, ``envs.trajectory_datums``), training.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rlvr import types
from rlvr.errors import ConfigurationError
from rlvr.rewards import RewardItem, RewardRunner
from rlvr.rewards.runner import BatchScores
from rlvr.rl.config import LoopConfig
from rlvr.rl.envs import RLDataset, Trajectory, Transition, evaluate_envs, sample_together
from rlvr.tasks.base import Problem, ProblemSource, select

__all__ = ["EnvRollouts", "ProblemRollouts", "Rollout", "Rollouts", "check_env_dataset", "check_source",
           "curriculum_problems", "evaluate_problems"]


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
    """Problem rollouts: the reward runner's scores, one per answer in group order."""


class Rollouts(ABC):
    """Where a loop's rollouts come from: started without waiting, collected scored."""

    @abstractmethod
    def start(self, step: int, sampler: Any, params: types.SamplingParams, parts: int = 1) -> list[Any]:
        """Send ``step``'s sampling requests with ``sampler``; returns ``parts`` pending parts, in order."""

    @abstractmethod
    def collect(self, pending: Any) -> Rollout:
        """Wait for one pending part and score it."""

    @abstractmethod
    def metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        """``env/all/...`` over all of a step's rollouts."""

    @abstractmethod
    def held_out(self, sampler: Any, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        """Greedy evaluation on held-out problems or groups (empty: there are none); ``answered`` is given the
        number answered so far as batches of answers come in."""

    @property
    @abstractmethod
    def held_out_size(self) -> int:
        """Problems (or groups) ``held_out`` evaluates."""

    @abstractmethod
    def probe(self) -> list[int]:
        """Tokens whose logprobs the loop compares between sampler and trainer."""

    def step_metrics(self, step: int) -> dict[str, float]:
        """Numbers about what ``step`` trains on (the curriculum stage); none by default."""
        return {}

    def close(self) -> None:  # noqa: B027  nothing to release unless a subclass holds threads
        """Release what ``start`` holds (threads)."""


def _stage_start(curriculum: dict[int, float], step: int) -> int:
    """The step at which the curriculum stage that ``step`` falls in starts (a key of ``curriculum``)."""
    return max(s for s in curriculum if s <= step)


def _part_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each of ``parts`` consecutive, near-equal parts of ``count`` items (a streamed step's)."""
    return list(itertools.pairwise([i * count // parts for i in range(parts + 1)]))


# -- problem sources ----------------------------------------------------------------------------------------------


def curriculum_problems(problems: list[Problem], curriculum: dict[int, float], step: int) -> list[Problem]:
    """The training problems of ``step``: those no harder than the curriculum stage it falls in (all without one)."""
    if not curriculum:
        return problems
    max_difficulty = curriculum[_stage_start(curriculum, step)]
    chosen = select(problems, max_difficulty=max_difficulty)
    if not chosen:
        known = sorted({p.difficulty for p in problems if p.difficulty is not None})
        raise ConfigurationError(f"curriculum: no training problem has difficulty <= {max_difficulty} (stage of "
                                 f"step {step}); the source's difficulties are {known or 'not set'}")
    return chosen


def evaluate_problems(sampling_client: Any, tokenizer: Any, source: ProblemSource, problems: list[Problem],
                      runner: RewardRunner, max_tokens: int, answered: Callable[[int], None] | None = None
                      ) -> dict[str, float]:
    """Greedy held-out evaluation: ``test/reward/mean`` and ``test/correct`` (reward >= 1); ``answered`` is given
    the problems answered so far whenever a batch of answers is in."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = sample_together(sampling_client, [(types.ModelInput.from_ints(source.render_ids(p, tokenizer)), 1, params)
                                                 for p in problems])
    responses = []
    for i, future in enumerate(futures):  # in order; the engine answers them in batches, shown when a batch is in
        responses.append(tokenizer.decode(future.result().sequences[0].tokens, skip_special_tokens=True))
        if answered is not None and (i + 1 == len(futures) or not future_done(futures[i + 1])):
            answered(i + 1)
    scores = runner.score([RewardItem(p.question, r, p.reward_meta()) for p, r in zip(problems, responses,
                                                                                      strict=True)])
    values = [s for s in scores.scores if s is not None]
    return {**scores.metrics("test/reward"), "test/correct": sum(v >= 1.0 for v in values) / max(len(values), 1)}


def future_done(future: Any) -> bool:
    """Whether a sampling future has its answer (or its error) already."""
    try:
        future.result(timeout=0)
    except TimeoutError:
        return False
    except Exception:  # its error is raised where the caller takes its result
        return True
    return True


@dataclass
class _PendingProblems:
    problems: list[Problem]
    prompts: list[list[int]]
    futures: list[Any]


class ProblemRollouts(Rollouts):
    """``problems_per_step`` problems of a source per step, ``group_size`` answers each, scored by ``runner``."""

    def __init__(self, source: ProblemSource, runner: RewardRunner, tokenizer: Any, config: LoopConfig) -> None:
        self.source, self.runner, self.tokenizer, self.config = source, runner, tokenizer, config
        self.train_problems = source.problems("train", shuffle=True, seed=config.seed)
        self.test_problems = source.problems(source.eval_split(), limit=config.eval_problems)
        for stage in config.curriculum:  # an empty stage is a config error now, not at its step
            curriculum_problems(self.train_problems, config.curriculum, stage)

    def start(self, step: int, sampler: Any, params: types.SamplingParams, parts: int = 1) -> list[Any]:
        pool = curriculum_problems(self.train_problems, self.config.curriculum, step)
        first = step * self.config.problems_per_step
        problems = [pool[(first + i) % len(pool)] for i in range(self.config.problems_per_step)]
        prompts = [self.source.render_ids(p, self.tokenizer) for p in problems]
        futures = sample_together(sampler, [(types.ModelInput.from_ints(p), self.config.group_size, params)
                                            for p in prompts])  # one unit: the parts decode as one batch
        return [_PendingProblems(problems[a:b], prompts[a:b], futures[a:b])
                for a, b in _part_bounds(len(problems), parts)]

    def collect(self, pending: _PendingProblems) -> Rollout:
        groups = [f.result().sequences for f in pending.futures]
        t_reward = time.time()
        items = [RewardItem(p.question, self.tokenizer.decode(s.tokens, skip_special_tokens=True), p.reward_meta())
                 for p, seqs in zip(pending.problems, groups, strict=True) for s in seqs]
        scores = self.runner.score(items)
        G = len(groups[0])
        trajectories = [[Trajectory([Transition(prompt, list(s.tokens), list(s.logprobs),
                                                _reward(scores.scores[g * G + i]))])
                         for i, s in enumerate(seqs)]
                        for g, (prompt, seqs) in enumerate(zip(pending.prompts, groups, strict=True))]
        failures: dict[int, list[str]] = {}
        for failure in scores.failures:
            failures.setdefault(failure.index, []).append(f"{failure.reward} {failure.kind}: {failure.message}")
        prompt_texts = [self.tokenizer.decode(p) for p in pending.prompts]
        records = [{"problem_id": pending.problems[i // G].id, "prompt": prompt_texts[i // G],
                    "response": item.response, "reward": scores.scores[i],
                    "parts": {name: values[i] for name, values in scores.parts.items()},
                    "failure": "; ".join(failures[i]) if i in failures else None}
                   for i, item in enumerate(items)]
        rewards = [scores.scores[g * G:(g + 1) * G] for g in range(len(groups))]
        sampled = sum(len(s.tokens) for seqs in groups for s in seqs)
        return Rollout(trajectories, rewards, records, sampled, time.time() - t_reward, scores)

    def metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        scores = BatchScores.concat([r.scores for r in rollouts])
        metrics = scores.metrics("env/all/reward")
        scored = [v for v in scores.scores if v is not None]
        for part in ("correct", "format"):  # the parts of format_correct, or: solved = full reward
            values = [v for v in scores.parts.get(part, []) if v is not None]
            if values:
                metrics[f"env/all/{part}"] = sum(values) / len(values)
        metrics.setdefault("env/all/correct", sum(v >= 1.0 for v in scored) / max(len(scored), 1))
        metrics["env/all/ac_tokens_per_turn"] = sum(r.sampled_tokens for r in rollouts) / len(scores.scores)
        return metrics

    def held_out(self, sampler: Any, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        return evaluate_problems(sampler, self.tokenizer, self.source, self.test_problems, self.runner,
                                 self.config.max_tokens, answered)

    @property
    def held_out_size(self) -> int:
        return len(self.test_problems)

    def probe(self) -> list[int]:
        return self.source.render_ids(self.train_problems[0], self.tokenizer)[:16]

    def step_metrics(self, step: int) -> dict[str, float]:
        if not self.config.curriculum:
            return {}
        pool = curriculum_problems(self.train_problems, self.config.curriculum, step)
        return {"curriculum/max_difficulty": max(p.difficulty for p in pool)}


def _reward(score: float | None) -> float:
    """A trajectory's reward: the score, or NaN where scoring failed (never a silent 0; such groups are not trained
    on, and the failure is counted in ``env/all/reward/errors:sum`` and ``by_group/frac_failed``)."""
    return math.nan if score is None else score


# -- env datasets -------------------------------------------------------------------------------------------------


class EnvRollouts(Rollouts):
    """A batch of an env dataset per step (of its curriculum stage's dataset, with a curriculum), played in a thread:
    batches in step order and, when streaming, a batch's parts one after another (part k+1 plays while the loop
    trains on part k); the envs score themselves."""

    def __init__(self, dataset: RLDataset, tokenizer: Any, config: LoopConfig) -> None:
        check_env_dataset(config, dataset)
        dataset.bind_tokenizer(tokenizer)
        self.dataset, self.tokenizer, self.config = dataset, tokenizer, config
        # every stage made now, so a dataset that cannot narrow (or a stage with no batch) is refused before any work
        self.stages = {step: dataset.stage(bound) for step, bound in sorted(config.curriculum.items())}
        for step, stage in self.stages.items():
            if len(stage) < 1:
                raise ConfigurationError(f"curriculum: {type(dataset).__name__}.stage({config.curriculum[step]}) "
                                         f"(from step {step}) has no batches: no group is that easy; raise the "
                                         "stage's max_difficulty")
        self.test_groups = list(dataset.test_groups())
        self._threads = ThreadPoolExecutor(1, thread_name_prefix="rlvr-env-rollouts")

    def _dataset_at(self, step: int) -> RLDataset:
        """The dataset ``step`` draws its batch from: the curriculum stage it falls in, or the whole dataset."""
        if not self.stages:
            return self.dataset
        return self.stages[_stage_start(self.config.curriculum, step)]

    def start(self, step: int, sampler: Any, params: types.SamplingParams, parts: int = 1) -> list[Future]:
        dataset = self._dataset_at(step)
        builders = list(dataset.get_batch(step % len(dataset)))
        if parts > len(builders):
            raise ConfigurationError(f"stream_minibatches={parts}, but a batch of {type(dataset).__name__} holds "
                                     f"{len(builders)} groups: stream at most {len(builders)} parts")
        return [self._threads.submit(self._play, dataset, builders[a:b], a, sampler, params, seed)
                for (a, b), seed in zip(_part_bounds(len(builders), parts), _part_seeds(params.seed, parts),
                                        strict=True)]

    def collect(self, pending: Future) -> Rollout:
        return pending.result()

    def _play(self, dataset: RLDataset, builders: list[Any], first: int, sampler: Any, params: types.SamplingParams,
              seed: int | None) -> Rollout:
        """Every env of some of the step's groups (the batch's from position ``first``) played to the end (or
        ``max_turns``); rewards are the envs' own."""
        timing: dict[str, float] = {}
        max_turns = self.config.max_turns
        groups = dataset.rollout(sampler, builders, params, max_turns, seed, timing)
        trajectories = [g.trajectories for g in groups]
        rewards: list[list[float | None]] = [list(g.total_rewards()) for g in groups]
        sampled = sum(len(t.action) for group in trajectories for trajectory in group for t in trajectory.transitions)
        records = [{"problem_id": f"{type(builder).__name__}[{first + b}]", "response": self._conversation(t),
                    "prompt": self.tokenizer.decode(t.transitions[0].observation), "reward": r, "parts": {},
                    "failure": t.failure or (None if t.finished else f"cut at max_turns={max_turns}")}
                   for b, (builder, group, rewards_G) in enumerate(zip(builders, groups, rewards, strict=True))
                   for t, r in zip(group.trajectories, rewards_G, strict=True)]
        return Rollout(trajectories, rewards, records, sampled, timing["env"])

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
        """``env/all/...`` over every part of the step: rewards, turns, tokens, and the envs' own numbers."""
        trajectories = [t for r in rollouts for group in r.trajectories for t in group]
        flat = [x for r in rollouts for rewards_G in r.rewards for x in rewards_G]
        scored = [x for x in flat if x is not None and not math.isnan(x)]  # NaN: the env's scorer failed
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

    def step_metrics(self, step: int) -> dict[str, float]:
        if not self.stages:
            return {}
        return {"curriculum/max_difficulty": self.config.curriculum[_stage_start(self.config.curriculum, step)]}

    def held_out(self, sampler: Any, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        if not self.test_groups:
            return {}
        result = evaluate_envs(sampler, self.test_groups, self.config.max_tokens, self.config.max_turns)
        if answered is not None:  # the groups are played together: all answered at once
            answered(len(self.test_groups))
        return result

    @property
    def held_out_size(self) -> int:
        return len(self.test_groups)

    def probe(self) -> list[int]:
        return list(self.dataset.get_batch(0)[0].make_envs()[0].initial_observation())[:16]

    def close(self) -> None:
        self._threads.shutdown()


def _part_seeds(seed: int | None, parts: int) -> list[int | None]:
    """A seed per part of a step's batch: the step's own for the first (so an unstreamed batch samples as it always
    has), and for the others seeds drawn from it, so parts whose envs open alike still sample independently."""
    if seed is None:
        return [None] * parts
    return [seed] + [random.Random(f"{seed}:part{k}").randrange(2**31) for k in range(1, parts)]  # str seeds are stable


def check_source(config: LoopConfig, source: ProblemSource | RLDataset) -> None:
    """What the loop cannot do with ``source``, refused before any work."""
    if isinstance(source, RLDataset):
        check_env_dataset(config, source)
    elif config.stream_minibatches > config.problems_per_step:
        raise ConfigurationError(f"stream_minibatches={config.stream_minibatches}: at most problems_per_step="
                                 f"{config.problems_per_step} (a part holds at least one problem's group)")


def check_env_dataset(config: LoopConfig, dataset: RLDataset) -> None:
    """What the loop cannot do with an env dataset, refused before any work."""
    if len(dataset) < 1:
        raise ConfigurationError(f"{type(dataset).__name__} has no batches; an env dataset needs at least one")
