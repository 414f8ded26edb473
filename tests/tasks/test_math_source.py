"""MATH-format problems: the reference from the last \\boxed{} (or the answer field), levels as difficulty."""

import pytest

from rlvr.errors import ConfigurationError
from rlvr.tasks import MathSource

RECORDS = [
    {"problem": "Compute $\\frac{2}{4}$.", "solution": "Reduce: $\\boxed{\\frac{1}{2}}$.", "level": "Level 2",
     "type": "Prealgebra"},
    {"problem": "Expand $(x+1)^2$.", "solution": "We get \\boxed{x^2+2x+1}.", "level": "Level 4",
     "type": "Algebra", "unique_id": "test/algebra/7.json"},
    {"problem": "What is 6 * 7?", "solution": "It is 42.", "answer": "42", "level": "Level ?"},
]


def test_records_become_problems():
    source = MathSource(RECORDS)
    half, square, plain = source.problems("train")
    assert (half.answer, half.difficulty, half.meta["type"]) == ("\\frac{1}{2}", 2.0, "Prealgebra")
    assert (square.id, square.answer, square.difficulty) == ("math/test/algebra/7.json", "x^2+2x+1", 4.0)
    assert (plain.answer, plain.difficulty) == ("42", None)  # the answer field wins; no number in the level
    assert source.demonstration(plain) == "It is 42.\n\\boxed{42}"
    assert source.demonstration(half) == half.solution


@pytest.mark.parametrize(("response", "expected"), [
    ("so \\boxed{0.5}", 1.0),
    ("so \\boxed{1/2}", 1.0),
    ("so \\boxed{\\dfrac{1}{2}}", 1.0),
    ("so \\boxed{2/3}", 0.0),
    ("one half", -0.1),
])
def test_equivalent_answers_score(response, expected):
    source = MathSource(RECORDS)
    assert source.score(source.problems("train")[0], response) == pytest.approx(expected)


def test_renamed_fields_and_missing_answer():
    source = MathSource([{"q": "1+1?", "a": "2", "lvl": 1}], question_field="q", answer_field="a", level_field="lvl")
    problem = source.problems("train")[0]
    assert (problem.question, problem.answer, problem.difficulty) == ("1+1?", "2", 1.0)
    with pytest.raises(ConfigurationError, match="no \\\\boxed"):
        MathSource([{"problem": "p", "solution": "no box"}]).problems("train")


def test_hub_spec():
    spec = MathSource.hub()
    assert spec.name == "HuggingFaceH4/MATH-500" and MathSource(spec).splits() == ("test",)
