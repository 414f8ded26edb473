"""verifiers environments in rlvr's loop (integrations/verifiers_env.py): rollouts sampled through the in-process
OpenAI endpoint keep the sampled tokens and logprobs, the rubric's reward trains the tiny model and reaches
metrics.jsonl, multi-turn envs play their turns, tool envs call their tools (tiny's first turn scripted to call one)
and train only the model's tokens, and a reward function that raises or hangs is a counted failure, never a quiet 0."""

from __future__ import annotations

import itertools
import json
import sys
import time

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra: pip install 'rlvr[verifiers]'")
pytest.importorskip("fastapi", reason="the OpenAI endpoint the rollouts sample through: rlvr[server]")
vf = pytest.importorskip("verifiers")
from datasets import Dataset  # noqa: E402  (verifiers brings datasets)

from rlvr import types  # noqa: E402
from rlvr.engine.models.tiny import build_tiny_tokenizer  # noqa: E402
from rlvr.errors import ConfigurationError, RewardError, SamplingError  # noqa: E402
from rlvr.integrations.verifiers_env import VerifiersDataset, load_verifiers_env  # noqa: E402
from rlvr.rl import LoopConfig, train  # noqa: E402
from rlvr.rl.envs import trajectory_datums  # noqa: E402

PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, seed=0)
ROWS = [{"question": f"Say {w}.", "answer": w} for w in "abcdefgh"]


def text_score(text: str) -> float:
    """A reward that tells rollouts apart: any change to the text the rubric saw changes it."""
    return sum(ord(c) for c in text) % 97 / 97


def content(completion) -> str:
    return completion[-1]["content"] or "" if completion else ""


def scored(completion) -> float:
    return text_score(content(completion))


def single_turn(*funcs) -> object:
    return vf.SingleTurnEnv(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=list(funcs or [scored])))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_lora_training_client(base_model="tiny", rank=4, seed=3).save_weights_and_get_sampling_client()


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


# -- rollouts ---------------------------------------------------------------------------------------------------------

def test_single_turn_rollouts_keep_the_sampled_tokens_and_the_rubrics_reward(tokenizer, sampler):
    dataset = VerifiersDataset(single_turn(), tokenizer, groups_per_batch=2, group_size=3)
    batch = dataset.get_batch(0)
    timing: dict[str, float] = {}
    groups = dataset.rollout(sampler, batch, PARAMS, max_turns=1, seed=0, timing=timing)
    assert [len(g.trajectories) for g in groups] == [3, 3] and timing["env"] >= 0
    for builder, group in zip(batch, groups, strict=True):
        for trajectory in group.trajectories:
            [turn] = trajectory.transitions
            # The prompt the endpoint rendered, and exactly the tokens it sampled with their logprobs.
            assert turn.observation == prompt_ids(tokenizer, builder.row["prompt"][-1]["content"])
            assert len(turn.action) == len(turn.logprobs) > 0
            full = sampler.compute_logprobs(types.ModelInput.from_ints(turn.observation + turn.action)).result()
            assert max(abs(a - b) for a, b in zip(full[len(turn.observation):], turn.logprobs, strict=True)) < 1e-3
            # The rubric scored the text of those tokens, and its reward is the trajectory's.
            assert trajectory.reward == pytest.approx(text_score(tokenizer.decode(turn.action,
                                                                                  skip_special_tokens=True)))
            assert turn.metrics["rubric/scored"] == trajectory.reward and trajectory.failure is None
    # A group's rollouts sample with seeds of their own.
    assert len({tuple(t.transitions[0].action) for t in groups[0].trajectories}) > 1


class Again(vf.MultiTurnEnv):
    """Three turns: after each answer the user says "Again."; the reward is the number of answers seen / 3."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Again."}]


def turns_seen(completion) -> float:
    return sum(m["role"] == "assistant" for m in completion) / 3


def test_multi_turn_env_plays_its_turns_and_trains_only_sampled_tokens(tokenizer, sampler):
    env = Again(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[turns_seen]), max_turns=3)
    dataset = VerifiersDataset(env, tokenizer, groups_per_batch=1, group_size=2)
    [group] = dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=8, seed=1, timing={})
    for trajectory in group.trajectories:
        turns = trajectory.transitions
        assert len(turns) == 3 and trajectory.reward == 1.0
        assert [t.reward for t in turns] == [0.0, 0.0, 1.0]  # the rubric's reward on the last turn
        for before, after in itertools.pairwise(turns):
            assert len(after.observation) > len(before.observation) + len(before.action) - 2
            assert tokenizer.decode(after.observation).endswith("Again.<|im_end|>\n<|im_start|>assistant\n")
        pairs = trajectory_datums(trajectory, advantage=1.0)
        assert sum(sum(mask) for _, mask in pairs) == sum(len(t.action) for t in turns)  # only sampled tokens


def test_an_env_that_breaks_stops_the_step_naming_it(tokenizer, sampler):
    class Broken(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            raise KeyError("board")

    env = Broken(dataset=Dataset.from_list(ROWS), rubric=vf.Rubric(funcs=[turns_seen]), max_turns=2)
    dataset = VerifiersDataset(env, tokenizer, groups_per_batch=1, group_size=1)
    with pytest.raises(RewardError, match=r"Broken on row \d+: its rollout raised KeyError: 'board'"):
        dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=2, seed=0, timing={})


# -- tools ------------------------------------------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def used_the_sum(completion) -> float:
    """1 when the tool's result came back, plus a text score of the answer after it, so rollouts differ."""
    returned = any(m["role"] == "tool" and m["content"] == "5" for m in completion)
    return float(returned) + text_score(content(completion))


def tool_env() -> object:
    return vf.ToolEnv(dataset=Dataset.from_list(ROWS), tools=[add], rubric=vf.Rubric(funcs=[used_the_sum]),
                      max_turns=3)


def call_first(prompt: str) -> str | None:
    """tiny writes noise: its first turn is scripted to call add(2, 3); after the result it samples for real."""
    return None if "</tool_response>" in prompt else CALL


def test_tool_env_turns_train_only_the_models_tokens(tokenizer, sampler, monkeypatch):
    from scripted import script_chat

    script_chat(monkeypatch, call_first)
    dataset = VerifiersDataset(tool_env(), tokenizer, groups_per_batch=1, group_size=2)
    [group] = dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=3, seed=0, timing={})
    for trajectory in group.trajectories:
        first, second = trajectory.transitions  # the call, then the answer to its result
        assert tokenizer.decode(first.action) == CALL + "<|im_end|>"
        assert tokenizer.decode(second.observation).endswith(
            "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert trajectory.failure is None and trajectory.reward >= 1.0  # the tool ran and its result came back
        assert first.metrics == {} and second.metrics["rubric/total_tool_calls"] == 1.0
        # Only sampled tokens carry weight: the prompt, the tool schemas and the tool's result are observation.
        actions = [tok for t in trajectory.transitions for tok in t.action]
        weighted, unweighted = [], []
        for datum, mask in trajectory_datums(trajectory, advantage=1.0):
            targets = datum.loss_fn_inputs["target_tokens"].tolist()
            weighted += [tok for tok, m in zip(targets, mask, strict=True) if m]
            unweighted += [tok for tok, m in zip(targets, mask, strict=True) if not m]
        assert weighted == actions
        assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(unweighted)


# -- the loop ---------------------------------------------------------------------------------------------------------

def loop_config(path, **overrides) -> LoopConfig:
    values = dict(base_model="tiny", rank=4, steps=3, group_size=4, max_tokens=6, learning_rate=2e-2,
                  out=str(path / "run"), seed=1)
    return LoopConfig(**{**values, **overrides})


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_verifiers_env_trains_through_the_loop_with_its_rubrics_reward(tmp_path, tokenizer):
    dataset = VerifiersDataset(single_turn(), tokenizer, groups_per_batch=2, group_size=4)
    train(loop_config(tmp_path), dataset)
    run = tmp_path / "run"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics:
        records = read_jsonl(run / "rollouts" / f"step-{m['step']:06d}.jsonl")
        rewards = [r["reward"] for r in records]
        assert len(rewards) == 8 and all(r["failure"] is None for r in records)
        assert m["env/all/reward/mean"] == pytest.approx(sum(rewards) / 8)  # the rubric's reward, logged
        assert m["env/all/rubric/scored"] == pytest.approx(m["env/all/reward/mean"])
        assert m["env/all/reward/errors:sum"] == 0 and m["by_group/frac_failed"] == 0
    assert sum(m["train/datums"] for m in metrics) > 0 and all("optim/loss:sum" in m for m in metrics)


def test_a_tool_env_trains_through_the_loop_with_its_rubrics_reward(tmp_path, tokenizer, monkeypatch):
    from scripted import script_chat

    script_chat(monkeypatch, call_first)
    train(loop_config(tmp_path, steps=2, group_size=2), VerifiersDataset(tool_env(), tokenizer, groups_per_batch=1,
                                                                         group_size=2))
    run = tmp_path / "run"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        records = read_jsonl(run / "rollouts" / f"step-{m['step']:06d}.jsonl")
        assert len(records) == 2 and all(r["failure"] is None for r in records)
        assert m["env/all/reward/mean"] == pytest.approx(sum(r["reward"] for r in records) / 2)
        assert m["env/all/rubric/used_the_sum"] == pytest.approx(m["env/all/reward/mean"])
        assert m["env/all/reward/mean"] >= 1.0  # every rollout called the tool and got its result back
        assert m["env/all/rubric/add_calls"] == 1.0 and m["env/all/reward/errors:sum"] == 0
    assert sum(m["train/datums"] for m in metrics) > 0


def flaky(completion, answer) -> float:
    if answer in "ac":
        raise KeyError("no grader for this answer")
    return 1.0


def test_a_rubric_that_raises_is_a_counted_failure_not_a_zero(tmp_path, tokenizer):
    # The rows are shuffled: which of batch 0's groups fail is read off its rows.
    dataset = VerifiersDataset(single_turn(flaky), tokenizer, groups_per_batch=2, group_size=2)
    failing = sum(b.row["answer"] in "ac" for b in dataset.get_batch(0))
    train(loop_config(tmp_path, steps=1, group_size=2), dataset)
    [m] = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    records = read_jsonl(tmp_path / "run" / "rollouts" / "step-000000.jsonl")
    failed = [r for r in records if r["failure"]]
    assert len(failed) == 2 * failing and m["env/all/reward/errors:sum"] == 2 * failing
    assert all("reward function flaky raised KeyError" in r["failure"] and r["advantage"] is None for r in failed)
    assert m["by_group/frac_failed"] == failing / 2
    assert all(r["reward"] == 1.0 for r in records if not r["failure"])


def test_a_rubric_that_hangs_times_out_as_a_failure(tokenizer, sampler):
    def slow(completion) -> float:
        time.sleep(30)
        return 1.0

    dataset = VerifiersDataset(single_turn(slow), tokenizer, groups_per_batch=1, group_size=2, reward_timeout=0.5)
    started = time.monotonic()
    [group] = dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=1, seed=0, timing={})
    assert time.monotonic() - started < 20
    for trajectory in group.trajectories:
        assert trajectory.reward != trajectory.reward  # NaN
        assert trajectory.failure == "reward function slow timed out after 0.5s"


# -- what is refused --------------------------------------------------------------------------------------------------

def test_unknown_environment_is_a_clear_error(tokenizer):
    with pytest.raises(ConfigurationError, match="unknown verifiers environment 'no-such-env': no module "
                                                 "'no_such_env' is installed"):
        load_verifiers_env("no-such-env")
    with pytest.raises(ConfigurationError, match="unknown verifiers environment"):
        VerifiersDataset("no-such-env", tokenizer)


def test_an_installed_environment_loads_by_id(tmp_path, monkeypatch, tokenizer):
    (tmp_path / "say_letters.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n\n"
        "def load_environment(n=4):\n"
        "    rows = [{'question': f'Say {i}.', 'answer': str(i)} for i in range(n)]\n"
        "    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[lambda: 1.0]))\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    dataset = VerifiersDataset("say-letters", tokenizer, groups_per_batch=2, env_args={"n": 6})
    assert len(dataset) == 3
    with pytest.raises(ConfigurationError, match=r"'say-letters' did not load with \{'m': 1\}"):
        load_verifiers_env("say-letters", m=1)


def test_a_tool_the_endpoint_refuses_stops_the_run_naming_it(tokenizer, sampler):
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    add.__name__ = "add two"  # OpenAI's function names have no spaces: rlvr's endpoint answers 400
    env = vf.ToolEnv(dataset=Dataset.from_list(ROWS), tools=[add], rubric=vf.Rubric(funcs=[scored]))
    dataset = VerifiersDataset(env, tokenizer, groups_per_batch=1, group_size=1)
    with pytest.raises(SamplingError, match=r"refused by rlvr's OpenAI endpoint.*tools\.0\.function\.name"):
        dataset.rollout(sampler, dataset.get_batch(0), PARAMS, max_turns=1, seed=0, timing={})


def test_without_verifiers_the_error_says_what_to_install(monkeypatch, tokenizer):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'rlvr\[verifiers\]'"):
        VerifiersDataset("anything", tokenizer)
