"""A problem source as the training loop plays it: an env dataset of one-turn groups scored by the run's reward runner.

    dataset = SourceDataset(source, config)      # what rlvr.rl.train makes of a ProblemSource, at its door

``SourceDataset`` is ``envs.ProblemDataset`` (a problem is a one-turn env with its grader) batched as the loop needs
for problems, and played by ``ScoredByRunner``, its ``play``:

- a step's batch is ``problems_per_step`` problems from position ``step * problems_per_step`` of the shuffled split
  (or of its curriculum stage), wrapping around, so a pool smaller than a batch repeats problems;
- a step's requests go out as one unit, one per group with ``n = group_size`` and the step's seed, and each part
  (``stream_minibatches``) is scored when the loop collects it;
- the answers are scored in the run's reward runner (killable worker processes, or Ray's reward actors), on the
  same ``envs.problem_item`` as ``ProblemEnv.step`` scores in process: a reward that hangs or raises is counted, and
  its trajectory carries NaN and its failure, never a silent 0;
- the held-out evaluation is greedy, one answer per problem, scored by the same runner (``evaluate_problems``).

Not here: how the loop turns played groups into records, metrics and datums (``rollouts.py``, ``phases.py``); a
``ProblemDataset`` handed to the loop as it is, whose envs score themselves in this process.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tinker.lib.public_interfaces.api_future import APIFuture

from rlvr import types
from rlvr.errors import ConfigurationError
from rlvr.rewards.registry import Reward
from rlvr.rl.config import LoopConfig
from rlvr.rl.datums import sampled_logprobs
from rlvr.rl.envs import (
    EnvGroupBuilder,
    PendingPart,
    Play,
    PlayContext,
    PlayedGroups,
    ProblemDataset,
    ProblemGroupBuilder,
    RLDataset,
    Trajectory,
    TrajectoryGroup,
    Transition,
    batch_positions,
    problem_item,
    sample_together,
)
from rlvr.rl.protocols import RewardScorer, SamplingAPI
from rlvr.tasks.base import Problem, ProblemSource, select

__all__ = ["ScoredByRunner", "SourceDataset", "as_dataset", "curriculum_problems", "evaluate_problems"]


def as_dataset(source: ProblemSource | RLDataset, config: LoopConfig) -> RLDataset:
    """What the loop trains on: an env dataset as it is, a problem source as its ``SourceDataset``."""
    return source if isinstance(source, RLDataset) else SourceDataset(source, config)


class SourceDataset(ProblemDataset):
    """A problem source's training split as the loop's env dataset: ``config.problems_per_step`` one-turn groups of
    ``config.group_size`` per step, scored by the run's reward runner; ``config.eval_problems`` of the source's
    evaluation split held out."""

    def __init__(self, source: ProblemSource, config: LoopConfig) -> None:
        super().__init__(source, None, config.problems_per_step, config.group_size, seed=config.seed,
                         test_split=source.eval_split(), test_problems=config.eval_problems)
        if not self.problems:
            raise ConfigurationError(f"{type(source).__name__} has no training problems: its 'train' split is empty")

    def __len__(self) -> int:
        return -(-len(self.problems) // self.problems_per_batch)  # the last batch wraps around to the first problems

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        batch_positions(index, len(self), self.problems_per_batch)  # an IndexError past either end
        return self.batch_at(index)

    def batch_at(self, step: int) -> list[EnvGroupBuilder]:
        first = step * self.problems_per_batch
        return [self.group(self.problems[(first + i) % len(self.problems)], self.group_size)
                for i in range(self.problems_per_batch)]

    def stage(self, max_difficulty: float) -> SourceDataset:
        narrowed = copy.copy(self)
        narrowed.problems = _no_harder(self.problems, max_difficulty)  # in the shuffled order; a batch may wrap
        return narrowed

    @property
    def play(self) -> ScoredByRunner:
        return ScoredByRunner(self.source.reward())


@dataclass(frozen=True)
class ScoredByRunner(Play):
    """The ``Play`` of one-turn problem groups (``ProblemGroupBuilder``s) whose answers the run's reward runner
    scores with ``reward``: a step's requests go out as one unit, one per group with ``n = group_size`` and the
    step's seed, so every part decodes in one batch; each part is scored when the loop collects it. The held-out
    problems are answered greedily, one answer each, and scored by the same runner (``evaluate_problems``)."""

    reward: Reward

    def start(self, sampling_client: SamplingAPI, parts: Sequence[Sequence[EnvGroupBuilder]],
              params: types.SamplingParams, context: PlayContext) -> list[PendingPart]:
        runner = _runner(context)
        builders = [_problem_group(b) for part in parts for b in part]
        prompts = [b.source.render_ids(b.problem, b.tokenizer) for b in builders]
        futures = sample_together(sampling_client, [(types.ModelInput.from_ints(prompt), b.group_size, params)
                                                    for prompt, b in zip(prompts, builders, strict=True)])
        pending: list[PendingPart] = []
        first = 0  # one unit above: every part decodes in one batch, and each is scored when collected
        for part in parts:
            last = first + len(part)
            pending.append(_ScoredOnCollect(builders[first:last], prompts[first:last], futures[first:last], runner))
            first = last
        return pending

    def evaluate(self, sampling_client: SamplingAPI, groups: Sequence[EnvGroupBuilder], max_tokens: int,
                 context: PlayContext, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        builders = [_problem_group(b) for b in groups]
        return evaluate_problems(sampling_client, builders[0].tokenizer, builders[0].source,
                                 [b.problem for b in builders], _runner(context), max_tokens, answered)


def _runner(context: PlayContext) -> RewardScorer:
    if context.runner is None:
        raise ConfigurationError("SourceDataset scores through the run's reward runner, and none was given")
    return context.runner


def _problem_group(builder: EnvGroupBuilder) -> ProblemGroupBuilder:
    if not isinstance(builder, ProblemGroupBuilder):
        raise ConfigurationError(f"SourceDataset plays ProblemGroupBuilders, got {type(builder).__name__}")
    return builder


@dataclass
class _ScoredOnCollect:
    """A part's requests in flight; ``result()`` waits for its answers and scores them in the runner."""

    builders: list[ProblemGroupBuilder]
    prompts: list[list[int]]
    futures: Sequence[APIFuture[types.SampleResponse]]
    runner: RewardScorer

    def result(self) -> PlayedGroups:
        answers = [f.result().sequences for f in self.futures]
        started = time.time()
        items = [problem_item(b.problem, b.tokenizer.decode(s.tokens, skip_special_tokens=True))
                 for b, sequences in zip(self.builders, answers, strict=True) for s in sequences]
        scores = self.runner.score(items)
        failures: dict[int, list[str]] = {}
        for failure in scores.failures:
            failures.setdefault(failure.index, []).append(f"{failure.reward} {failure.kind}: {failure.message}")
        groups, i = [], 0
        for builder, prompt, sequences in zip(self.builders, self.prompts, answers, strict=True):
            trajectories = []
            for s in sequences:
                trajectories.append(Trajectory(
                    [Transition(prompt, list(s.tokens), sampled_logprobs(s), _reward(scores.scores[i]),
                                clipped=s.stop_reason == "length")],
                    failure="; ".join(failures[i]) if i in failures else None,
                    logs={"problem_id": builder.problem.id, "response": items[i].response,
                          "parts": {name: values[i] for name, values in scores.parts.items()}}))
                i += 1
            groups.append(TrajectoryGroup(trajectories, [0.0] * len(trajectories)))
        return PlayedGroups(groups, time.time() - started, scores)


def _reward(score: float | None) -> float:
    """A trajectory's reward: the score, or NaN where scoring failed (never a silent 0; such groups are not trained
    on, and the failure is counted in ``env/all/reward/errors:sum`` and ``by_group/frac_failed``)."""
    return math.nan if score is None else score


def curriculum_problems(problems: list[Problem], curriculum: dict[int, float], step: int) -> list[Problem]:
    """The training problems of ``step``: those no harder than the curriculum stage it falls in (all without one)."""
    if not curriculum:
        return problems
    return _no_harder(problems, curriculum[max(s for s in curriculum if s <= step)], f" (stage of step {step})")


def _no_harder(problems: list[Problem], max_difficulty: float, stage: str = "") -> list[Problem]:
    """The problems no harder than ``max_difficulty``, in order; none is a ConfigurationError naming the difficulties
    there are."""
    chosen = select(problems, max_difficulty=max_difficulty)
    if not chosen:
        known = sorted({p.difficulty for p in problems if p.difficulty is not None})
        raise ConfigurationError(f"curriculum: no training problem has difficulty <= {max_difficulty}{stage}; the "
                                 f"source's difficulties are {known or 'not set'}")
    return chosen


def evaluate_problems(sampling_client: SamplingAPI, tokenizer: Any, source: ProblemSource, problems: list[Problem],
                      runner: RewardScorer, max_tokens: int, answered: Callable[[int], None] | None = None
                      ) -> dict[str, float]:
    """Greedy held-out evaluation: ``test/reward/mean``, ``test/correct`` (reward >= 1) and ``test/clipped`` (the
    share of answers cut at ``max_tokens``); ``answered`` is given the problems answered so far whenever a batch of
    answers is in."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = sample_together(sampling_client, [(types.ModelInput.from_ints(source.render_ids(p, tokenizer)), 1, params)
                                                 for p in problems])
    responses, clipped = [], 0
    for i, future in enumerate(futures):  # in order; the engine answers them in batches, shown when a batch is in
        sequence = future.result().sequences[0]
        responses.append(tokenizer.decode(sequence.tokens, skip_special_tokens=True))
        clipped += sequence.stop_reason == "length"
        if answered is not None and (i + 1 == len(futures) or not future_done(futures[i + 1])):
            answered(i + 1)
    scores = runner.score([problem_item(p, r) for p, r in zip(problems, responses, strict=True)])
    values = [s for s in scores.scores if s is not None]
    return {**scores.metrics("test/reward"), "test/correct": sum(v >= 1.0 for v in values) / max(len(values), 1),
            "test/clipped": clipped / max(len(problems), 1)}


def future_done(future: Any) -> bool:
    """Whether a sampling future has its answer (or its error) already."""
    try:
        future.result(timeout=0)
    except TimeoutError:
        return False
    except Exception:  # its error is raised where the caller takes its result
        return True
    return True
