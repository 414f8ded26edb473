"""The built-in text rewards and the two ways to compose rewards.

What it is: rewards that read only the response text -- ``keyword_contains``, ``length_penalty``,
``format_compliance``, and the RPN-arithmetic ``rpn_format``/``rpn_correct``/``rpn_combined`` (the Simplexity
format ``... = <answer> <eoe>``) -- plus ``combine`` (a weighted sum) and ``format_correct`` (the problem
environments' ``correct + format_coef * (format - 1)``: 1 for a correct, well-formatted answer, ``-format_coef``
for a badly formatted wrong one). Every one is registered by name for :func:`resolve_reward`.

What it is not: math answer checking (``math``: ``boxed_answer``, ``math_correct``) or code execution
(``code``: ``code_tests``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards.registry import CompositeReward, Reward, RewardFn, register_reward, resolve_reward


def _string_list(owner: str, field: str, value: Any) -> list[str]:
    if isinstance(value, str):
        raise ConfigurationError(f"{owner}({field}={value!r:.80}): give a list of strings, e.g. {field}=[{value!r}]")
    if not isinstance(value, Sequence) or not value:
        raise ConfigurationError(f"{owner}({field}={value!r:.80}): give a non-empty list of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ConfigurationError(f"{owner}({field}[{i}]={item!r}): each entry must be a non-empty string")
    return list(value)


@register_reward("keyword_contains")
class KeywordContains(Reward):
    """The fraction of ``keywords`` that occur in the response (1.0: all of them, 0.0: none).

    Matching is by substring, case-insensitive unless ``case_sensitive=True``.
    """

    name = "keyword_contains"

    def __init__(self, keywords: Sequence[str], case_sensitive: bool = False) -> None:
        self.keywords = _string_list("keyword_contains", "keywords", keywords)
        self.case_sensitive = case_sensitive

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        text = response if self.case_sensitive else response.lower()
        found = sum((k if self.case_sensitive else k.lower()) in text for k in self.keywords)
        return found / len(self.keywords)


@register_reward("length_penalty")
class LengthPenalty(Reward):
    """``max(floor, 1 - penalty_scale * |length - target_length|)``: 1.0 at the target length, less either side.

    ``unit`` is ``"words"`` (whitespace-separated, the default) or ``"chars"``.
    """

    name = "length_penalty"

    def __init__(self, target_length: int = 100, penalty_scale: float = 0.01, unit: str = "words",
                 floor: float = 0.0) -> None:
        if not isinstance(target_length, int) or isinstance(target_length, bool) or target_length < 0:
            raise ConfigurationError(f"length_penalty(target_length={target_length!r}): must be an int >= 0")
        if not isinstance(penalty_scale, (int, float)) or penalty_scale < 0:
            raise ConfigurationError(f"length_penalty(penalty_scale={penalty_scale!r}): must be a number >= 0")
        if unit not in ("words", "chars"):
            raise ConfigurationError(f"length_penalty(unit={unit!r}): must be 'words' or 'chars'")
        self.target_length, self.penalty_scale, self.unit, self.floor = target_length, penalty_scale, unit, floor

    def length(self, response: str) -> int:
        """The response's length in ``unit``."""
        return len(response.split()) if self.unit == "words" else len(response)

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        return max(self.floor, 1.0 - self.penalty_scale * abs(self.length(response) - self.target_length))


@register_reward("format_compliance")
class FormatCompliance(Reward):
    """The fraction of regular expressions in ``patterns`` found in the response (``re.search``).

    Patterns are compiled with ``re.MULTILINE`` by default, so ``^`` and ``$`` match at line starts and ends
    (``r"^\\d+\\."`` finds a numbered line anywhere). Pass ``flags=0`` for whole-text anchors.
    """

    name = "format_compliance"

    def __init__(self, patterns: Sequence[str], flags: int = re.MULTILINE) -> None:
        self.patterns = _string_list("format_compliance", "patterns", patterns)
        self.compiled = []
        for i, pattern in enumerate(self.patterns):
            try:
                self.compiled.append(re.compile(pattern, flags))
            except re.error as exc:
                raise ConfigurationError(f"format_compliance(patterns[{i}]={pattern!r}) is not a valid regular "
                                         f"expression: {exc}") from None

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        return sum(p.search(response) is not None for p in self.compiled) / len(self.compiled)


# -- RPN arithmetic (Simplexity): the answer ends "= <value> <eoe>" -------------------------------------------------
_EOE = re.compile(r"=\s*([+-]?\d+)\s*<eoe>")


def eoe_answer(response: str) -> int | None:
    """The value of the last ``= <integer> <eoe>`` in ``response``, or None when there is none."""
    matches = _EOE.findall(response)
    return int(matches[-1]) if matches else None


def reference_answer(meta: Mapping[str, Any] | None, reward: str) -> Any:
    """``meta["answer"]`` (or ``meta["expected_answer"]``); raises naming the reward when neither is there."""
    if meta:
        for key in ("answer", "expected_answer"):
            if meta.get(key) is not None:
                return meta[key]
    raise ConfigurationError(f"reward {reward!r} needs the reference answer in meta['answer'] (or "
                             f"meta['expected_answer']); got meta keys {sorted(meta or {})}. Pass "
                             "problem.reward_meta() or {'answer': ...} as meta")


@register_reward("rpn_format")
class RpnFormat(Reward):
    """1.0 when the response gives an answer in the form ``= <integer> <eoe>``, else 0.0."""

    name = "rpn_format"

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        return float(eoe_answer(response) is not None)


@register_reward("rpn_correct")
class RpnCorrect(Reward):
    """1.0 when the last ``= <integer> <eoe>`` equals ``meta["answer"]``, else 0.0."""

    name = "rpn_correct"

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        expected = reference_answer(meta, self.name)
        try:
            expected = int(str(expected).strip())
        except ValueError:
            raise ConfigurationError(f"rpn_correct: meta['answer']={expected!r} is not an integer") from None
        return float(eoe_answer(response) == expected)


# -- composition ------------------------------------------------------------------------------------------------------
class WeightedSum(CompositeReward):
    """``sum(weight * reward)`` over named parts; built by :func:`combine`."""

    def __init__(self, rewards: Mapping[Any, float], name: str = "combined") -> None:
        if not isinstance(rewards, Mapping) or not rewards:
            raise ConfigurationError(f"combine(rewards={rewards!r:.80}): give a non-empty mapping "
                                     "{reward: weight}, e.g. {'math_correct': 1.0, 'boxed_answer': 0.1}")
        self.name = name
        self._parts: dict[str, Reward] = {}
        self.weights: dict[str, float] = {}
        for key, weight in rewards.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool):
                raise ConfigurationError(f"combine: the weight of {key!r} is {weight!r}; weights are numbers")
            reward = resolve_reward(key)
            label, n = reward.name, 2
            while label in self._parts:
                label, n = f"{reward.name}#{n}", n + 1
            self._parts[label], self.weights[label] = reward, float(weight)

    def parts(self) -> dict[str, Reward]:
        return dict(self._parts)

    def merge(self, values: Mapping[str, float]) -> float:
        return sum(self.weights[label] * values[label] for label in self._parts)


class FormatCorrect(CompositeReward):
    """``correct + format_coef * (format - 1)``, with parts named ``format`` and ``correct``.

    With 0/1 parts and ``format_coef=0.1``: 1.0 correct and well formatted, 0.9 correct but badly formatted,
    0.0 wrong but well formatted, -0.1 neither (the tinker-cookbook GSM8K reward).
    """

    def __init__(self, format: Any = "boxed_answer", correct: Any = "math_correct",
                 format_coef: float = 0.1, name: str = "format_correct") -> None:
        if not isinstance(format_coef, (int, float)) or format_coef < 0:
            raise ConfigurationError(f"format_correct(format_coef={format_coef!r}): must be a number >= 0")
        self.name, self.format_coef = name, float(format_coef)
        self._parts = {"format": resolve_reward(format), "correct": resolve_reward(correct)}

    def parts(self) -> dict[str, Reward]:
        return dict(self._parts)

    def merge(self, values: Mapping[str, float]) -> float:
        return values["correct"] + self.format_coef * (values["format"] - 1.0)


@register_reward("combine", factory=True)
def combine(rewards: Mapping[Reward | RewardFn | str, float], name: str = "combined") -> WeightedSum:
    """A weighted sum of rewards: ``combine({"math_correct": 1.0, resolve_reward("length_penalty"): 0.1})``.

    Keys are reward names, :class:`Reward` objects or plain reward functions; a failed part fails the item.
    """
    return WeightedSum(rewards, name=name)


@register_reward("format_correct", factory=True)
def format_correct(format: Any = "boxed_answer", correct: Any = "math_correct",
                   format_coef: float = 0.1) -> FormatCorrect:
    """``correct + format_coef * (format - 1)``; see :class:`FormatCorrect`."""
    return FormatCorrect(format=format, correct=correct, format_coef=format_coef)


@register_reward("rpn_combined", factory=True)
def rpn_combined(boxed_weight: float = 0.2, correct_weight: float = 0.8) -> WeightedSum:
    """Simplexity's combined RPN reward: ``boxed_weight * rpn_format + correct_weight * rpn_correct``."""
    return WeightedSum({RpnFormat(): boxed_weight, RpnCorrect(): correct_weight}, name="rpn_combined")
