"""Procedural arithmetic: determinism, levels as difficulty, disjoint splits, correct answers, working rewards."""

import re
from fractions import Fraction

import pytest

from rlvr.errors import ConfigurationError
from rlvr.tasks import ArithmeticSource
from rlvr.tasks.arithmetic import LEVELS


def value_of(expression: str) -> Fraction:
    """Evaluate one of our generated expressions exactly (digits, + - * /, parentheses only)."""
    assert re.fullmatch(r"[\d+\-*/() ]+", expression), expression
    tokens = re.findall(r"\d+|[-+*/()]", expression)

    def parse(pos: int, level: int) -> tuple[Fraction, int]:
        if level == 3:
            if tokens[pos] == "(":
                value, pos = parse(pos + 1, 1)
                return value, pos + 1
            return Fraction(int(tokens[pos])), pos + 1
        value, pos = parse(pos, level + 1)
        ops = "+-" if level == 1 else "*/"
        while pos < len(tokens) and tokens[pos] in ops:
            op = tokens[pos]
            right, pos = parse(pos + 1, level + 1)
            value = value + right if op == "+" else value - right if op == "-" else value * right if op == "*" \
                else value / right
        return value, pos

    value, end = parse(0, 1)
    assert end == len(tokens)
    return value


def test_same_seed_same_problems_and_different_seed_different():
    a = ArithmeticSource(levels=(1, 2, 3, 4, 5), num_train=50, num_test=20, seed=7)
    b = ArithmeticSource(levels=(1, 2, 3, 4, 5), num_train=50, num_test=20, seed=7)
    c = ArithmeticSource(levels=(1, 2, 3, 4, 5), num_train=50, num_test=20, seed=8)
    assert [p.question for p in a.problems("train")] == [p.question for p in b.problems("train")]
    assert [p.question for p in a.problems("train")] != [p.question for p in c.problems("train")]


def test_answers_are_right_and_levels_are_difficulties():
    source = ArithmeticSource(levels=tuple(LEVELS), num_train=120, num_test=30)
    problems = source.problems("train") + source.problems("test")
    assert {p.difficulty for p in problems} == {float(level) for level in LEVELS}
    for problem in problems:
        assert re.fullmatch(r"-?\d+", problem.answer)
        if problem.difficulty < 6:
            expression = re.fullmatch(r"What is (.*)\?", problem.question).group(1)
            assert value_of(expression) == int(problem.answer), problem
        else:
            assert int(problem.answer) >= 0 and len(problem.question) > 60
        if problem.difficulty in (1, 2, 3, 4):
            assert int(problem.answer) >= 0
        assert source.score(problem, source.demonstration(problem)) == 1.0


def test_digits_and_operators_follow_the_level():
    easy = ArithmeticSource(levels=(1,), num_train=30, num_test=5).problems("train")
    assert all(re.fullmatch(r"What is \d [+-] \d\?", p.question) for p in easy)
    three = ArithmeticSource(levels=(4,), num_train=30, num_test=5).problems("train")
    assert all(len(re.findall(r"\d+", p.question)) == 3 for p in three)


def test_test_questions_never_appear_in_train_and_curricula_filter():
    source = ArithmeticSource(levels=(1, 2), num_train=150, num_test=40)
    test = {p.question for p in source.problems("test")}
    assert len(test) == 40
    assert not test & {p.question for p in source.problems("train")}
    assert {p.difficulty for p in source.problems("train", max_difficulty=1)} == {1.0}


def test_rewards_and_prompt():
    source = ArithmeticSource(levels=(2,), num_train=5, num_test=5)
    problem = source.problems("test")[0]
    assert source.prompt_text(problem).endswith("Put your final answer in \\boxed{}.")
    assert source.score(problem, f"\\boxed{{{problem.answer}}}") == 1.0
    assert source.score(problem, f"\\boxed{{{int(problem.answer) + 1}}}") == 0.0
    assert source.score(problem, "no idea") == pytest.approx(-0.1)


def test_configuration_errors():
    with pytest.raises(ConfigurationError, match="levels"):
        ArithmeticSource(levels=(9,))
    with pytest.raises(ConfigurationError, match="too few distinct"):
        ArithmeticSource(levels=(1,), num_train=10, num_test=500).problems("test")
