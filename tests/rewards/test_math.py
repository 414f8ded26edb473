"""The math grader: answer extraction, equivalent forms, the sympy fallback, timeouts, and GSM8K's 7473 references."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rewards import RewardTimeoutError, answers_match, extract_answer, find_boxed, resolve_reward
from rlvr.rewards.math import as_number, normalize_answer

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None


def test_find_boxed_balances_braces():
    text = r"first \boxed{1} then \boxed{\frac{1}{2}} and \fbox{x{y}} and \boxed 7 end"
    assert find_boxed(text) == ["1", r"\frac{1}{2}", "x{y}", "7"]
    assert find_boxed(r"\boxed{unclosed") == []


@pytest.mark.parametrize(("text", "expected"), [
    (r"so \boxed{12} and later \boxed{13}", "13"),      # last box
    ("Natalia sold 72 clips.\n#### 72", "72"),          # GSM8K
    ("#### 1,080", "1,080"),
    ("The answer is 42. Then 7 more.", "42"),           # 'answer is' beats the last number
    ("I get 3, then 5.5 in the end", "5.5"),           # last number
    ("3/4 of it", "3/4"),
    ("no numbers", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_normalize_and_plain_numbers():
    assert normalize_answer(r"\$1,000.") == "1000"
    assert normalize_answer(r"\boxed{\dfrac{1}{2}}") == r"\frac{1}{2}"
    assert normalize_answer("1,2") == "1,2"  # a pair, not a thousands separator
    assert as_number("-7/4") == as_number(r"-\frac{7}{4}") == as_number("-1.75")
    assert as_number("x+1") is None and as_number("1/0") is None


EQUIVALENT = [
    (r"\boxed{1/2}", "0.5"),
    ("0.5", r"\frac{1}{2}"),
    (r"\boxed{\frac{1}{2}}", "1/2"),
    ("1,000", "1000"),
    ("1000", "1,000"),
    (r"\boxed{\dfrac{3}{4}}", "0.75"),
    (r"\boxed{\$18}", "18"),
    (r"\boxed{50\%}", "50"),
    (r"\boxed{-3}", "-3.0"),
    (r"\boxed{x^2+1}", "1+x^2"),
]


@pytest.mark.parametrize(("response", "reference"), EQUIVALENT)
def test_equivalent_forms_score_one(response, reference):
    assert resolve_reward("math_correct")("p", response, {"answer": reference}) == 1.0


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed")
@pytest.mark.parametrize(("response", "reference"), [
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}"),
    (r"\boxed{(1, 2)}", "(1,2)"),
    (r"\boxed{\frac{\sqrt{3}}{3}}", r"\frac{1}{\sqrt{3}}"),
])
def test_math_verify_forms(response, reference):
    assert resolve_reward("math_correct", backend="math_verify")("p", response, {"answer": reference}) == 1.0


@pytest.mark.parametrize(("response", "reference"), [
    (r"\boxed{0.33}", "1/3"),
    (r"\boxed{12}", "1,2"),
    (r"\boxed{73}", "72"),
    (r"\boxed{x^2-1}", "x^2+1"),
    ("", "1"),
])
def test_different_answers_score_zero(response, reference):
    assert resolve_reward("math_correct")("p", response, {"answer": reference}) == 0.0


@pytest.mark.parametrize(("pred", "ref", "expected"), [
    ("2x", "x*2", True),
    (r"\sqrt{8}", r"2\sqrt{2}", True),
    (r"\frac{x}{2}", "x/2", True),
    ("(1, 2)", "(1,2)", True),
    ("x+2", "x+1", False),
])
def test_sympy_fallback(pred, ref, expected):
    assert answers_match(pred, ref, backend="sympy") is expected


def test_sympy_fallback_never_evaluates_code(tmp_path):
    marker = tmp_path / "ran"
    attack = f"__import__('pathlib').Path('{marker}').touch()"
    assert answers_match(attack, "1", backend="sympy") is False
    assert answers_match("9**9**9**9", "1", backend="sympy") is False  # a power tower is refused, not computed
    assert not marker.exists()


def test_reference_from_expected_answer_or_a_worked_solution():
    reward = resolve_reward("math_correct")
    assert reward("p", "It is 8.", {"expected_answer": 8}) == 1.0
    assert reward("p", r"\boxed{5}", {"answer": r"so the result is \boxed{5}"}) == 1.0
    assert reward("p", "#### 24", {"answer": "48/2 = 24\n#### 24"}) == 1.0


def test_missing_reference_raises_rather_than_scoring_zero():
    with pytest.raises(ConfigurationError, match=r"meta\['answer'\]"):
        resolve_reward("math_correct")("p", r"\boxed{1}", {"question": "x"})
    with pytest.raises(ConfigurationError, match=r"meta\['answer'\]"):
        resolve_reward("math_correct")("p", r"\boxed{1}")


def test_require_boxed():
    assert resolve_reward("math_correct")("p", "The answer is 5", {"answer": "5"}) == 1.0
    assert resolve_reward("math_correct", require_boxed=True)("p", "The answer is 5", {"answer": "5"}) == 0.0
    with pytest.raises(ConfigurationError, match="backend"):
        resolve_reward("math_correct", backend="wolfram")


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed")
def test_a_math_verify_timeout_raises_instead_of_scoring_zero():
    started = time.monotonic()
    with pytest.raises(RewardTimeoutError, match="timeout"):
        resolve_reward("math_correct", timeout_s=1)("p", r"\boxed{9^{9^{9}}}", {"answer": "5"})
    assert time.monotonic() - started < 10


def gsm8k_rows() -> list[dict]:
    path = DATA / "gsm8k" / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"GSM8K data not found at {path} (the shared data folder sits at ../shared/data)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_gsm8k_references_score_one_and_perturbed_answers_zero():
    rows = gsm8k_rows()
    assert len(rows) == 7473
    reward = resolve_reward("math_correct")
    started = time.monotonic()
    solution_ok = boxed_ok = perturbed_zero = 0
    for row in rows:
        final = row["answer"].rsplit("####", 1)[1].strip()
        meta = {"answer": final}
        solution_ok += reward(row["question"], row["answer"], meta) == 1.0
        boxed_ok += reward(row["question"], f"\\boxed{{{final}}}", meta) == 1.0
        wrong = int(final.replace(",", "")) + 1
        perturbed_zero += reward(row["question"], row["answer"].rsplit("####", 1)[0] + f"#### {wrong}", meta) == 0.0
    elapsed = time.monotonic() - started
    assert solution_ok >= 0.995 * len(rows), f"{solution_ok}/{len(rows)} reference solutions scored 1.0"
    assert boxed_ok >= 0.995 * len(rows), f"{boxed_ok}/{len(rows)} boxed answers scored 1.0"
    assert perturbed_zero >= 0.995 * len(rows), f"{perturbed_zero}/{len(rows)} perturbed answers scored 0.0"
    assert elapsed < 30, f"grading 3 x 7473 GSM8K responses took {elapsed:.1f} s"
