"""RPN arithmetic as in the Simplexity setup: evaluation, complexity as difficulty, the = <value> <eoe> rewards."""

import pytest

from rlvr.errors import ConfigurationError
from rlvr.tasks import RpnSource, evaluate_rpn


@pytest.mark.parametrize(("expression", "modulus", "expected"), [
    ("3 4 + 2 *", None, 14),
    ("5 1 2 + 4 * + 3 -", None, 14),
    ("2 7 -", None, -5),
    ("3 4 + 2 *", 5, 4),
    ("2 7 -", 5, 0),
])
def test_evaluate_rpn(expression, modulus, expected):
    assert evaluate_rpn(expression.split(), modulus) == expected


@pytest.mark.parametrize("expression", ["3 +", "3 4", ""])
def test_malformed_rpn_raises(expression):
    with pytest.raises(ValueError, match="RPN expression"):
        evaluate_rpn(expression.split())


def test_problems_follow_the_complexity_range_and_evaluate():
    source = RpnSource(complexity_range=(1, 3), num_train=60, num_test=15, seed=1)
    problems = source.problems("train")
    assert {p.difficulty for p in problems} == {1.0, 2.0, 3.0}
    for problem in problems:
        tokens = problem.meta["expression"].split()
        assert sum(t in "+-*" for t in tokens) == problem.difficulty
        assert int(problem.answer) == evaluate_rpn(tokens)
        assert source.score(problem, source.demonstration(problem)) == 1.0
    assert not {p.meta["expression"] for p in source.problems("test")} & {p.meta["expression"] for p in problems}
    again = RpnSource((1, 3), num_train=60, num_test=15, seed=1).problems()
    assert [p.question for p in problems] == [p.question for p in again]


def test_modular_problems():
    source = RpnSource(complexity_range=(2, 2), max_operand=20, modulus=7, num_train=20, num_test=5)
    for problem in source.problems("train"):
        assert 0 <= int(problem.answer) < 7 and "mod 7" in problem.question
        assert int(problem.answer) == evaluate_rpn(problem.meta["expression"].split(), 7)


def test_combined_reward_values():
    source = RpnSource(num_train=3, num_test=3)
    problem = source.problems("test")[0]
    right, wrong = int(problem.answer), int(problem.answer) + 1
    assert source.prompt_text(problem).endswith("end your answer with `= <value> <eoe>`.")
    assert source.score(problem, f"= {right} <eoe>") == pytest.approx(1.0)
    assert source.score(problem, f"= {wrong} <eoe>") == pytest.approx(0.2)   # format only: boxed_weight 0.2
    assert source.score(problem, str(right)) == 0.0                          # no `= ... <eoe>`: neither


def test_configuration_errors():
    with pytest.raises(ConfigurationError, match="complexity_range"):
        RpnSource(complexity_range=(3, 1))
    with pytest.raises(ConfigurationError, match="operators"):
        RpnSource(operators="/")
    with pytest.raises(ConfigurationError, match="modulus"):
        RpnSource(modulus=1)
