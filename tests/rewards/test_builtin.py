"""Hand-computed values of the built-in text rewards and of the two compositions."""

import re
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rewards import CompositeReward, RewardError, combine, format_correct, resolve_reward


def words(n: int) -> str:
    return " ".join(["w"] * n)


@pytest.mark.parametrize(("response", "expected"), [
    ("The Answer is 4", 0.5),            # one of two keywords, case-insensitive
    ("solution: x. answer: 4", 1.0),
    ("nothing here", 0.0),
])
def test_keyword_contains(response, expected):
    assert resolve_reward("keyword_contains", keywords=["solution", "answer"])("p", response) == expected


def test_keyword_contains_case_sensitive_and_validation():
    reward = resolve_reward("keyword_contains", keywords=["Answer", "x"], case_sensitive=True)
    assert reward("p", "the answer") == 0.0
    assert reward("p", "The Answer x") == 1.0
    with pytest.raises(ConfigurationError, match=r"keywords=\['answer'\]"):
        resolve_reward("keyword_contains", keywords="answer")  # a bare string would match letter by letter
    with pytest.raises(ConfigurationError, match="keywords"):
        resolve_reward("keyword_contains")


@pytest.mark.parametrize(("n", "expected"), [(100, 1.0), (80, 0.8), (150, 0.5), (300, 0.0), (0, 0.0)])
def test_length_penalty_in_words(n, expected):
    reward = resolve_reward("length_penalty", target_length=100, penalty_scale=0.01)
    assert reward("p", words(n)) == pytest.approx(expected)


def test_length_penalty_in_chars_with_a_floor():
    reward = resolve_reward("length_penalty", target_length=10, penalty_scale=0.1, unit="chars", floor=-1.0)
    assert reward("p", "abcde") == pytest.approx(0.5)
    assert reward("p", "x" * 40) == pytest.approx(-1.0)  # 1 - 3.0 = -2.0, floored
    with pytest.raises(ConfigurationError, match="unit"):
        resolve_reward("length_penalty", unit="tokens")


@pytest.mark.parametrize(("response", "expected"), [
    ("Plan:\n1. add\nStep 2: check", 1.0),   # ^ matches at a line start (MULTILINE)
    ("Step 1: add", 0.5),
    ("see 1. above", 0.0),                   # "1." is not at a line start
])
def test_format_compliance(response, expected):
    reward = resolve_reward("format_compliance", patterns=[r"^\d+\.", r"Step \d+:"])
    assert reward("p", response) == expected


def test_format_compliance_rejects_a_bad_pattern_by_index():
    with pytest.raises(ConfigurationError, match=r"patterns\[1\]='\('"):
        resolve_reward("format_compliance", patterns=["ok", "("])


@pytest.mark.parametrize(("response", "expected"), [
    (r"so \boxed{3}", 1.0),
    (r"\boxed{\frac{1}{2}}", 1.0),
    (r"\boxed{ }", 0.0),
    ("3", 0.0),
])
def test_boxed_answer(response, expected):
    assert resolve_reward("boxed_answer")("p", response) == expected


@pytest.mark.parametrize(("response", "fmt", "correct", "combined"), [
    ("3 4 + means 7 = 7 <eoe>", 1.0, 1.0, 1.0),
    ("= 8 <eoe>", 1.0, 0.0, 0.2),
    ("=7<eoe>", 1.0, 1.0, 1.0),
    ("7", 0.0, 0.0, 0.0),
    ("= 6 <eoe> no, = 7 <eoe>", 1.0, 1.0, 1.0),  # the last answer counts
])
def test_rpn_rewards(response, fmt, correct, combined):
    meta = {"answer": "7"}
    assert resolve_reward("rpn_format")("p", response, meta) == fmt
    assert resolve_reward("rpn_correct")("p", response, meta) == correct
    assert resolve_reward("rpn_combined")("p", response, meta) == pytest.approx(combined)


def test_rpn_correct_without_reference_raises():
    with pytest.raises(ConfigurationError, match=r"meta\['answer'\]"):
        resolve_reward("rpn_correct")("p", "= 7 <eoe>", {})


def test_combine_weights_parts():
    keyword = resolve_reward("keyword_contains", keywords=["a", "b"])
    length = resolve_reward("length_penalty", target_length=2, penalty_scale=0.5)
    reward = combine({keyword: 0.6, length: 0.4})
    # keyword: 1 of 2 = 0.5; length: 2 words at target 2 = 1.0; 0.6 * 0.5 + 0.4 * 1.0 = 0.7
    assert reward("p", "a c") == pytest.approx(0.7)
    assert isinstance(reward, CompositeReward) and list(reward.parts()) == ["keyword_contains", "length_penalty"]


def test_combine_by_name_and_duplicate_names():
    reward = resolve_reward("combine", rewards={"boxed_answer": 1.0, resolve_reward("boxed_answer"): -0.25})
    assert list(reward.parts()) == ["boxed_answer", "boxed_answer#2"]
    assert reward("p", r"\boxed{1}") == pytest.approx(0.75)
    with pytest.raises(ConfigurationError, match="non-empty mapping"):
        combine({})
    with pytest.raises(ConfigurationError, match="weights are numbers"):
        combine({"boxed_answer": "1"})


@pytest.mark.parametrize(("response", "expected"), [
    (r"so \boxed{72}", 1.0),   # correct, formatted
    ("72", 0.9),               # correct (the whole reply), not formatted: 1 + 0.1 * (0 - 1)
    ("so 72", -0.1),           # a number among words is no stated answer
    (r"\boxed{71}", 0.0),      # formatted, wrong
    ("71", -0.1),              # neither
])
def test_format_correct_is_the_cookbook_reward(response, expected):
    reward = format_correct()
    assert reward("p", response, {"answer": "72"}) == pytest.approx(expected)
    assert reward.parts()["format"].name == "boxed_answer" and reward.parts()["correct"].name == "math_correct"


def test_format_correct_coefficient_and_failing_part():
    reward = resolve_reward("format_correct", format_coef=0.5)
    assert reward("p", "72", {"answer": "72"}) == pytest.approx(0.5)
    broken = format_correct(correct=lambda p, r, m=None: None)
    with pytest.raises(RewardError):
        broken("p", r"\boxed{1}", {})


def test_format_correct_matches_the_tinker_cookbook_formula():
    """Seed 003 states the GSM8K reward as ``1[answer correct] + 0.1 * (1[format correct] - 1)``."""
    seeds = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"
    texts = [p.read_text() for p in sorted(seeds.glob("*.txt"))] if seeds.is_dir() else []
    formulas = [m for t in texts for m in re.findall(r"^(1\[answer correct\].*)$", t, re.M)]
    if not formulas:
        pytest.skip(f"no seed document under {seeds} states the cookbook reward formula")
    formula = formulas[0].replace("1[answer correct]", "correct").replace("1[format correct]", "fmt")
    assert re.fullmatch(r"[a-z0-9.+*() -]+", formula), formula
    reward = format_correct()
    cases = {(1, 1): r"\boxed{72}", (1, 0): "72", (0, 1): r"\boxed{7}", (0, 0): "7"}
    for (correct, fmt), response in cases.items():
        expected = eval(formula, {"__builtins__": {}}, {"correct": correct, "fmt": fmt})
        assert reward("p", response, {"answer": "72"}) == pytest.approx(expected)
