"""Envs: multi-turn rollouts on tiny, trajectories as datums (checked by hand and against the trainer), and
learning through the env API."""

import json

import pytest
import torch

from rlvr import types
from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ConfigurationError, ContextFullError, RewardError
from rlvr.rl import LoopConfig, train
from rlvr.rl.advantages import group_advantages
from rlvr.rl.datums import rl_datum
from rlvr.rl.envs import (
    Env,
    EnvGroupBuilder,
    ProblemDataset,
    RLDataset,
    StepResult,
    Trajectory,
    Transition,
    TurnByTurn,
    rollout_groups,
    trajectory_datums,
)
from rlvr.tasks.base import Problem, ProblemSource


def inputs(datum):
    return {k: v.tolist() for k, v in datum.loss_fn_inputs.items()}


def test_one_turn_trajectory_is_the_loops_datum():
    trajectory = Trajectory([Transition([5, 6, 7], [8, 9], [-0.5, -0.25], reward=1.0)])
    [(datum, mask)] = trajectory_datums(trajectory, advantage=0.75)
    expected, expected_mask = rl_datum([5, 6, 7], [8, 9], [-0.5, -0.25], 0.75)
    assert datum.model_input.to_ints() == expected.model_input.to_ints() == [5, 6, 7, 8]
    assert inputs(datum) == inputs(expected)
    assert mask == expected_mask == [0.0, 0.0, 1.0, 1.0]


def test_a_growing_conversation_is_one_datum_with_only_actions_trained():
    first = Transition([1, 2], [3, 4], [-0.5, -0.25], reward=0.0)  # logprobs exact in float32
    second = Transition([1, 2, 3, 4, 50, 51], [6], [-0.125], reward=1.0)  # env reply 50, 51 then the next action
    [(datum, mask)] = trajectory_datums(Trajectory([first, second]), advantage=2.0)
    # full sequence 1 2 3 4 50 51 6; targets are tokens 2..: 2 3 4 50 51 6
    assert datum.model_input.to_ints() == [1, 2, 3, 4, 50, 51]
    assert inputs(datum) == {"target_tokens": [2, 3, 4, 50, 51, 6],
                             "logprobs": [0.0, -0.5, -0.25, 0.0, 0.0, -0.125],
                             "advantages": [0.0, 2.0, 2.0, 0.0, 0.0, 2.0]}
    assert mask == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_an_observation_that_does_not_extend_the_conversation_starts_a_new_datum():
    first = Transition([1, 2], [3], [-0.1], reward=0.0)
    second = Transition([9, 8], [7], [-0.2], reward=1.0)  # e.g. a summarised context
    datums = trajectory_datums(Trajectory([first, second]), advantage=1.0)
    assert [d.model_input.to_ints() for d, _ in datums] == [[1, 2], [9, 8]]
    assert [m for _, m in datums] == [[0.0, 1.0], [0.0, 1.0]]


def test_entropy_bonus_spans_the_episode_across_turns_and_datums():
    # Actions 3, 4 | 6 in one datum, then 7 in a second: logprobs -0.5, -0.25, -0.125, -1.0 (episode order).
    # coef 0.5, A = 1: suffix sums -1.875, -1.375, -1.125, -1.0 -> advantages 1.9375, 1.6875, 1.5625, 1.5.
    first = Transition([1, 2], [3, 4], [-0.5, -0.25], reward=0.0)
    second = Transition([1, 2, 3, 4, 50], [6], [-0.125], reward=0.0)
    third = Transition([9, 8], [7], [-1.0], reward=1.0)
    datums = trajectory_datums(Trajectory([first, second, third]), advantage=1.0, entropy_coef=0.5)
    assert [inputs(d)["advantages"] for d, _ in datums] == [[0.0, 1.9375, 1.6875, 0.0, 1.5625], [0.0, 1.5]]


def lowercase_share(text: str) -> float:
    return sum("a" <= c <= "z" for c in text) / max(len(text), 1)


class Refine(Env):
    """Two turns: the env replies "again:" to the first answer; each answer earns half its share of lowercase letters
    (learnable by the random tiny model: every trained token bears on the reward)."""

    def __init__(self, tokenizer, prompt: str) -> None:
        self.tokenizer, self.prompt, self.turn = tokenizer, prompt, 0

    def initial_observation(self):
        return self.tokenizer.encode(self.prompt)

    def step(self, action):
        self.turn += 1
        reward = lowercase_share(self.tokenizer.decode(action, skip_special_tokens=True)) / 2
        if self.turn == 1:
            self.seen = self.initial_observation() + action + self.tokenizer.encode(" again:")
            return StepResult(reward=reward, done=False, next_observation=self.seen, metrics={"turn1": 1.0})
        return StepResult(reward=reward, done=True)


class RefineGroup(EnvGroupBuilder):
    def __init__(self, tokenizer, prompt: str, size: int, bonus: bool = False) -> None:
        self.tokenizer, self.prompt, self.size, self.bonus = tokenizer, prompt, size, bonus

    def make_envs(self):
        return [Refine(self.tokenizer, self.prompt) for _ in range(self.size)]

    def group_rewards(self, trajectories):
        if not self.bonus:
            return super().group_rewards(trajectories)
        best = max(range(len(trajectories)), key=lambda i: trajectories[i].reward)
        return [1.0 if i == best else 0.0 for i in range(len(trajectories))]


PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0)


def test_rollout_plays_every_turn_and_the_merged_datum_matches_the_trainer(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=3)
    tokenizer = tc.get_tokenizer()
    sampler = tc.save_weights_and_get_sampling_client()
    [group] = rollout_groups(sampler, [RefineGroup(tokenizer, "Q1:", 4, bonus=True)], PARAMS, seed=0)
    assert len(group.trajectories) == 4 and all(t.finished for t in group.trajectories)
    for trajectory in group.trajectories:
        first, second = trajectory.transitions
        assert second.observation == first.observation + first.action + tokenizer.encode(" again:")
        assert first.metrics == {"turn1": 1.0}
    assert len({tuple(t.transitions[0].action) for t in group.trajectories}) > 1  # each request its own seed
    assert sorted(group.group_rewards) == [0.0, 0.0, 0.0, 1.0]
    assert group.total_rewards() == [t.reward + g for t, g in zip(group.trajectories, group.group_rewards,
                                                                    strict=True)]
    # Both turns' sampled tokens, in one datum, have the trainer's logprobs: merging put them in the right places.
    (datum, mask), = trajectory_datums(group.trajectories[0], advantage=0.0)
    trained = tc.forward([datum], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].tolist()
    sampled = datum.loss_fn_inputs["logprobs"].tolist()
    gaps = [abs(a - b) for a, b, m in zip(trained, sampled, mask, strict=True) if m]
    assert len(gaps) == sum(len(t.action) for t in group.trajectories[0].transitions)
    assert max(gaps) < 1e-4


@pytest.mark.slow
def test_learning_through_the_env_api(service):
    """The five steps on envs: roll out groups, centre the episode rewards, datums, forward_backward, optim_step."""
    tc = service.create_lora_training_client(base_model="tiny", rank=8, seed=1)
    tokenizer = tc.get_tokenizer()
    rewards = []
    for step in range(14):
        sampler = tc.save_weights_and_get_sampling_client()
        groups = rollout_groups(sampler, [RefineGroup(tokenizer, f"Q{i}:", 4) for i in range(2)], PARAMS, seed=step)
        data = []
        for group in groups:
            for trajectory, advantage in zip(group.trajectories, group_advantages(group.total_rewards()),
                                             strict=True):
                data += [d for d, _ in trajectory_datums(trajectory, advantage)]
        rewards.append(sum(r for g in groups for r in g.total_rewards()) / 8)
        tc.forward_backward(data, "importance_sampling")
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards


def test_turn_limit_and_bad_envs_are_reported(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=4)
    tokenizer = tc.get_tokenizer()
    sampler = tc.save_weights_and_get_sampling_client()
    [group] = rollout_groups(sampler, [RefineGroup(tokenizer, "Q:", 2)], PARAMS, max_turns=1, seed=0)
    assert [len(t.transitions) for t in group.trajectories] == [1, 1]
    assert not any(t.finished for t in group.trajectories)

    class Silent(Refine):
        def step(self, action):
            return StepResult(reward=0.0, done=False)

    class SilentGroup(RefineGroup):
        def make_envs(self):
            return [Silent(self.tokenizer, self.prompt)]

    with pytest.raises(ConfigurationError, match="empty next_observation"):
        rollout_groups(sampler, [SilentGroup(tokenizer, "Q:", 1)], PARAMS)

    class Broken(Refine):
        def step(self, action):
            raise KeyError("tests")

    class BrokenGroup(RefineGroup):
        def make_envs(self):
            return [Broken(self.tokenizer, self.prompt)]

    with pytest.raises(RewardError, match=r"Broken.step raised at turn 1 of env 0 in group 0: KeyError"):
        rollout_groups(sampler, [BrokenGroup(tokenizer, "Q:", 1)], PARAMS)

    class Lopsided(RefineGroup):
        def group_rewards(self, trajectories):
            return [1.0]

    with pytest.raises(ConfigurationError, match="1 rewards for 2 trajectories"):
        rollout_groups(sampler, [Lopsided(tokenizer, "Q:", 2)], PARAMS)


class Chatty(Refine):
    """Replies with 600 filler tokens each turn until turn 5: the conversation outgrows tiny's 1024-token context
    before the game ends."""

    def step(self, action):
        self.turn += 1
        self.seen = getattr(self, "seen", self.initial_observation()) + action + [5] * 600
        return StepResult(reward=0.1, done=self.turn == 5, next_observation=self.seen)


class ChattyGroup(RefineGroup):
    def make_envs(self):
        return [Chatty(self.tokenizer, self.prompt) for _ in range(self.size)]


def test_a_conversation_that_fills_the_context_ends_its_episode_not_the_run(service):
    """Nothing a model or an env writes may end a run: the turn whose prompt no longer fits is not played, the
    episode ends unfinished with the turns it had, and the other groups play on. A first observation that alone
    fills the context is a setting to fix: an error naming it."""
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=4)
    tokenizer = tc.get_tokenizer()
    sampler = tc.save_weights_and_get_sampling_client()
    long, short = rollout_groups(sampler, [ChattyGroup(tokenizer, "Q:", 2), RefineGroup(tokenizer, "Q:", 2)],
                                 PARAMS, max_turns=8, seed=0)
    assert [len(t.transitions) for t in long.trajectories] == [2, 2]  # turn 3's prompt: 1200+ tokens
    assert not any(t.finished for t in long.trajectories) and long.total_rewards() == [0.2, 0.2]
    assert all(t.finished and len(t.transitions) == 2 for t in short.trajectories)
    with pytest.raises(ContextFullError, match="fills the model's context of 1024"):
        rollout_groups(sampler, [RefineGroup(tokenizer, "Q" * 1100, 1)], PARAMS)


class Echo(ProblemSource):
    name = "echo"

    def splits(self):
        return ("train", "test")

    def load(self, split):
        return [Problem(id=f"echo/{i}", question=f"Say {i}.", answer=str(i)) for i in range(5)]


def test_problem_sources_plug_in_as_one_turn_envs(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=5)
    dataset = ProblemDataset(Echo(), tc.get_tokenizer(), problems_per_batch=2, group_size=3)
    assert len(dataset) == 2
    with pytest.raises(IndexError):
        dataset.get_batch(2)
    groups = rollout_groups(tc.save_weights_and_get_sampling_client(), dataset.get_batch(0), PARAMS, seed=0)
    assert [len(g.trajectories) for g in groups] == [3, 3]
    assert all(len(t.transitions) == 1 and t.finished for g in groups for t in g.trajectories)
    assert dataset.test_groups() == []  # no test_split: nothing held out
    held_out = ProblemDataset(Echo(), tc.get_tokenizer(), 2, 3, test_split="test", test_problems=4).test_groups()
    assert [len(b.make_envs()) for b in held_out] == [1, 1, 1, 1]


# -- the loop on an env dataset ---------------------------------------------------------------------------------------

class RefineDataset(RLDataset):
    """Batches of two groups of the two-turn env, prompts by batch index."""

    def __init__(self, tokenizer, batches: int = 50) -> None:
        self.tokenizer, self.batches = tokenizer, batches

    def __len__(self):
        return self.batches

    def get_batch(self, index):
        return [RefineGroup(self.tokenizer, f"Q{index}.{g}:", 4) for g in range(2)]


def loop_config(path, **overrides):
    values = dict(base_model="tiny", rank=8, steps=14, group_size=4, max_tokens=6, max_turns=2, learning_rate=2e-2,
                  out=str(path / "run"), seed=1)
    values.update(overrides)
    return LoopConfig(**values)


def loop_metrics(path):
    return [json.loads(line) for line in (path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_loop_trains_on_an_env_dataset(tmp_path):
    tokenizer = build_tiny_tokenizer()
    result = train(loop_config(tmp_path), RefineDataset(tokenizer))
    assert "before" not in result and "after" not in result  # envs bring no held-out split
    metrics = loop_metrics(tmp_path)
    rewards = [m["env/all/reward/mean"] for m in metrics]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    first = metrics[0]
    assert first["env/all/turns"] == 2 and first["env/all/turn1"] == 1.0 and first["env/all/unfinished"] == 0
    assert abs(first["optim/kl_sample_train_v1"]) < 1e-3  # merged two-turn datums carry the trainer's logprobs
    assert first["time/reward"] >= 0 and first["tokens_per_s"] > 0
    [record, *_] = [json.loads(x) for x in (tmp_path / "run" / "rollouts" / "step-000001.jsonl").read_text().split(
        "\n") if x]
    assert " again:" in record["response"] and record["advantage"] is not None


@pytest.mark.slow
def test_an_env_run_resumes_like_an_uninterrupted_one(tmp_path):
    tokenizer = build_tiny_tokenizer()
    straight = train(loop_config(tmp_path / "a", steps=4), RefineDataset(tokenizer))
    train(loop_config(tmp_path / "b", steps=2, save_every=2), RefineDataset(tokenizer))
    resumed = train(loop_config(tmp_path / "b", steps=4, resume=True), RefineDataset(tokenizer))
    a, b = loop_metrics(tmp_path / "a"), loop_metrics(tmp_path / "b")
    for key in ("env/all/reward/mean", "optim/loss:sum"):
        assert [m.get(key) for m in a] == pytest.approx([m.get(key) for m in b], rel=1e-6)
    wa, wb = straight["training_client"].parameters(), resumed["training_client"].parameters()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_env_batches_play_off_policy_beside_training(tmp_path):
    # max_steps_off_policy=1: the next step's episodes play in a thread, with the previous step's weights, while
    # this step trains; every later batch is one update old (the sampler/trainer KL is no longer ~0).
    tokenizer = build_tiny_tokenizer()
    train(loop_config(tmp_path, steps=3, max_steps_off_policy=1), RefineDataset(tokenizer))
    metrics = loop_metrics(tmp_path)
    assert [m["async/steps_off_policy"] for m in metrics] == [0, 1, 1]
    assert abs(metrics[0]["optim/kl_sample_train_v1"]) < 1e-3
    assert abs(metrics[1]["optim/kl_sample_train_v1"]) > 1e-3
    assert all(m["env/all/turns"] == 2 for m in metrics)


class HeldOutRefine(RefineDataset):
    def test_groups(self):
        return [RefineGroup(self.tokenizer, f"T{i}:", 1) for i in range(3)]


def test_an_env_dataset_with_held_out_groups_is_evaluated(tmp_path):
    tokenizer = build_tiny_tokenizer()
    result = train(loop_config(tmp_path, steps=2, eval_every=1), HeldOutRefine(tokenizer))
    assert result["before"].keys() == result["after"].keys() == {"test/reward/mean", "test/correct", "test/turns",
                                                                  "test/clipped"}
    assert 0.0 <= result["before"]["test/clipped"] <= 1.0
    assert result["before"]["test/turns"] == 2  # greedy episodes of the two-turn env
    assert all("test/reward/mean" in m for m in loop_metrics(tmp_path))  # eval_every=1: every step


def test_what_the_loop_cannot_do_with_envs_is_refused_up_front(tmp_path):
    tokenizer = build_tiny_tokenizer()
    with pytest.raises(ConfigurationError, match="curriculum: RefineDataset does not grade its groups"):
        train(loop_config(tmp_path, curriculum={0: 1}), RefineDataset(tokenizer))
    with pytest.raises(ConfigurationError, match="no batches"):
        train(loop_config(tmp_path), RefineDataset(tokenizer, batches=0))
    with pytest.raises(ConfigurationError, match="stream_minibatches=3, but a batch of RefineDataset holds 2 groups"):
        train(loop_config(tmp_path, stream_minibatches=3), RefineDataset(tokenizer))
    with pytest.raises(ConfigurationError, match="max_turns"):
        loop_config(tmp_path, max_turns=0)


# -- curriculum and streaming on an env dataset ------------------------------------------------------------------------

class GradedDataset(RLDataset):
    """Batches of two groups of the two-turn env from a pool of graded prompts ("D<difficulty>#<position>:"); a
    curriculum stage keeps the prompts no harder than its bound."""

    def __init__(self, tokenizer, difficulties=(1, 2, 3) * 4) -> None:
        self.tokenizer, self.difficulties = tokenizer, list(difficulties)

    def __len__(self):
        return len(self.difficulties) // 2

    def get_batch(self, index):
        return [RefineGroup(self.tokenizer, f"D{self.difficulties[i]}#{i}:", 4) for i in (2 * index, 2 * index + 1)]

    def stage(self, max_difficulty):
        return GradedDataset(self.tokenizer, [d for d in self.difficulties if d <= max_difficulty])


def played_prompts(path, step):
    """The first observations the loop played at ``step``, from its rollout log."""
    lines = (path / "run" / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()
    return {json.loads(line)["prompt"] for line in lines if line}


def test_a_curriculum_narrows_an_env_dataset_stage_by_stage(tmp_path):
    tokenizer = build_tiny_tokenizer()
    train(loop_config(tmp_path, steps=4, curriculum={0: 1, 2: 2}), GradedDataset(tokenizer))
    assert [m["curriculum/max_difficulty"] for m in loop_metrics(tmp_path)] == [1, 1, 2, 2]
    stage_1 = played_prompts(tmp_path, 0) | played_prompts(tmp_path, 1)
    stage_2 = played_prompts(tmp_path, 2) | played_prompts(tmp_path, 3)
    assert stage_1 == {"D1#0:", "D1#1:", "D1#2:", "D1#3:"}  # the four difficulty-1 prompts, two batches of two
    assert stage_2 == {"D1#4:", "D2#5:", "D1#6:", "D2#7:"}  # batches 2 and 3 of the eight prompts of difficulty <= 2
    with pytest.raises(ConfigurationError, match="curriculum: GradedDataset"):  # a stage with no batch, up front
        train(loop_config(tmp_path / "none", curriculum={0: 0}), GradedDataset(tokenizer))


def test_a_problem_dataset_narrows_by_its_problems_difficulty(service):
    tokenizer = service.create_lora_training_client(base_model="tiny", rank=4, seed=5).get_tokenizer()

    class GradedEcho(Echo):
        def load(self, split):
            return [Problem(id=f"echo/{i}", question=f"Say {i}.", answer=str(i), difficulty=i % 3) for i in range(9)]

    dataset = ProblemDataset(GradedEcho(), tokenizer, problems_per_batch=2, group_size=3, seed=4)
    easy = dataset.stage(1)
    assert [p.id for p in easy.problems] == [p.id for p in dataset.problems if p.difficulty <= 1]  # order kept
    assert len(easy) == 3 and len(dataset) == 4
    assert {b.problem.difficulty for i in range(len(easy)) for b in easy.get_batch(i)} <= {0, 1}
    with pytest.raises(ConfigurationError, match="fewer than a batch of 4; the problems' difficulties are"):
        ProblemDataset(GradedEcho(), tokenizer, problems_per_batch=4, group_size=3).stage(0)


def test_an_env_batch_streams_in_parts_each_trained_as_it_comes(tmp_path, monkeypatch):
    # stream_minibatches=2: the batch's two groups play as two parts, one after the other, each trained on (its own
    # forward_backward) when it is in; the step's metrics and rollout log cover both.
    import rlvr.rl.loop as loop

    sent = []
    send = loop.send_minibatch
    monkeypatch.setattr(loop, "send_minibatch", lambda run, work, datums, masks: (
        sent.append((work.step, len(datums))), send(run, work, datums, masks))[1])
    tokenizer = build_tiny_tokenizer()
    train(loop_config(tmp_path, steps=2, stream_minibatches=2), RefineDataset(tokenizer))
    assert [step for step, n in sent] == [0, 0, 1, 1], sent
    assert all(n <= 4 for _, n in sent) and any(n > 0 for _, n in sent), sent  # a part: one group's four episodes
    metrics = loop_metrics(tmp_path)
    assert all(m["env/all/reward/scored:sum"] == 8 and m["env/all/turns"] == 2 for m in metrics)
    assert abs(metrics[0]["optim/kl_sample_train_v1"]) < 1e-3  # both parts sampled with the step's weights
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000001.jsonl").read_text()
               .splitlines() if line]
    assert {r["problem_id"] for r in records} == {"RefineGroup[0]", "RefineGroup[1]"}
    assert {r["prompt"] for r in records} == {"Q1.0:", "Q1.1:"}


def test_an_env_batch_streams_off_policy(tmp_path):
    tokenizer = build_tiny_tokenizer()
    train(loop_config(tmp_path, steps=3, stream_minibatches=2, max_steps_off_policy=1), RefineDataset(tokenizer))
    metrics = loop_metrics(tmp_path)
    assert [m["async/steps_off_policy"] for m in metrics] == [0, 1, 1]
    assert all(m["env/all/reward/scored:sum"] == 8 for m in metrics)


class CountedPlay(TurnByTurn):
    """Turn by turn, counting the parts the loop starts and the held-out groups it evaluates."""

    def __init__(self, counts) -> None:
        super().__init__()
        object.__setattr__(self, "counts", counts)

    def start(self, sampling_client, parts, params, context):
        self.counts["parts"] += len(parts)
        return super().start(sampling_client, parts, params, context)

    def evaluate(self, sampling_client, groups, max_tokens, context, answered=None):
        self.counts["evaluated"] += len(groups)
        return super().evaluate(sampling_client, groups, max_tokens, context, answered)


class CountedDataset(RefineDataset):
    """RefineDataset with two held-out groups, played by a CountedPlay."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.counts = {"parts": 0, "evaluated": 0}

    def test_groups(self):
        return [RefineGroup(self.tokenizer, f"T{g}:", 1) for g in range(2)]

    @property
    def play(self):
        return CountedPlay(self.counts)


def test_the_loop_plays_and_evaluates_a_dataset_only_through_its_play(tmp_path):
    dataset = CountedDataset(build_tiny_tokenizer())
    result = train(loop_config(tmp_path, steps=3, stream_minibatches=2, eval_every=2), dataset)
    assert dataset.counts == {"parts": 3 * 2, "evaluated": 2 * 3}  # before, after step 2, after training
    assert set(result["before"]) >= {"test/reward/mean", "test/correct", "test/turns"}
