"""Multi-turn code refinement: attempts run in the sandbox, failures come back as a user turn, the episode is one
growing conversation."""

from types import SimpleNamespace

import pytest

from rlvr import types
from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ConfigurationError
from rlvr.integrations.refine import CodeRefineEnv, CodeRefineGroupBuilder, code_refine_dataset
from rlvr.rl.envs import rollout_groups, trajectory_datums
from rlvr.sandbox import Sandbox
from rlvr.tasks import MbppSource
from rlvr.tasks.arithmetic import ArithmeticSource

RECORD = {"text": "Write a function to add two numbers.", "task_id": 7, "test_setup_code": "",
          "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
PARAMS = types.SamplingParams(max_tokens=64)


class ScriptedSampler:
    """Answers each request with the next scripted response (ending in the stop token), logprobs 0."""

    def __init__(self, tokenizer, responses: list[str]) -> None:
        self.tokenizer, self.responses, self.prompts = tokenizer, list(responses), []

    def sample(self, prompt, num_samples, params):
        self.prompts.append(prompt.to_ints())
        tokens = self.tokenizer.encode(self.responses.pop(0)) + [self.tokenizer.eos_token_id]
        sequence = SimpleNamespace(tokens=tokens, logprobs=[0.0] * len(tokens), stop_reason="stop")
        return SimpleNamespace(result=lambda: SimpleNamespace(sequences=[sequence]))


@pytest.fixture(scope="module")
def source():
    with Sandbox(num_workers=1, timeout=5.0) as box:
        yield MbppSource([RECORD], sandbox=box)


def play(source, responses: list[str], max_attempts: int, max_turns: int):
    """One refinement episode of the MBPP record with scripted answers; its trajectory and the tokenizer."""
    tokenizer = build_tiny_tokenizer()
    builder = CodeRefineGroupBuilder(source, source.problems("train")[0], tokenizer, 1, max_attempts=max_attempts)
    [group] = rollout_groups(ScriptedSampler(tokenizer, responses), [builder], PARAMS, max_turns=max_turns)
    return group.trajectories[0], tokenizer


def test_a_failed_attempt_gets_test_feedback_and_the_fix_ends_the_episode(source):
    trajectory, tokenizer = play(source, [WRONG, RIGHT], max_attempts=3, max_turns=3)
    first, second = trajectory.transitions
    assert (first.reward, second.reward, trajectory.finished) == (0.0, 1.0, True)
    assert second.metrics == {"attempts": 2.0, "passed": 1.0}
    # The second prompt is the first prompt, the sampled answer, then the feedback turn, token for token.
    assert second.observation[:len(first.observation) + len(first.action)] == first.observation + first.action
    reply = tokenizer.decode(second.observation[len(first.observation) + len(first.action):])
    assert "passed 0 of 2 tests" in reply and "AssertionError" in reply
    assert reply.startswith("\n<|im_start|>user\n") and reply.endswith("<|im_start|>assistant\n")
    assert len(trajectory_datums(trajectory, advantage=1.0)) == 1  # one growing conversation, one datum


def test_the_last_attempt_ends_the_episode_with_its_reward(source):
    trajectory, _ = play(source, [WRONG, WRONG], max_attempts=2, max_turns=5)
    assert [t.reward for t in trajectory.transitions] == [0.0, -0.5]  # code_tests' fail reward on the last try
    assert trajectory.transitions[-1].metrics == {"attempts": 2.0, "passed": 0.0}


def test_refinement_needs_a_code_reward_and_an_attempt():
    tokenizer = build_tiny_tokenizer()
    arithmetic = ArithmeticSource(num_train=4, num_test=0)
    with pytest.raises(ConfigurationError, match="code_tests reward"):
        CodeRefineEnv(arithmetic, arithmetic.problems("train")[0], tokenizer)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        CodeRefineEnv(arithmetic, arithmetic.problems("train")[0], tokenizer, max_attempts=0)


def test_code_refine_dataset_batches_problems(source):
    dataset = code_refine_dataset(source, build_tiny_tokenizer(), problems_per_batch=1, group_size=3)
    [builder] = dataset.get_batch(0)
    assert len(dataset) == 1 and len(builder.make_envs()) == 3
