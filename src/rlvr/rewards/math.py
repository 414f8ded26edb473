"""Math answer checking: find the final answer in a response and decide whether it equals the reference.

What it is: :func:`extract_answer` (the last ``\\boxed{...}``, else a GSM8K ``#### x`` line, else
"the answer is x", else the last number), :func:`answers_match`, and the rewards ``boxed_answer`` (format:
a ``\\boxed{}`` is present) and ``math_correct`` (1.0 when the answer equals ``meta["answer"]``, else 0.0).

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


_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*[:=]?\s*\$?\s*(\\?\$?\s*[+-]?[\d,]*\.?\d+(?:\s*/\s*\d+)?)", re.I)
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[+-]?\.\d+")


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the last non-empty ``\\boxed{}``, else the last ``#### x``, else the last
    "answer is x", else the last number; None when there is none."""
    boxed = [b for b in find_boxed(text) if b.strip()]
    if boxed:
        return boxed[-1].strip()
    for pattern in (_HASHES, _ANSWER_IS):
        matches = pattern.findall(text)
        if matches and matches[-1].strip():
            return matches[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


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
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
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


def answers_match(pred: str, ref: str, backend: str = "auto", timeout_s: float | None = 5.0) -> bool:
    """Whether the answer ``pred`` equals the reference ``ref`` (both final answers, not whole responses)."""
    if backend not in BACKENDS:
        raise ConfigurationError(f"answers_match(backend={backend!r}): must be one of {BACKENDS}")
    p, r = normalize_answer(pred), normalize_answer(ref)
    if not p:
        return False
    if p == r:
        return True
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

    ``require_boxed=True`` reads only a ``\\boxed{}`` answer (else :func:`extract_answer`'s fallbacks apply);
    ``backend`` is ``"auto"`` (math-verify when installed, with the sympy fallback), ``"math_verify"`` or
    ``"sympy"``; ``timeout_s`` bounds math-verify in the main thread (see the module docstring).
    A reference that is itself a worked solution (it contains ``\\boxed{}`` or ``####``) is reduced to its answer.
    """

    name = "math_correct"

    def __init__(self, backend: str = "auto", timeout_s: float | None = 5.0, require_boxed: bool = False) -> None:
        if backend not in BACKENDS:
            raise ConfigurationError(f"math_correct(backend={backend!r}): must be one of {BACKENDS}")
        self.backend, self.timeout_s, self.require_boxed = backend, timeout_s, require_boxed

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        reference = str(reference_answer(meta, self.name))
        if "\\boxed" in reference or "####" in reference:
            reference = extract_answer(reference) or reference
        if self.require_boxed:
            boxed = [b for b in find_boxed(response) if b.strip()]
            answer = boxed[-1] if boxed else None
        else:
            answer = extract_answer(response)
        if answer is None:
            return 0.0
        return float(answers_match(answer, reference, self.backend, self.timeout_s))
