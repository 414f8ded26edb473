"""The ``code_tests`` reward: run the response's code against its tests in the sandbox.

What it is: :func:`extract_code` (the first ```` ```python ```` block, else the first untagged fenced block, else the
whole response; an unclosed block, as a truncated generation leaves, runs to the end) and :class:`CodeTests`, the
MBPP-RLVR reward -- ``pass_reward`` (1.0) when every test passes, ``partial_scale * fraction`` (0.5 x fraction)
when some do, ``fail_reward`` (-0.5) when none pass or the program does not run (syntax error, crash, timeout,
memory). Tests come from ``meta["tests"]`` or ``meta["test_list"]``. Two kinds of setup code:
``meta["setup_code"]`` is trusted code run *before* the program (imports, helpers: HumanEval's prompt), and
MBPP's ``meta["test_setup_code"]`` runs *after* it, before each test, since it may use what the program defines
(MBPP task 927 builds trees from the solution's ``Node`` class).

The code always runs in :class:`rlvr.sandbox.Sandbox` (or any :class:`rlvr.sandbox.SandboxBackend` you pass), never
in this process. A job the sandbox could not run at all (``status="error"``: its setup code raised, its fork server
died) raises :class:`RewardError` -- the batch scorer counts it -- rather than scoring the policy for it.
``CodeTests`` is an *inline* reward: the sandbox enforces each job's timeout itself, so the batch scorer hands
it a whole batch (one ``run_many`` over the sandbox's pool) in the calling process.

What it is not: the sandbox (``rlvr.sandbox``), or a grader of programs by their output (write an assert).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.errors import ConfigurationError, RewardError
from rlvr.rewards.registry import Reward, RewardItem, register_reward
from rlvr.sandbox import SandboxBackend, SandboxJob, SandboxResult

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}

_default_sandbox: SandboxBackend | None = None
_default_pid = 0
_default_lock = threading.Lock()


def extract_code(response: str) -> str:
    """The program in ``response``: the first python-tagged fenced block, else the first untagged one, else the
    whole response."""
    blocks = _FENCE.findall(response)
    for tag, body in blocks:
        if tag.lower() in _PYTHON_TAGS:
            return body.strip("\n")
    for tag, body in blocks:
        if not tag:
            return body.strip("\n")
    return response.strip("\n")


def default_sandbox() -> SandboxBackend:
    """The process-wide sandbox ``code_tests`` uses when given none, started on first use.

    Starting fork servers from a process that holds a model is slower, and under bwrap they die with the
    thread that started them: a trainer should create its own ``Sandbox`` early, in its main thread, and pass it.
    """
    global _default_sandbox, _default_pid
    with _default_lock:
        if _default_sandbox is None or _default_pid != os.getpid():  # a forked child must not share the pipes
            from rlvr.sandbox import Sandbox

            _default_sandbox, _default_pid = Sandbox(), os.getpid()
        return _default_sandbox


def _tests_of(meta: Mapping[str, Any] | None) -> tuple[list[str], str]:
    meta = meta or {}
    tests = meta.get("tests")
    if tests is None:
        tests = meta.get("test_list")
    if tests is None or isinstance(tests, str) or not isinstance(tests, Sequence) or not tests:
        raise ConfigurationError(f"code_tests needs a non-empty list of test strings in meta['tests'] or "
                                 f"meta['test_list']; got {tests!r:.100} (meta keys {sorted(meta)}). Pass "
                                 "problem.reward_meta() as meta")
    setup, test_setup = meta.get("setup_code") or "", meta.get("test_setup_code") or ""
    for key, value in (("setup_code", setup), ("test_setup_code", test_setup)):
        if not isinstance(value, str):
            raise ConfigurationError(f"code_tests: meta[{key!r}] must be a str, got {type(value).__name__}")
    test_setup = test_setup.replace("\r\n", "\n")
    return [f"{test_setup}\n{t}" if test_setup.strip() else str(t) for t in tests], setup


@register_reward("code_tests")
class CodeTests(Reward):
    """MBPP-RLVR's test reward: 1.0 all tests pass, 0.5 x fraction some do, -0.5 none or it does not run.

    Args:
        pass_reward, partial_scale, fail_reward: the three values above.
        sandbox: a :class:`rlvr.sandbox.SandboxBackend`; default: :func:`default_sandbox`.
        timeout: seconds per program (its tests included); default: the sandbox's.
        extract: read the program out of a fenced block (:func:`extract_code`); False runs the response as is.
    """

    name = "code_tests"
    inline = True

    def __init__(self, pass_reward: float = 1.0, partial_scale: float = 0.5, fail_reward: float = -0.5,
                 sandbox: SandboxBackend | None = None, timeout: float | None = None, extract: bool = True) -> None:
        for field, value in (("pass_reward", pass_reward), ("partial_scale", partial_scale),
                             ("fail_reward", fail_reward)):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigurationError(f"code_tests({field}={value!r}): must be a number")
        if sandbox is not None and not isinstance(sandbox, SandboxBackend):
            raise ConfigurationError(f"code_tests(sandbox={sandbox!r:.80}): must be an rlvr.sandbox.SandboxBackend "
                                     "(e.g. rlvr.sandbox.Sandbox())")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ConfigurationError(f"code_tests(timeout={timeout!r}): must be a positive number of seconds or None")
        self.pass_reward, self.partial_scale, self.fail_reward = float(pass_reward), partial_scale, fail_reward
        self.sandbox, self.timeout, self.extract = sandbox, timeout, extract
        self._pid = os.getpid()

    def _backend(self) -> SandboxBackend:
        if self.sandbox is None:
            return default_sandbox()
        if os.getpid() != self._pid:
            raise RewardError("code_tests was given a sandbox in another process and is now called in a forked "
                              "child, where that sandbox's pipes are shared with the parent; score code_tests "
                              "through score_batch (it runs inline in the parent) or let each process make its own")
        return self.sandbox

    def job(self, response: str, meta: Mapping[str, Any] | None) -> SandboxJob:
        """The sandbox job for one response."""
        tests, setup = _tests_of(meta)
        code = extract_code(response) if self.extract else response
        return SandboxJob(code=code, tests=tests, setup_code=setup, timeout=self.timeout)

    def value(self, result: SandboxResult) -> float:
        """The reward for one sandbox result; raises :class:`RewardError` for a job that could not run."""
        if result.status == "error":
            raise RewardError(f"the sandbox could not run this program (status 'error', not the policy's fault): "
                              f"{result.stderr_tail.strip()[-600:]}")
        if result.passed:
            return self.pass_reward
        if result.num_passed > 0 and result.num_tests > 0:
            return self.partial_scale * result.num_passed / result.num_tests
        return float(self.fail_reward)

    def run(self, response: str, meta: Mapping[str, Any] | None = None) -> SandboxResult:
        """Run one response against its tests in the sandbox: the whole result (which tests passed, the stderr
        tail), for callers that need more than the reward, such as the refinement env."""
        job = self.job(response, meta)  # bad meta raises here, before any sandbox starts
        return self._backend().run_many([job])[0]

    def __call__(self, prompt: str, response: str, meta: Mapping[str, Any] | None = None) -> float:
        return self.value(self.run(response, meta))

    def score_many(self, items: Sequence[RewardItem]) -> list[float | BaseException]:
        """All items' programs in one ``run_many`` over the sandbox pool; per-item failures as exceptions."""
        outcomes: list[float | BaseException] = []
        jobs: list[SandboxJob] = []
        where: list[int] = []
        for item in items:
            try:
                jobs.append(self.job(item.response, item.meta))
                where.append(len(outcomes))
                outcomes.append(0.0)  # placeholder, replaced below
            except Exception as exc:
                outcomes.append(exc)
        if jobs:
            results = self._backend().run_many(jobs)
            for index, result in zip(where, results, strict=True):
                try:
                    outcomes[index] = self.value(result)
                except RewardError as exc:
                    outcomes[index] = exc
        return outcomes
