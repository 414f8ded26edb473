"""The reward registry: names, kwargs, errors, value checks, and the seed cookbook's examples run as written."""

import math
import re
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rewards import (
    FunctionReward,
    MathCorrect,
    Reward,
    RewardError,
    UnknownRewardError,
    list_rewards,
    register_reward,
    resolve_reward,
    unregister_reward,
)

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"
BUILTINS = {"boxed_answer", "code_tests", "combine", "format_compliance", "format_correct", "keyword_contains",
            "length_penalty", "math_correct", "rpn_combined", "rpn_correct", "rpn_format"}


@pytest.fixture
def scratch_names():
    """Names a test registers; removed afterwards so tests do not leak into each other."""
    names: list[str] = []
    yield names
    for name in names:
        if name in list_rewards():
            unregister_reward(name)


def seed_blocks(marker: str) -> list[str]:
    if not SEEDS.is_dir():
        pytest.skip(f"seed documents not found at {SEEDS}")
    for path in sorted(SEEDS.glob("*.txt")):
        text = path.read_text()
        if marker in text:
            return re.findall(r"```python\n(.*?)```", text, re.S)
    pytest.skip(f"no seed document contains {marker!r}")


def seed_block(marker: str, contains: str) -> str:
    for block in seed_blocks(marker):
        if contains in block:
            return block.replace("from tensafe.rlvr import", "from rlvr.rewards import")
    pytest.fail(f"no python block with {contains!r} in the seed document")


def test_builtins_are_registered():
    assert BUILTINS <= set(list_rewards())
    assert list_rewards() == sorted(list_rewards())


def test_unknown_name_lists_registered_names_and_the_nearest():
    with pytest.raises(UnknownRewardError) as info:
        resolve_reward("math_corect")
    message = str(info.value)
    assert "'math_corect'" in message and "Did you mean 'math_correct'?" in message
    assert all(name in message for name in BUILTINS)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_unknown_name_without_a_near_match_has_no_guess():
    with pytest.raises(UnknownRewardError) as info:
        resolve_reward("zzzzzzzz")
    assert "Did you mean" not in str(info.value)


def test_plain_function_with_bound_kwargs(scratch_names):
    scratch_names.append("test_bonus")

    @register_reward("test_bonus")
    def bonus(prompt, response, meta=None, extra=0.0):
        return len(response) + extra

    assert bonus("p", "abc") == 3  # the decorator returns the function unchanged
    reward = resolve_reward("test_bonus", extra=0.5)
    assert isinstance(reward, FunctionReward) and reward.name == "test_bonus"
    assert reward("p", "abcd") == 4.5
    with pytest.raises(ConfigurationError, match="unexpected keyword argument 'bogus'"):
        resolve_reward("test_bonus", bogus=1)


def test_class_and_factory_registration(scratch_names):
    scratch_names += ["test_scaled", "test_factory"]

    @register_reward("test_scaled")
    class Scaled(Reward):
        name = "test_scaled"

        def __init__(self, scale: float = 1.0):
            self.scale = scale

        def __call__(self, prompt, response, meta=None):
            return self.scale * len(response)

    @register_reward("test_factory", factory=True)
    def make(offset: float):
        return lambda prompt, response, meta=None: offset - len(response)

    assert resolve_reward("test_scaled", scale=2.0)("", "abc") == 6.0
    made = resolve_reward("test_factory", offset=10)
    assert made("", "abc") == 7.0 and made.name == "test_factory"
    with pytest.raises(ConfigurationError, match="scale"):
        resolve_reward("test_scaled", scale=1, shape=2)
    with pytest.raises(ConfigurationError, match="offset"):
        resolve_reward("test_factory")


def test_taking_a_name_needs_override_but_rerunning_a_definition_does_not(scratch_names):
    scratch_names.append("test_taken")

    def first(prompt, response, meta=None):
        return 1.0

    register_reward("test_taken")(first)
    register_reward("test_taken")(first)  # same function again (a re-run cell): fine

    def second(prompt, response, meta=None):
        return 2.0

    with pytest.raises(ConfigurationError, match="taken by"):
        register_reward("test_taken")(second)
    with pytest.raises(ConfigurationError, match="taken by"):
        register_reward("keyword_contains")(second)
    register_reward("test_taken", override=True)(second)
    assert resolve_reward("test_taken")("", "") == 2.0


@pytest.mark.parametrize("bad", [None, "1.0", math.nan, math.inf, [1.0]])
def test_a_reward_that_returns_a_non_number_raises_instead_of_scoring_zero(bad):
    reward = resolve_reward(lambda prompt, response, meta=None: bad)
    with pytest.raises(RewardError, match="must"):
        reward("p", "r")


def test_bools_and_ints_are_numbers():
    assert resolve_reward(lambda p, r, m=None: True)("", "") == 1.0
    assert resolve_reward(lambda p, r, m=None: 3)("", "") == 3.0


def test_module_path_names():
    reward = resolve_reward("rlvr.rewards.math:MathCorrect", require_boxed=True)
    assert isinstance(reward, MathCorrect) and reward.answer_form == "boxed"
    with pytest.raises(ConfigurationError, match="cannot import module"):
        resolve_reward("no_such_module_xyz:reward")
    with pytest.raises(ConfigurationError, match="has no attribute"):
        resolve_reward("rlvr.rewards.math:NoSuchThing")


def test_a_reward_object_is_returned_as_is_and_refuses_kwargs():
    reward = MathCorrect()
    assert resolve_reward(reward) is reward
    with pytest.raises(ConfigurationError, match="already configured"):
        resolve_reward(reward, backend="sympy")


def test_seed_builtin_examples_run_as_written():
    scope: dict = {"resolve_reward": resolve_reward}
    exec(seed_block("Cookbook: RLVR Training", 'resolve_reward("keyword_contains"'), scope)
    # The block leaves the last one, format_compliance over [r"^\d+\.", r"Step \d+:"], in reward_fn.
    reward_fn = scope["reward_fn"]
    assert reward_fn("Solve it", "1. Add\nStep 2: done") == 1.0
    assert reward_fn("Solve it", "Step 1: add") == 0.5
    assert reward_fn("Solve it", "no structure") == 0.0
    keyword = resolve_reward("keyword_contains", keywords=["solution", "answer"])
    assert keyword("", "The answer is 4") == 0.5
    length = resolve_reward("length_penalty", target_length=100, penalty_scale=0.01)
    assert length("", "word " * 90) == pytest.approx(0.9)


def test_seed_custom_math_correctness_reward_registers_and_resolves(scratch_names):
    scratch_names.append("math_correctness")
    scope: dict = {"__name__": "seed_example", "resolve_reward": resolve_reward}  # imported in the doc's step 2
    exec(seed_block("Cookbook: RLVR Training", '@register_reward("math_correctness")'), scope)
    reward_fn = scope["reward_fn"]  # the block ends with reward_fn = resolve_reward("math_correctness")
    assert reward_fn.name == "math_correctness"
    # Hand-computed from the seed's rules: exact (|diff| < 0.01) 1.0, close (< 1.0) 0.5, else 0.0.
    assert reward_fn("What is 5 + 3?", "The answer is 8", {"expected_answer": "8"}) == 1.0
    assert reward_fn("What is 5 + 3?", "The result is 8.5", {"expected_answer": "8"}) == 0.5
    assert reward_fn("What is 5 + 3?", "The answer is 11", {"expected_answer": "8"}) == 0.0
    assert reward_fn("What is 5 + 3?", "The answer is 8", None) == 0.0


def test_seed_reward_shaping_composite(scratch_names):
    scope: dict = {"resolve_reward": resolve_reward}
    exec(seed_block("Cookbook: RLVR Training", "def composite_reward"), scope)
    response = "step " * 150  # keyword "step" present: 1.0; 150 words at target 150: 1.0
    assert scope["composite_reward"]("p", response) == pytest.approx(1.0)
    response = "nothing " * 100  # no keyword: 0.0; 50 words short at 0.01 a word: 0.5
    assert scope["composite_reward"]("p", response) == pytest.approx(0.6 * 0.0 + 0.4 * 0.5)
