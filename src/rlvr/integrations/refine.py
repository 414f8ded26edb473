"""Multi-turn code refinement: the model writes a program, sees which tests failed and why, and tries again.

``CodeRefineEnv`` runs each attempt against the problem's tests in the sandbox (through the ``code_tests`` reward,
never in this process). An attempt that passes every test, or the last of ``max_attempts``, ends the episode with
that attempt's reward (``code_tests``: 1.0 all pass, 0.5 x fraction some, -0.5 none); earlier attempts earn 0. A
failed attempt is answered with a user turn giving the count of passing tests and the end of the traceback, in
the source's chat format, appended to the tokens the model saw and sampled, so the whole episode stays one growing
conversation (one datum; ``envs.trajectory_datums``).

    dataset = code_refine_dataset(MbppSource(paths), tokenizer, problems_per_batch=4, group_size=4, max_attempts=2)
    train(LoopConfig(base_model="smollm2-135m", max_turns=2, ...), dataset)

Not here: the env API (``envs.py``), the sandbox (``rlvr.sandbox``).
"""

from __future__ import annotations

from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards.code import CodeTests
from rlvr.rl.envs import Env, EnvGroupBuilder, ProblemDataset, StepResult, extend_conversation
from rlvr.tasks.base import Problem, ProblemSource

FEEDBACK_CHARS = 600
"""How much of a failed attempt's traceback the next turn shows."""


def feedback(num_passed: int, num_tests: int, status: str, stderr_tail: str) -> str:
    """The user turn after a failed attempt."""
    why = {"timeout": "It ran out of time.", "memory": "It ran out of memory."}.get(status, "")
    tail = stderr_tail.strip()[-FEEDBACK_CHARS:]
    text = f"Your code passed {num_passed} of {num_tests} tests. {why}".strip()
    if tail:
        text += f"\nThe end of the error output:\n{tail}"
    return text + "\nFix the code and give the whole corrected program."


class CodeRefineEnv(Env):
    """One problem of a code source, up to ``max_attempts`` tries with test feedback between them."""

    def __init__(self, source: ProblemSource, problem: Problem, tokenizer: Any, max_attempts: int = 2,
                 reward: CodeTests | None = None) -> None:
        if max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
        reward = reward if reward is not None else source.reward()
        if not isinstance(reward, CodeTests):
            raise ConfigurationError(f"CodeRefineEnv needs a code_tests reward (the source's is "
                                     f"{type(reward).__name__}); it reads which tests failed")
        self.source, self.problem, self.tokenizer, self.reward = source, problem, tokenizer, reward
        self.max_attempts = max_attempts
        self.messages = source.messages(problem)
        self.observation: list[int] = []
        self.attempts = 0

    def initial_observation(self) -> list[int]:
        self.observation = self.source.render_ids(self.problem, self.tokenizer)
        return self.observation

    def step(self, action: list[int]) -> StepResult:
        self.attempts += 1
        response = self.tokenizer.decode(action, skip_special_tokens=True)
        result = self.reward.run(response, self.problem.reward_meta())
        value = self.reward.value(result)
        if result.passed or self.attempts == self.max_attempts:
            return StepResult(reward=value, done=True, metrics={"attempts": float(self.attempts),
                                                                "passed": float(result.passed)})
        self.messages = [*self.messages, {"role": "assistant", "content": response},
                         {"role": "user", "content": feedback(result.num_passed, result.num_tests, result.status,
                                                              result.stderr_tail)}]
        self.observation = extend_conversation(self.observation + list(action), self.messages, self.tokenizer)
        return StepResult(reward=0.0, done=False, next_observation=self.observation)


class CodeRefineGroupBuilder(EnvGroupBuilder):
    """``group_size`` refinement episodes of one problem."""

    def __init__(self, source: ProblemSource, problem: Problem, tokenizer: Any, group_size: int,
                 max_attempts: int = 2) -> None:
        self.source, self.problem, self.tokenizer = source, problem, tokenizer
        self.group_size, self.max_attempts = group_size, max_attempts

    def make_envs(self) -> list[Env]:
        return [CodeRefineEnv(self.source, self.problem, self.tokenizer, self.max_attempts)
                for _ in range(self.group_size)]


def code_refine_dataset(source: ProblemSource, tokenizer: Any, problems_per_batch: int, group_size: int,
                        max_attempts: int = 2, split: str = "train", seed: int = 0, test_split: str | None = None,
                        test_problems: int = 32) -> ProblemDataset:
    """A code source's split as refinement groups, ``problems_per_batch`` per batch (shuffled once with ``seed``);
    ``test_split`` adds held-out episodes for the loop's evaluation."""
    return ProblemDataset(source, tokenizer, problems_per_batch, group_size, split, seed,
                          make_group=lambda p, n: CodeRefineGroupBuilder(source, p, tokenizer, n, max_attempts),
                          test_split=test_split, test_problems=test_problems)
