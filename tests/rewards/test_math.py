"""The math grader: answer extraction in each stated form, equivalent forms, answers that must not be credited,
the sympy fallback, timeouts, and GSM8K's 7473 references."""

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
    ("The answer is 42. Then 7 more.", "42"),           # 'answer is' to the end of its sentence
    ("The answer is 3.5, I think", "3.5"),
    ("Final answer: 1,000.\nDone", "1,000"),
    ("The answer is 3. No, the answer is 4.", "4"),      # the last statement
    ("answer: 3\n#### 5", "5"),                         # whichever statement comes last
    ("  7. ", "7"),                                      # the whole reply, one final period dropped
    ("I get 3, then 5.5 in the end", "I get 3, then 5.5 in the end"),  # no stated form: the whole reply
    ("", None),
    ("x" * 201, None),                                   # too long to be an answer stated as the whole reply
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_in_one_form():
    text = "The answer is 5.\n\\boxed{6}"
    assert extract_answer(text, "boxed") == "6"
    assert extract_answer(text, "final_line") == "5"
    assert extract_answer(text, "whole") == text
    assert extract_answer("7", "boxed") is None and extract_answer("7", "final_line") is None
    with pytest.raises(ConfigurationError, match="answer form 'last_number'"):
        extract_answer("7", "last_number")


# Answers that name the reference without stating it, or state something else: each must score 0.0 (a grader that
# credits them can be gamed by a policy that writes several numbers). The control column: stated forms that score 1.0.
NOT_CREDITED = [
    ("I think 3, not 4", "4"),                           # both numbers, no statement
    ("The number 4 is the most difficult thing to say", "4"),  # the reference among words
    ("It is 8.", "8"),                                   # no stated form: prose is not an answer
    ("3, 4, 5", "4"),                                    # several numbers as the whole reply
    ("The answer is 3 or 4.", "4"),                      # a hedge
    (r"\boxed{3, 4}", "4"),
    (r"\boxed{3 \text{ or } 4}", "4"),
    ("The answer is 2 + 3 = 4.", "4"),                   # the right number inside a wrong equation
    (r"\boxed{2+3=4}", "4"),
    ("The answer is 4 + 1.", "4"),                       # the right number inside an expression of another value
    ("The answer is 4 thousand.", "4"),                  # a scale word is not a unit
    ("The answer is 4 dozen.", "4"),
    ("The answer is -4.", "4"),                          # negative numbers keep their sign
    (r"\boxed{-4}", "4"),
    ("The answer is 4.", "-4"),
    ("The answer is 1,000.", "100"),                     # thousands separators read whole
    (r"\boxed{1,000}", "1"),
    ("2x", "2"),                                         # a variable is not a unit
    ("The answer is 4 because 2 + 2 = 4.", "4"),          # the statement holds more than the answer
    ("4", "4 apples and 3 pears"),
    ("The answer is \\boxed{3}. I mean 4", "4"),         # the box is the statement
]
CREDITED = [
    ("4", "4"), ("4.", "4"), (" 4\n", "4"), ("The answer is 4.", "4"), ("Final answer: 4", "4"), ("#### 4", "4"),
    (r"\boxed{4}", "4"), (r"\boxed{3} is wrong, so \boxed{4}", "4"), ("The answer is 3. No, the answer is 4.", "4"),
    (r"\boxed{2+2=4}", "4"), (r"\boxed{x = 4}", "4"), ("3 + 4 = 7", "7"), ("The answer is 4 apples.", "4"),
    (r"\boxed{4 \text{ cm}}", "4"), ("The answer is 3 km/h.", "3"), ("4 dollars", "4"), ("$18", "18"),
    ("50%", "50"), ("The answer is $4$.", "4"), ("The answer is \u22124.", "-4"), ("-4", "-4"),
    (r"\boxed{-\frac{1}{2}}", "-0.5"), ("The answer is 1,000.", "1000"),
    ("The answer is 1,000, which is a lot.", "1000"),
    (r"\boxed{1,000,000}", "1000000"), ("The final answer is 12.5.", "12.5"),
    (r"\boxed{\text{Monday}}", r"\text{Monday}"), ("The answer is Monday.", "Monday"),
]


@pytest.mark.parametrize(("response", "reference"), NOT_CREDITED)
def test_answers_not_stated_or_wrong_score_zero(response, reference):
    assert resolve_reward("math_correct")("p", response, {"answer": reference}) == 0.0


@pytest.mark.parametrize(("response", "reference"), CREDITED)
def test_answers_stated_in_a_form_score_one(response, reference):
    assert resolve_reward("math_correct")("p", response, {"answer": reference}) == 1.0


@pytest.mark.parametrize(("form", "credited"), [
    ("whole", ["4", "4.", r"\boxed{4}"]),               # a reply that is only a box is still the whole reply
    ("final_line", ["The answer is 4.", "#### 4", "Final answer: 4"]),
    ("boxed", [r"\boxed{4}", r"so \boxed{4}."]),
])
def test_each_form_credits_only_its_own_statement(form, credited):
    reward = resolve_reward("math_correct", answer_form=form)
    every = ["4", "4.", "The answer is 4.", "#### 4", "Final answer: 4", r"\boxed{4}", r"so \boxed{4}."]
    assert [reward("p", text, {"answer": "4"}) for text in every] == [float(text in credited) for text in every]


def test_normalize_and_plain_numbers():
    assert normalize_answer(r"\$1,000.") == "1000"
    assert normalize_answer(r"\boxed{\dfrac{1}{2}}") == r"\frac{1}{2}"
    assert normalize_answer("1,2") == "1,2"  # a pair, not a thousands separator
    assert as_number("-7/4") == as_number(r"-\frac{7}{4}") == as_number("-1.75")
    assert as_number("x+1") is None and as_number("1/0") is None
    assert normalize_answer("\u22124") == "-4"  # a typeset minus sign


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
    assert reward("p", "It is 8.", {"expected_answer": 8}) == 0.0  # prose, not a stated answer
    assert reward("p", "The answer is 8.", {"expected_answer": 8}) == 1.0
    assert reward("p", r"\boxed{5}", {"answer": r"so the result is \boxed{5}"}) == 1.0
    assert reward("p", "#### 24", {"answer": "48/2 = 24\n#### 24"}) == 1.0


def test_missing_reference_raises_rather_than_scoring_zero():
    with pytest.raises(ConfigurationError, match=r"meta\['answer'\]"):
        resolve_reward("math_correct")("p", r"\boxed{1}", {"question": "x"})
    with pytest.raises(ConfigurationError, match=r"meta\['answer'\]"):
        resolve_reward("math_correct")("p", r"\boxed{1}")


def test_require_boxed_and_bad_settings():
    assert resolve_reward("math_correct")("p", "The answer is 5", {"answer": "5"}) == 1.0
    assert resolve_reward("math_correct", require_boxed=True)("p", "The answer is 5", {"answer": "5"}) == 0.0
    with pytest.raises(ConfigurationError, match="backend"):
        resolve_reward("math_correct", backend="wolfram")
    with pytest.raises(ConfigurationError, match=r"answer_form='last'.*one of"):
        resolve_reward("math_correct", answer_form="last")
    with pytest.raises(ConfigurationError, match="contradicts answer_form='whole'"):
        resolve_reward("math_correct", require_boxed=True, answer_form="whole")


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
