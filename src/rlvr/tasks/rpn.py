"""RPN arithmetic, as in the Simplexity RLVR setup: evaluate ``3 4 + 2 *`` and answer ``= 14 <eoe>``.

What it is: :class:`RpnSource`, expressions in reverse Polish notation generated deterministically from a seed,
with a complexity range (the number of operators, Simplexity's ``complexity_range``, e.g. ``(1, 3)``) that is
also each problem's ``difficulty``; optionally modular (``modulus=p``: every value taken mod ``p``, as in
Simplexity's modular arithmetic processes). The answer format is ``= <value> <eoe>``, checked by the rewards
``rpn_format`` (the "boxed" reward: the format is there), ``rpn_correct`` and ``rpn_combined``
(``boxed_weight * format + correct_weight * correct``, the default).

What it is not: infix arithmetic or word problems (``arithmetic``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards import Reward, resolve_reward
from rlvr.tasks.base import Problem, ProblemSource


def evaluate_rpn(tokens: Sequence[str], modulus: int | None = None) -> int:
    """The value of an RPN expression given as tokens (integers and ``+ - *``); raises ValueError if malformed."""
    stack: list[int] = []
    for token in tokens:
        if token in ("+", "-", "*"):
            if len(stack) < 2:
                raise ValueError(f"RPN expression {' '.join(tokens)!r}: {token!r} needs two operands")
            right, left = stack.pop(), stack.pop()
            value = left + right if token == "+" else left - right if token == "-" else left * right
            stack.append(value % modulus if modulus else value)
        else:
            stack.append(int(token) % modulus if modulus else int(token))
    if len(stack) != 1:
        raise ValueError(f"RPN expression {' '.join(tokens)!r} leaves {len(stack)} values on the stack, not 1")
    return stack[0]


def random_rpn(rng: random.Random, operators: int, max_operand: int, ops: str = "+-*") -> list[str]:
    """A random RPN expression with exactly ``operators`` operators (a random binary tree, in postfix order)."""
    if operators == 0:
        return [str(rng.randint(0, max_operand))]
    left = rng.randint(0, operators - 1)
    return [*random_rpn(rng, left, max_operand, ops), *random_rpn(rng, operators - 1 - left, max_operand, ops),
            rng.choice(ops)]


def worked_solution(tokens: Sequence[str], modulus: int | None = None) -> str:
    """A step-by-step stack evaluation ending in ``= <value> <eoe>`` (the few-shot demonstration)."""
    stack: list[int] = []
    steps = []
    for token in tokens:
        if token in ("+", "-", "*"):
            right, left = stack.pop(), stack.pop()
            value = evaluate_rpn([str(left), str(right), token], modulus)
            steps.append(f"{left} {token} {right} = {value}" + (f" (mod {modulus})" if modulus else ""))
            stack.append(value)
        else:
            stack.append(int(token) % modulus if modulus else int(token))
    return "\n".join([*steps, f"= {stack[0]} <eoe>"])


class RpnSource(ProblemSource):
    """Generated RPN problems.

    Args:
        complexity_range: (fewest, most) operators per expression, inclusive.
        max_operand: operands are drawn from ``0..max_operand``.
        operators: the operators used, a subset of ``+-*``.
        modulus: take every value mod this (Simplexity-style modular arithmetic); None for plain integers.
        num_train, num_test: problems per split; test expressions never appear in train.
        Other keyword arguments: see :class:`ProblemSource` (the default reward is ``rpn_combined``).
    """

    name = "rpn"
    default_instruction = "Evaluate it step by step if you like, and end your answer with `= <value> <eoe>`."

    def __init__(self, complexity_range: tuple[int, int] = (1, 3), *, max_operand: int = 9, operators: str = "+-*",
                 modulus: int | None = None, num_train: int = 1000, num_test: int = 200, seed: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        low, high = complexity_range
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
            raise ConfigurationError(f"RpnSource(complexity_range={complexity_range!r}): give (low, high) with "
                                     "1 <= low <= high operators")
        if not operators or set(operators) - set("+-*"):
            raise ConfigurationError(f"RpnSource(operators={operators!r}): use a non-empty subset of '+-*'")
        if modulus is not None and (not isinstance(modulus, int) or modulus < 2):
            raise ConfigurationError(f"RpnSource(modulus={modulus!r}): must be an int >= 2 or None")
        if not isinstance(max_operand, int) or max_operand < 1:
            raise ConfigurationError(f"RpnSource(max_operand={max_operand!r}): must be an int >= 1")
        self.complexity_range, self.max_operand, self.operators = (low, high), max_operand, operators
        self.modulus, self.sizes = modulus, {"train": num_train, "test": num_test}

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def default_reward(self) -> Reward:
        return resolve_reward("rpn_combined")

    def load(self, split: str) -> list[Problem]:
        excluded = {p.meta["expression"] for p in self.problems("test")} if split == "train" else set()
        seen: set[str] = set()
        out: list[Problem] = []
        attempts = 0
        low, high = self.complexity_range
        while len(out) < self.sizes[split]:
            attempts += 1
            if attempts > 50 * self.sizes[split] + 1000:
                raise ConfigurationError(f"RpnSource: too few distinct expressions for {self.sizes[split]} {split} "
                                         "problems; widen complexity_range or max_operand, or ask fewer")
            rng = random.Random(f"{self.name}:{self.seed}:{split}:{len(out)}:{attempts}")
            operators = low + len(out) % (high - low + 1)
            tokens = random_rpn(rng, operators, self.max_operand, self.operators)
            expression = " ".join(tokens)
            if expression in excluded or (split == "test" and expression in seen):
                continue
            seen.add(expression)
            value = evaluate_rpn(tokens, self.modulus)
            where = f" (all arithmetic mod {self.modulus})" if self.modulus else ""
            out.append(Problem(id=f"{self.name}/{split}/{len(out)}",
                               question=f"Evaluate this expression in reverse Polish notation{where}: {expression}",
                               answer=str(value), solution=worked_solution(tokens, self.modulus),
                               difficulty=float(operators), meta={"expression": expression,
                                                                  "modulus": self.modulus}))
        return out
