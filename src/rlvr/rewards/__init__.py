"""Rewards a program can check, by name: ``@register_reward``, ``resolve_reward`` and killable batch scoring.

    from rlvr.rewards import register_reward, resolve_reward, score_batch

    reward_fn = resolve_reward("keyword_contains", keywords=["solution", "answer"])
    reward_fn("What is 2 + 2?", "The answer is 4.")                      # 0.5: one keyword of two

    @register_reward("math_correctness")
    def math_correctness(prompt: str, response: str, meta=None) -> float: ...

    env_reward = resolve_reward("format_correct", format="boxed_answer", correct="math_correct", format_coef=0.1)
    scores = score_batch(env_reward, [(prompt, response, {"answer": "72"}), ...], timeout=10.0)
    scores.scores, scores.metrics()          # [1.0, None, ...], {"reward/errors:sum": 1.0, ...}

Built-in names: ``keyword_contains``, ``length_penalty``, ``format_compliance``, ``boxed_answer``, ``math_correct``,
``code_tests``, ``rpn_format``, ``rpn_correct``, ``rpn_combined``, ``reasoning_gym`` (needs the extra),
``combine``, ``format_correct`` (:func:`list_rewards`). A reward is a callable ``(prompt, response, meta=None) ->
float`` that returns a finite number or raises; a direct call runs unbounded in the caller, :func:`score_batch` and
:class:`RewardRunner` run each call in a killable worker with a timeout and count failures instead of scoring them 0.
"""

from rlvr.errors import RewardError, RewardTimeoutError, UnknownRewardError
from rlvr.rewards.builtin import (
    FormatCompliance,
    FormatCorrect,
    KeywordContains,
    LengthPenalty,
    RpnCorrect,
    RpnFormat,
    WeightedSum,
    combine,
    format_correct,
)
from rlvr.rewards.code import CodeTests, default_sandbox, extract_code
from rlvr.rewards.math import BoxedAnswer, MathCorrect, answers_match, extract_answer, find_boxed, normalize_answer
from rlvr.rewards.reasoning_gym import ReasoningGymScore
from rlvr.rewards.registry import (
    CompositeReward,
    FunctionReward,
    Reward,
    RewardItem,
    list_rewards,
    register_reward,
    resolve_reward,
    unregister_reward,
)
from rlvr.rewards.runner import BatchScores, RewardFailure, RewardRunner, score_batch

__all__ = [
    "BatchScores",
    "BoxedAnswer",
    "CodeTests",
    "CompositeReward",
    "FormatCompliance",
    "FormatCorrect",
    "FunctionReward",
    "KeywordContains",
    "LengthPenalty",
    "MathCorrect",
    "ReasoningGymScore",
    "Reward",
    "RewardError",
    "RewardFailure",
    "RewardItem",
    "RewardRunner",
    "RewardTimeoutError",
    "RpnCorrect",
    "RpnFormat",
    "UnknownRewardError",
    "WeightedSum",
    "answers_match",
    "combine",
    "default_sandbox",
    "extract_answer",
    "extract_code",
    "find_boxed",
    "format_correct",
    "list_rewards",
    "normalize_answer",
    "register_reward",
    "resolve_reward",
    "score_batch",
    "unregister_reward",
]
