"""Procedural arithmetic with difficulty levels, for curricula: from ``3 + 4`` to multi-step word problems.

What it is: :class:`ArithmeticSource`, which generates problems deterministically from a seed -- the same seed
gives the same problems on every machine, and no test question appears in train -- across the levels of
:data:`LEVELS` (more digits, more operators, more operands with parentheses, then word problems of two or three
steps). Each problem's ``difficulty`` is its level, so ``problems("train", max_difficulty=2)`` is the easy end of a
curriculum. Answers are integers (divisions are exact); the default reward is ``format_correct`` over
``boxed_answer`` and ``math_correct``, and the prompt asks for ``\\boxed{}``.

What it is not: RPN expressions (``rpn``) or a data set read from disk (``gsm8k``, ``files``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.tasks.base import Problem, ProblemSource


@dataclass(frozen=True)
class ArithmeticLevel:
    """How one difficulty level's problems are drawn."""

    digits: int
    """Operands have at most this many digits."""

    operators: str
    """The operators drawn from, a subset of ``+-*/``."""

    operands: int
    """Numbers per expression (2: one operation); word problems ignore it."""

    negative: bool = False
    """Whether the answer may be negative."""

    word_problem: bool = False
    """A multi-step word problem instead of an expression."""


#: Difficulty levels, easiest first.
LEVELS: dict[int, ArithmeticLevel] = {
    1: ArithmeticLevel(digits=1, operators="+-", operands=2),
    2: ArithmeticLevel(digits=2, operators="+-", operands=2),
    3: ArithmeticLevel(digits=2, operators="+-*", operands=2),
    4: ArithmeticLevel(digits=2, operators="+-*/", operands=3),
    5: ArithmeticLevel(digits=3, operators="+-*/", operands=4, negative=True),
    6: ArithmeticLevel(digits=2, operators="+-*/", operands=0, word_problem=True),
}

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "": 3}
_SYMBOL = {"+": "+", "-": "-", "*": "*", "/": "/"}


def _expression(rng: random.Random, n: int, level: ArithmeticLevel) -> tuple[str, Fraction, str]:
    """A random expression of ``n`` operands: (text, value, top operator or "" for a number)."""
    top = 10 ** level.digits - 1
    if n == 1:
        value = rng.randint(0, top)
        return str(value), Fraction(value), ""
    op = rng.choice(level.operators)
    k = rng.randint(1, n - 1)
    (lt, lv, lop), (rt, rv, rop) = _expression(rng, k, level), _expression(rng, n - k, level)
    if op == "/" and lop == "" and rop == "":  # make a leaf division exact
        divisor = rng.randint(2, max(2, min(top, 12)))
        lv, rv = Fraction(divisor * rng.randint(0, max(1, top // divisor))), Fraction(divisor)
        lt, rt = str(lv), str(rv)
    if op == "-" and not level.negative and lv < rv and lop == "" and rop == "":
        (lt, lv), (rt, rv) = (rt, rv), (lt, lv)
    if _PRECEDENCE[lop] < _PRECEDENCE[op]:
        lt = f"({lt})"
    if _PRECEDENCE[rop] < _PRECEDENCE[op] or (_PRECEDENCE[rop] == _PRECEDENCE[op] and op in "-/"):
        rt = f"({rt})"
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv}[op] if op != "/" else lv / rv  # may raise ZeroDivisionError
    return f"{lt} {_SYMBOL[op]} {rt}", value, op


# -- word problems: each returns (question, answer, worked solution) -------------------------------------------------
_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kemi", "Liam")
_THINGS = ("stickers", "marbles", "cards", "stamps", "shells", "beads")


def _shopping(rng: random.Random) -> tuple[str, int, str]:
    name, n, price = rng.choice(_NAMES), rng.randint(2, 9), rng.randint(2, 15)
    bill = next(b for b in (20, 50, 100, 200) if b >= n * price)
    return (f"{name} buys {n} notebooks at ${price} each and pays with a ${bill} bill. How much change, in "
            f"dollars, does {name} get?", bill - n * price,
            f"The notebooks cost {n} * {price} = {n * price} dollars. The change is {bill} - {n * price} = "
            f"{bill - n * price} dollars.")


def _collection(rng: random.Random) -> tuple[str, int, str]:
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b, c = rng.randint(5, 60), rng.randint(2, 6), rng.randint(3, 12)
    d = rng.randint(1, a + b * c - 1)
    total = a + b * c
    return (f"{name} has {a} {thing}. {name} buys {b} packs of {c} {thing} each, then gives {d} {thing} to a "
            f"friend. How many {thing} does {name} have now?", total - d,
            f"The packs hold {b} * {c} = {b * c} {thing}, so {name} has {a} + {b * c} = {total}. After giving "
            f"{d} away, {total} - {d} = {total - d} are left.")


def _reading(rng: random.Random) -> tuple[str, int, str]:
    name, a, days = rng.choice(_NAMES), rng.randint(5, 40), rng.randint(2, 9)
    total = a * days + rng.randint(1, 200)
    return (f"A book has {total} pages. {name} reads {a} pages a day for {days} days. How many pages are left "
            "to read?", total - a * days,
            f"{name} reads {a} * {days} = {a * days} pages, so {total} - {a * days} = {total - a * days} remain.")


def _sharing(rng: random.Random) -> tuple[str, int, str]:
    name, friends, each_tray = rng.choice(_NAMES), rng.randint(2, 8), rng.randint(6, 24)
    trays = friends * rng.randint(1, 4)
    cookies = trays * each_tray
    while cookies % friends:
        cookies += each_tray
        trays += 1
    return (f"{name} bakes {trays} trays of {each_tray} cookies and shares them equally among {friends} "
            "friends. How many cookies does each friend get?", cookies // friends,
            f"There are {trays} * {each_tray} = {cookies} cookies; {cookies} / {friends} = {cookies // friends} "
            "each.")


def _saving(rng: random.Random) -> tuple[str, int, str]:
    name, spend = rng.choice(_NAMES), rng.randint(5, 40)
    earn, weeks = spend + rng.randint(5, 30), rng.randint(2, 12)
    goal = (earn - spend) * weeks
    return (f"{name} earns ${earn} a week and spends ${spend} of it. How many weeks does it take {name} to save "
            f"${goal}?", weeks,
            f"{name} saves {earn} - {spend} = {earn - spend} dollars a week, so {goal} / {earn - spend} = {weeks} "
            "weeks.")


WORD_PROBLEMS: tuple[Callable[[random.Random], tuple[str, int, str]], ...] = (
    _shopping, _collection, _reading, _sharing, _saving)


def generate(level: int, rng: random.Random) -> tuple[str, int, str]:
    """One problem of ``level`` drawn with ``rng``: (question, integer answer, worked solution)."""
    spec = LEVELS[level]
    if spec.word_problem:
        return rng.choice(WORD_PROBLEMS)(rng)
    limit = 10 ** (2 * spec.digits + 2)
    for _ in range(1000):
        try:
            text, value, _ = _expression(rng, spec.operands, spec)
        except ZeroDivisionError:
            continue
        if value.denominator == 1 and abs(value) < limit and (spec.negative or value >= 0):
            return f"What is {text}?", int(value), f"{text} = {int(value)}."
    raise ConfigurationError(f"arithmetic level {level} ({spec}) yields no integer problem; check LEVELS")


class ArithmeticSource(ProblemSource):
    """Generated arithmetic problems over ``levels`` (keys of :data:`LEVELS`), spread evenly across them.

    Args:
        levels: the difficulty levels to draw from.
        num_train, num_test: problems per split; test questions never appear in train.
        seed: the same seed gives the same problems.
        Other keyword arguments: see :class:`ProblemSource`.
    """

    name = "arithmetic"
    default_instruction = "Put your final answer in \\boxed{}."

    def __init__(self, levels: Sequence[int] = (1, 2, 3), *, num_train: int = 1000, num_test: int = 200,
                 seed: int = 0, **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        unknown = [lv for lv in levels if lv not in LEVELS]
        if not levels or unknown:
            raise ConfigurationError(f"ArithmeticSource(levels={list(levels)!r}): levels must be a non-empty list "
                                     f"drawn from {sorted(LEVELS)}")
        for field, value in (("num_train", num_train), ("num_test", num_test)):
            if not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"ArithmeticSource({field}={value!r}): must be an int >= 0")
        self.levels, self.sizes = tuple(levels), {"train": num_train, "test": num_test}

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def load(self, split: str) -> list[Problem]:
        excluded = {p.question for p in self.problems("test")} if split == "train" else set()
        seen: set[str] = set()
        out: list[Problem] = []
        attempts = 0
        while len(out) < self.sizes[split]:
            attempts += 1
            if attempts > 50 * self.sizes[split] + 1000:
                raise ConfigurationError(f"ArithmeticSource: levels {self.levels} have too few distinct problems "
                                         f"for {self.sizes[split]} {split} problems; add harder levels or ask fewer")
            level = self.levels[len(out) % len(self.levels)]
            rng = random.Random(f"{self.name}:{self.seed}:{split}:{len(out)}:{attempts}")
            question, answer, worked = generate(level, rng)
            if question in excluded or (split == "test" and question in seen):
                continue
            seen.add(question)
            out.append(Problem(id=f"{self.name}/{split}/{len(out)}", question=question, answer=str(answer),
                               solution=f"{worked}\n\\boxed{{{answer}}}", difficulty=float(level),
                               meta={"level": level}))
        return out
