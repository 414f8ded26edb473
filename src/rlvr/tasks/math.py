"""Math problems read from records: GSM8K's ``#### <number>`` answers and MATH's ``\\boxed{}`` solutions.

What it is: two record-backed sources (data as in :class:`rlvr.tasks.files.RecordSource`: a file per split, one
file cut by ``test_fraction``, records, or the hub) whose problems are scored by a final answer, with the default
reward ``math_correct + 0.1 * (boxed_answer - 1)`` (the tinker-cookbook GSM8K reward) and a prompt that asks for
``\\boxed{}``; ``math_correct`` accepts equivalent forms (``\\frac{1}{2}``, ``0.5``, ``1/2``, ``1,080``).

* :class:`Gsm8kSource`: a ``question`` and an ``answer`` whose last line is ``#### <number>``. The reference is
  that number without thousands separators (``1,080`` -> ``1080``); few-shot demonstrations show the solution
  without its ``<<48/2=24>>`` calculator annotations, ending in ``\\boxed{}``. ``difficulty`` is the number of
  reasoning lines in the reference solution (a proxy: GSM8K has no difficulty label).
* :class:`MathSource`: MATH (Hendrycks et al.), MATH-500 and anything in their format. The reference is the
  record's ``answer`` field when it has one (MATH-500 does), else the content of the last ``\\boxed{}`` of the
  solution (braces balanced). ``difficulty`` is the number in ``level`` (``"Level 3"`` -> 3.0).

What it is not: generated arithmetic (``arithmetic``, ``rpn``), or a grader of proofs (answers are final values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rlvr.rewards import find_boxed
from rlvr.tasks.base import Problem
from rlvr.tasks.files import HubDataset, RecordSource, number_in

_ANNOTATION = re.compile(r"<<[^<>]*>>")


def final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, without thousands separators (and ``$``)."""
    if "####" not in solution:
        raise ValueError(f"a GSM8K answer must end with '#### <number>'; got {solution[-80:]!r}")
    answer = solution.rsplit("####", 1)[1].strip()
    if not answer:
        raise ValueError(f"nothing follows '####' in {solution[-80:]!r}")
    return answer.replace(",", "").replace("$", "").strip()


def clean_solution(solution: str) -> str:
    """A GSM8K solution as a model should write it: no calculator annotations, the answer in ``\\boxed{}``."""
    body = _ANNOTATION.sub("", solution.rsplit("####", 1)[0]).strip()
    return f"{body}\nThe answer is \\boxed{{{final_answer(solution)}}}."


class Gsm8kSource(RecordSource):
    """GSM8K-format problems; ``data`` as in :class:`rlvr.tasks.files.RecordSource` (e.g.
    ``{"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}``)."""

    name = "gsm8k"
    default_instruction = "Solve the problem step by step, then put your final answer in \\boxed{}."

    @staticmethod
    def hub() -> HubDataset:
        """GSM8K on the Hugging Face hub (``openai/gsm8k``, config ``main``; splits train and test)."""
        return HubDataset("openai/gsm8k", "main")

    def to_problem(self, record: Mapping[str, Any], index: int, split: str) -> Problem:
        solution = str(record["answer"])
        steps = [line for line in solution.rsplit("####", 1)[0].splitlines() if line.strip()]
        extra = {k: v for k, v in record.items() if k not in ("question", "answer")}
        return Problem(id=self.problem_id(record, index, split, "id" if "id" in record else None),
                       question=str(record["question"]).strip(), answer=final_answer(solution), solution=solution,
                       difficulty=float(len(steps)), meta=extra)

    def demonstration(self, problem: Problem) -> str:
        return clean_solution(problem.solution or "")


def boxed_answer_of(solution: str) -> str:
    """The content of the last non-empty ``\\boxed{}`` in ``solution``; ValueError when there is none."""
    boxed = [b.strip() for b in find_boxed(solution) if b.strip()]
    if not boxed:
        raise ValueError(f"the solution has no \\boxed{{}} answer and the record no 'answer' field: "
                         f"{solution[-120:]!r}")
    return boxed[-1]


class MathSource(RecordSource):
    """MATH-format problems; ``data`` as in :class:`rlvr.tasks.files.RecordSource`.

    Field names default to MATH's (``problem``, ``solution``, ``answer``, ``level``, ``unique_id``) and can be
    renamed with ``question_field``, ``solution_field``, ``answer_field`` and ``level_field``.
    """

    name = "math"
    default_instruction = "Solve the problem, then put your final answer in \\boxed{}."

    def __init__(self, data: Any, *, question_field: str = "problem", solution_field: str = "solution",
                 answer_field: str = "answer", level_field: str = "level", **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.question_field, self.solution_field = question_field, solution_field
        self.answer_field, self.level_field = answer_field, level_field

    @staticmethod
    def hub(name: str = "HuggingFaceH4/MATH-500") -> HubDataset:
        """A MATH-format data set on the Hugging Face hub; MATH-500 has one split, ``test``."""
        return HubDataset(name, splits={"test": "test"})

    def to_problem(self, record: Mapping[str, Any], index: int, split: str) -> Problem:
        solution = record.get(self.solution_field)
        answer = record.get(self.answer_field)
        if answer is None or not str(answer).strip():
            answer = boxed_answer_of(str(solution or ""))
        used = {self.question_field, self.solution_field, self.answer_field, self.level_field}
        return Problem(id=self.problem_id(record, index, split, "unique_id" if "unique_id" in record else None),
                       question=str(record[self.question_field]).strip(), answer=str(answer).strip(),
                       solution=None if solution is None else str(solution),
                       difficulty=number_in(record.get(self.level_field)),
                       meta={k: v for k, v in record.items() if k not in used})

    def demonstration(self, problem: Problem) -> str:
        """The worked solution, with ``\\boxed{answer}`` appended when it has none."""
        solution = problem.solution or ""
        return solution if find_boxed(solution) else f"{solution}\n\\boxed{{{problem.answer}}}".strip()
