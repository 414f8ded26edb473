"""A problem source as the loop's env dataset: its batches wrap around the pool, its stages keep a pool smaller than
a batch, and its answers are scored in the reward runner, whose failures and timeouts reach the records and metrics."""

import math
import time

import pytest

from rlvr import types
from rlvr.errors import ConfigurationError
from rlvr.rewards import RewardRunner
from rlvr.rl import LoopConfig
from rlvr.rl.problems import SourceDataset
from rlvr.rl.rollouts import Rollouts
from rlvr.tasks.base import Problem, ProblemSource


def lowercase_or_hang(prompt, response, meta=None) -> float:
    """The share of lowercase letters; hangs on problem 0 (killed at the runner's timeout), raises on problem 1."""
    if prompt.endswith(" 0."):
        time.sleep(60)
    if prompt.endswith(" 1."):
        raise ValueError("cannot score problem 1")
    return sum("a" <= c <= "z" for c in response) / max(len(response), 1)


class Five(ProblemSource):
    """Five problems; difficulty 1 for problem 4, 2 for the others."""

    name = "five"

    def __init__(self) -> None:
        super().__init__(reward=lowercase_or_hang)

    def splits(self):
        return ("train", "test")

    def load(self, split):
        return [Problem(id=f"five/{i}", question=f"Say {i}.", answer="a", difficulty=1.0 if i == 4 else 2.0)
                for i in range(5)]


def loop_config(**overrides) -> LoopConfig:
    values = dict(base_model="tiny", rank=4, problems_per_step=2, group_size=3, max_tokens=4, eval_problems=2,
                  seed=3, reward_timeout=1.0)
    values.update(overrides)
    return LoopConfig(**values)


def ids(batch) -> list[str]:
    return [builder.problem.id for builder in batch]


def test_a_step_takes_the_next_problems_wrapping_around_the_pool():
    dataset = SourceDataset(Five(), loop_config())
    pool = [p.id for p in dataset.problems]  # the shuffled split
    assert sorted(pool) == [f"five/{i}" for i in range(5)]
    for step in range(7):  # 2 problems a step from position 2 * step, wrapping: not get_batch(step % len)
        assert ids(dataset.batch_at(step)) == [pool[(2 * step) % 5], pool[(2 * step + 1) % 5]], step
    assert len(dataset) == 3 and ids(dataset.get_batch(2)) == [pool[4], pool[0]]
    with pytest.raises(IndexError):
        dataset.get_batch(3)
    assert all(builder.group_size == 3 for builder in dataset.batch_at(0))
    assert [p.id for p in dataset.held_out] == [p.id for p in Five().problems("test", limit=2)]


def test_a_stage_smaller_than_a_batch_repeats_its_problems_and_an_empty_one_is_refused():
    stage = SourceDataset(Five(), loop_config()).stage(1)
    assert ids(stage.batch_at(0)) == ids(stage.batch_at(5)) == ["five/4", "five/4"]
    assert stage.hardest(1.5) == 1.0  # logged as the stage's hardest problem, not its bound
    with pytest.raises(ConfigurationError, match=r"difficulty <= 0.5; the source's difficulties are \[1.0, 2.0\]"):
        SourceDataset(Five(), loop_config()).stage(0.5)


def test_an_empty_training_split_is_refused():
    class NoTrain(Five):
        def load(self, split):
            return [] if split == "train" else super().load(split)

    with pytest.raises(ConfigurationError, match="NoTrain has no training problems"):
        SourceDataset(NoTrain(), loop_config())


def test_answers_are_scored_in_the_runner_and_its_failures_reach_records_and_metrics(service):
    config = loop_config(problems_per_step=5)
    client = service.create_lora_training_client(base_model="tiny", rank=4, seed=5)
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=7)
    with RewardRunner(Five().reward(), timeout=config.reward_timeout) as runner:
        rollouts = Rollouts(SourceDataset(Five(), config), client.get_tokenizer(), config, runner)
        try:
            parts = rollouts.start(0, client.save_weights_and_get_sampling_client(), params, parts=2)
            rollout = [rollouts.collect(part) for part in parts]
        finally:
            rollouts.close()
    assert [len(r.trajectories) for r in rollout] == [2, 3]  # the five groups in two parts
    records = [record for r in rollout for record in r.records]
    by_problem = {}
    for record in records:
        by_problem.setdefault(record["problem_id"], []).append(record)
    assert sorted(by_problem) == [f"five/{i}" for i in range(5)] and all(len(v) == 3 for v in by_problem.values())
    assert all(r["reward"] is None and "timeout" in r["failure"] for r in by_problem["five/0"])
    assert all(r["reward"] is None and "cannot score problem 1" in r["failure"] for r in by_problem["five/1"])
    assert all(r["failure"] is None and 0.0 <= r["reward"] <= 1.0 for i in (2, 3, 4) for r in by_problem[f"five/{i}"])
    # the trajectories carry NaN where the score failed, the score elsewhere
    for r in rollout:
        for trajectories, rewards in zip(r.trajectories, r.rewards, strict=True):
            for trajectory, reward in zip(trajectories, rewards, strict=True):
                assert math.isnan(trajectory.reward) if reward is None else trajectory.reward == reward
    metrics = rollouts.metrics(rollout)
    assert metrics["env/all/reward/timeouts:sum"] == 3 and metrics["env/all/reward/errors:sum"] == 3
    assert metrics["env/all/reward/scored:sum"] == 9
    scored = [r["reward"] for r in records if r["reward"] is not None]
    assert metrics["env/all/reward/mean"] == pytest.approx(sum(scored) / 9)


def prompt_and_response(prompt, response, meta=None) -> float:
    """A reward that reads its prompt: the length of the prompt, plus the response's length in thousandths."""
    return len(prompt) + len(response) / 1000


class Instructed(Five):
    """Five's problems with an instruction, so the rendered user message differs from the question."""

    def __init__(self) -> None:
        ProblemSource.__init__(self, reward=prompt_and_response, instruction="Answer in one word.")


def test_a_problem_is_scored_on_the_same_item_in_process_and_in_the_runner(service):
    # ScoredByRunner has the runner execute the scoring that ProblemEnv.step runs in process: one definition
    # (envs.problem_item), so each sampled answer gets the same reward on both paths, and by ProblemSource.score.
    from rlvr.rl.envs import ProblemEnv

    config = loop_config(problems_per_step=5)
    client = service.create_lora_training_client(base_model="tiny", rank=4, seed=5)
    tokenizer = client.get_tokenizer()
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=7)
    with RewardRunner(Instructed().reward(), timeout=5.0) as runner:
        rollouts = Rollouts(SourceDataset(Instructed(), config), tokenizer, config, runner)
        try:
            [part] = rollouts.start(0, client.save_weights_and_get_sampling_client(), params)
            rollout = rollouts.collect(part)
        finally:
            rollouts.close()
    checked = 0
    for builder, trajectories, rewards_G in zip(part.builders, rollout.trajectories, rollout.rewards, strict=True):
        for trajectory, reward in zip(trajectories, rewards_G, strict=True):
            [turn] = trajectory.transitions
            in_process = ProblemEnv(builder.source, builder.problem, tokenizer).step(turn.action).reward
            by_hand = builder.source.score(builder.problem, trajectory.logs["response"])  # ProblemSource.score
            assert in_process == reward == by_hand == len(builder.problem.question) + len(
                trajectory.logs["response"]) / 1000
            checked += 1
    assert checked == 15
