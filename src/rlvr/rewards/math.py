"""Math answer checking: find the final answer in a response and decide whether it equals the reference.

What it is: :func:`extract_answer` (the answer a response states in one of :data:`FORMS`: the last
``\\boxed{...}``, a final-answer line such as GSM8K's ``#### x`` or "the answer is x", or the whole reply; never a
number picked out of prose), :func:`answers_match`, and the rewards ``boxed_answer`` (format: a ``\\boxed{}`` is
present) and ``math_correct`` (1.0 when the stated answer equals ``meta["answer"]``, else 0.0).

Invariant: a response is credited only for an answer it states; an answer that hedges (``3 or 4``), scales
(``4 thousand``), sits in a wrong equation (``2 + 3 = 4``) or among prose the reference lacks never matches.

How answers are compared, cheapest first:
    1. equal strings after normalisation (``$``, ``\\%``, spacing, ``\\dfrac``, thousands separators: ``1,000``
       is ``1000`` but ``1,2`` stays a pair);
    2. a fast path when both sides are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``): exact
       rational comparison, no parser -- so ``0.5``, ``1/2`` and ``\\frac{1}{2}`` agree, and GSM8K's
       7473 references grade in well under a second;
    3. ``math-verify`` (LaTeX and expressions through sympy: ``\\sqrt{2}/2`` vs ``\\frac{\\sqrt 2}{2}``, sets,
       intervals); 4. where math-verify is not installed or cannot parse the reference, a small sympy fallback
       that accepts only arithmetic, a few functions and one-letter symbols (sympy's parser evaluates code, so
       nothing else from a response reaches it).

Time: math-verify's own SIGALRM timeouts are used only in the main thread (they cannot work elsewhere), and a
check that runs into them raises :class:`RewardTimeoutError` rather than scoring 0. Anything can still be slow
(``9^{9^{9^9}}``): the training loop scores through :func:`rlvr.rewards.score_batch`, which kills a call at its
timeout. What it is not: a grader of free-form proofs or of answers that are not given as a final value.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from rlvr.errors import ConfigurationError, RewardTimeoutError
from rlvr.rewards.builtin import reference_answer
from rlvr.rewards.registry import Reward, register_reward

BACKENDS = ("auto", "math_verify", "sympy")


def find_boxed(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (braces balanced), in order;
    ``\\boxed 5`` (no braces) counts too."""
    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])", text):
        rest = text[match.end():]
        stripped = rest.lstrip()
        if not stripped.startswith("{"):
            token = re.match(r"\s+([^\s${}]+)", rest)
            if token:
                found.append(token.group(1))
            continue
        start = match.end() + len(rest) - len(stripped) + 1
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start:i])
                break
    return found


FORMS = ("auto", "boxed", "final_line", "whole")
"""Where a response states its final answer (:func:`extract_answer`): ``boxed``, the last non-empty ``\\boxed{}``;
``final_line``, the last explicit final-answer statement (a GSM8K ``#### x`` line, "the answer is x",
"Final answer: x"); ``whole``, the whole reply is the answer; ``auto``, the first of those three that the response
has. No form takes "the last number in the text": a response that names the answer among other numbers has not
stated it."""

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# "The answer is x", "Final answer: x", "answer = x": the statement runs to the end of its sentence or line (a period,
# comma, semicolon or mark followed by a space or the end; "3.5" and "1,000" stay whole).
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b|:|=)\s*[:=]?[ \t]*(.*?)[ \t]*(?=[.,;!?]?[ \t]*(?:\n|$)|[.,;!?][ \t])",
                        re.I)


def _final_line(text: str) -> str | None:
    """The answer of the last ``#### x`` line or "answer is x" statement in ``text``, whichever comes later."""
    found = [(m.start(), m.group(1)) for pattern in (_HASHES, _ANSWER_IS) for m in pattern.finditer(text)]
    found = [(start, answer.strip()) for start, answer in found if answer.strip()]
    return max(found)[1] if found else None


WHOLE_MAX_CHARS = 200
"""A reply longer than this is not an answer stated as the whole reply (``whole`` finds none in it)."""


def _whole(text: str) -> str | None:
    """The whole reply as its answer, stripped of surrounding space and one final period; None when empty or longer
    than :data:`WHOLE_MAX_CHARS`."""
    answer = text.strip()
    answer = answer[:-1].rstrip() if answer.endswith(".") and not answer.endswith("..") else answer
    return answer if answer and len(answer) <= WHOLE_MAX_CHARS else None


def extract_answer(text: str, form: str = "auto") -> str | None:
    """The final answer ``text`` states in ``form`` (see :data:`FORMS`); None when it states none there."""
    if form not in FORMS:
        raise ConfigurationError(f"answer form {form!r}: must be one of {FORMS}")
    if form in ("auto", "boxed"):
        boxed = [b for b in find_boxed(text) if b.strip()]
        if boxed:
            return boxed[-1].strip()
    if form in ("auto", "final_line"):
        stated = _final_line(text)
        if stated is not None:
            return stated
    if form in ("auto", "whole"):
        return _whole(text)
    return None


_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_REMOVE = ("\\!", "\\,", "\\;", "\\:", "\\ ", "\\left", "\\right", "\\$", "$", "^{\\circ}", "^\\circ", "\\%", "%",
           "\\displaystyle")


def normalize_answer(answer: str) -> str:
    """``answer`` without maths-mode wrappers, ``$``/``%``/degree signs, spacing commands and a final period;
    ``\\dfrac``/``\\tfrac`` as ``\\frac``; ``1,000`` as ``1000``."""
    text = str(answer).strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(left) and text.endswith(right):
            text = text[len(left):-len(right)]
    boxed = find_boxed(text)
    if len(boxed) == 1 and re.fullmatch(r"\\(?:boxed|fbox)\s*\{.*\}", text.strip(), re.S):
        text = boxed[0]
    for token in _REMOVE:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\u2212", "-")
    text = re.sub(r"\s+", " ", text).strip().rstrip(".").strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


_PLAIN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?")
_RATIO = re.compile(r"([+-]?)\s*(?:(\d+)\s*/\s*(\d+)|\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|\\frac(\d)(\d))")


def as_number(answer: str) -> Fraction | None:
    """A normalised answer as an exact rational when it is a plain number (``-3``, ``2.50``, ``7/4``,
    ``\\frac{7}{4}``, ``-\\frac{1}{2}``), else None."""
    text = answer.replace(" ", "")
    try:
        if _PLAIN.fullmatch(text):
            return Fraction(text)
        match = _RATIO.fullmatch(text)
        if match:
            sign, *parts = match.groups()
            numerator, denominator = (int(p) for p in parts if p is not None)
            if denominator == 0:
                return None
            return Fraction(-numerator if sign == "-" else numerator, denominator)
    except (ValueError, ZeroDivisionError):  # e.g. more digits than int() converts
        return None
    return None


# -- the sympy fallback ---------------------------------------------------------------------------------------------
_ALLOWED_NAMES = {"sqrt", "pi", "E", "I", "oo", "sin", "cos", "tan", "log", "ln", "exp"}
_SAFE = re.compile(r"[0-9A-Za-z+\-*/().,\s]*")


def _latex_to_sympy_text(text: str) -> str:
    out = text
    for _ in range(8):  # nested fractions and roots, innermost first
        new = re.sub(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"((\1)/(\2))", out)
        new = re.sub(r"\\sqrt\s*\[([^\[\]{}]*)\]\s*\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
        new = re.sub(r"\\sqrt\s*\{([^{}]*)\}", r"sqrt(\1)", new)
        new = re.sub(r"\\sqrt\s*(\d+|[A-Za-z])", r"sqrt(\1)", new)
        if new == out:
            break
        out = new
    for latex, plain in (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("\\pi", "pi"), ("\\infty", "oo"),
                         ("\\ln", "ln"), ("\\log", "log"), ("\\sin", "sin"), ("\\cos", "cos"), ("\\tan", "tan"),
                         ("\\exp", "exp"), ("^", "**"), ("{", "("), ("}", ")")):
        out = out.replace(latex, plain)
    return out


def _sympy_value(text: str) -> Any:
    from sympy import Symbol
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    source = _latex_to_sympy_text(text)
    names = set(re.findall(r"[A-Za-z_]\w*", source))
    if not _SAFE.fullmatch(source) or any(n not in _ALLOWED_NAMES and len(n) > 1 for n in names):
        return None
    if any(re.search(p, source) for p in (r"\*\*\s*\([^()]*\*\*", r"\*\*\s*\w+\s*\*\*", r"\*\*\s*\(?\s*\d{4,}")):
        return None  # refuse power towers rather than hang on them
    local = {n: Symbol(n) for n in names if n not in _ALLOWED_NAMES}
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    try:
        return parse_expr(source, local_dict=local, transformations=transformations)
    except Exception:  # a response that is not an expression: no value
        return None


def _sympy_equal(pred: str, ref: str) -> bool | None:
    from sympy import Basic, simplify

    gold, guess = _sympy_value(ref), _sympy_value(pred)
    if gold is None:
        return None
    if guess is None:
        return False
    if isinstance(gold, tuple) or isinstance(guess, tuple):
        if not (isinstance(gold, tuple) and isinstance(guess, tuple) and len(gold) == len(guess)):
            return False
        return all(_sympy_equal(str(p), str(g)) for p, g in zip(guess, gold, strict=True))
    if not (isinstance(gold, Basic) and isinstance(guess, Basic)):
        return gold == guess
    try:
        difference = simplify(gold - guess)
        if difference == 0:
            return True
        value = complex(difference.evalf())
        return abs(value) <= 1e-9 * max(1.0, abs(complex(gold.evalf())))
    except (TypeError, ValueError, AttributeError):
        return False


def _math_verify_equal(pred: str, ref: str, timeout_s: float | None) -> bool | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    in_main = threading.current_thread() is threading.main_thread()
    seconds = max(1, round(timeout_s)) if (timeout_s and in_main) else None
    started = time.monotonic()
    gold = parse(f"${ref}$", parsing_timeout=seconds)
    result: bool | None = None
    if gold:
        guess = parse(f"${pred}$", parsing_timeout=seconds)
        result = bool(guess) and verify(gold, guess, timeout_seconds=seconds)
    if seconds is not None and time.monotonic() - started >= seconds * 0.98:
        raise RewardTimeoutError(f"math-verify ran into its {seconds} s timeout comparing {pred!r:.200} with the "
                                 f"reference {ref!r:.200}; the item is not scored")
    return result


# -- what a stated answer may carry besides its value ------------------------------------------------------------------
_FUNCTIONS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "sqrt", "pi", "inf", "infty", "oo", "mod",
              "deg", "arcsin", "arccos", "arctan"}
_CHANGES_VALUE = {"or", "and", "not", "no", "nor", "plus", "minus", "times", "over", "divided", "by", "to", "than",
                  "less", "more", "thousand", "thousands", "million", "millions", "billion", "billions", "trillion",
                  "hundred", "hundreds", "dozen", "dozens", "score", "squared", "cubed", "half", "halves", "quarter",
                  "quarters", "third", "thirds", "percentile", "per", "ish", "approximately", "about", "around"}
"""Words after a number that change its value or hedge it (``4 thousand``, ``3 or 4``): never taken as a unit."""
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_TEXT = r"\\(?:text|mbox|mathrm)\s*\{([^{}]*)\}"
_UNIT_TAIL = re.compile(rf"(?P<value>.*?[\d}}])\s*(?P<unit>(?:{_TEXT}|[A-Za-z]+\.?|/|\s)++)")
_NOT_MATH = re.compile(r"[#?;@~\"`]")
"""Characters no stated value holds: an answer with them is text around an answer (``#### 4`` as a whole reply)."""
_VARIABLE = re.compile(r"\s*(?:[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*")


def _words(answer: str) -> set[str]:
    """The prose words of ``answer``: runs of two or more letters that are not LaTeX commands or function names."""
    return {w.lower() for w in _WORD.findall(answer)} - _FUNCTIONS


def _without_units(answer: str) -> str | None:
    """``answer`` without a unit after its value (``4 apples``, ``12 \\text{ cm}``, ``3 km/h``); None when the
    words after the value change it (``4 thousand``, ``3 or 4``)."""
    match = _UNIT_TAIL.fullmatch(answer) if len(answer) <= WHOLE_MAX_CHARS else None
    if not match or (not re.search(_TEXT, match.group("unit")) and all(
            len(w) == 1 for w in re.findall(r"[A-Za-z]+", match.group("unit")))):
        return answer  # no unit, or only one-letter names outside \text{} (``2x``: a variable, not a unit)
    if {w.lower() for w in re.findall(r"[A-Za-z]+", re.sub(_TEXT, r" \1 ", match.group("unit")))} & (
            _CHANGES_VALUE | _FUNCTIONS):
        return None
    return match.group("value").strip()


def _equation_value(answer: str, backend: str, timeout_s: float | None) -> str | None:
    """The value an equation states (``x = 4`` is 4; ``2 + 2 = 4`` is 4 because both sides agree), or None when its
    sides disagree (``2 + 3 = 4`` states nothing true). An answer without ``=`` is itself."""
    sides = answer.split("=")
    if len(sides) == 1:
        return answer
    if _VARIABLE.fullmatch(sides[0]):
        sides = sides[1:]
    if any(not side.strip() for side in sides):
        return None
    for left, right in itertools.pairwise(sides):
        if not answers_match(left, right, backend, timeout_s):
            return None
    return sides[-1].strip()


def answers_match(pred: str, ref: str, backend: str = "auto", timeout_s: float | None = 5.0) -> bool:
    """Whether the answer ``pred`` equals the reference ``ref`` (both final answers, not whole responses).

    Beyond equal forms of one value, ``pred`` may carry a unit the reference leaves out (``4 apples`` for ``4``) and
    may be an equation whose sides all agree (``x = 4``, ``2 + 2 = 4``). It never matches when it hedges or scales
    the value (``3 or 4``, ``4 thousand``), names a wrong equation (``2 + 3 = 4``), or carries prose the reference
    does not (``I think 4``)."""
    if backend not in BACKENDS:
        raise ConfigurationError(f"answers_match(backend={backend!r}): must be one of {BACKENDS}")
    p, r = normalize_answer(pred), normalize_answer(ref)
    if not p:
        return False
    if p == r:
        return True
    if "=" in p and "=" not in r:
        value = _equation_value(p, backend, timeout_s)
        if value is None:
            return False
        p = normalize_answer(value)
        if p == r:
            return True
    if not _words(r):
        value = _without_units(p)
        if value is None:
            return False
        p = value
    if _words(p) - _words(r) or _NOT_MATH.search(p):
        return False
    p_num, r_num = as_number(p), as_number(r)
    if p_num is not None and r_num is not None:
        return p_num == r_num
    result = None if backend == "sympy" else _math_verify_equal(p, r, timeout_s)
    if result is None and backend == "math_verify":
        from importlib.util import find_spec

        if find_spec("math_verify") is None:
            raise ConfigurationError("math_correct(backend='math_verify') needs the math-verify package: "
                                     "pip install math-verify (or use backend='auto')")
    if result is None:
        result = _sympy_equal(p, r)
    return bool(result)


@register_reward("boxed_answer")
class BoxedAnswer(Reward):
    """1.0 when the response contains a non-empty ``\\boxed{...}`` (format only; see ``math_correct``)."""

    name = "boxed_answer"

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        return float(any(b.strip() for b in find_boxed(response)))


@register_reward("math_correct")
class MathCorrect(Reward):
    """1.0 when the response's final answer equals the reference (``meta["answer"]`` or
    ``meta["expected_answer"]``), else 0.0. Raises when meta has no reference (a data bug, never a 0).

    ``answer_form`` says where the response must state its answer (:data:`FORMS`: ``"auto"``, the default, takes
    a ``\\boxed{}``, else an explicit final-answer line, else the whole reply; ``"boxed"``, ``"final_line"`` and
    ``"whole"`` take only that form); set it to what the prompt asks for. ``require_boxed=True`` is
    ``answer_form="boxed"``. ``backend`` is ``"auto"`` (math-verify when installed, with the sympy fallback),
    ``"math_verify"`` or ``"sympy"``; ``timeout_s`` bounds math-verify in the main thread (see the module docstring).
    A reference that is itself a worked solution (it contains ``\\boxed{}`` or ``####``) is reduced to its answer.
    """

    name = "math_correct"

    def __init__(self, backend: str = "auto", timeout_s: float | None = 5.0, require_boxed: bool = False,
                 answer_form: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ConfigurationError(f"math_correct(backend={backend!r}): must be one of {BACKENDS}")
        if answer_form not in FORMS:
            raise ConfigurationError(f"math_correct(answer_form={answer_form!r}): must be one of {FORMS} (where "
                                     "the prompt asks the model to state its final answer)")
        if require_boxed and answer_form not in ("auto", "boxed"):
            raise ConfigurationError(f"math_correct: require_boxed=True contradicts answer_form={answer_form!r}; "
                                     "set only answer_form")
        self.backend, self.timeout_s = backend, timeout_s
        self.answer_form = "boxed" if require_boxed else answer_form

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        reference = str(reference_answer(meta, self.name))
        if "\\boxed" in reference or "####" in reference:
            reference = extract_answer(reference) or reference
        answer = extract_answer(response, self.answer_form)
        if answer is None:
            return 0.0
        return float(answers_match(answer, reference, self.backend, self.timeout_s))
