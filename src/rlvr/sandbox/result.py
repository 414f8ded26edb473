"""What goes into and comes out of the sandbox: :class:`SandboxJob` and :class:`SandboxResult`.

What it is: two plain dataclasses shared by every backend, local or remote, and the list of statuses.
What it is not: the code that runs jobs (``executor``) or the interface a backend implements (``backend``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.errors import ConfigurationError

Status = Literal["ok", "failed", "timeout", "memory", "error", "killed"]

#: Every value :attr:`SandboxResult.status` can take, from best to worst-understood.
STATUSES: tuple[str, ...] = ("ok", "failed", "timeout", "memory", "error", "killed")


@dataclass(frozen=True)
class SandboxJob:
    """One program to run: untrusted ``code`` followed by its ``tests``."""

    code: str
    """The untrusted program, typically a function definition written by the model."""

    tests: Sequence[str] = field(default_factory=tuple)
    """Test statements run one by one after ``code`` in its namespace, MBPP style (``assert f(1) == 2``).
    Each counts separately; one that raises counts as failed and the others still run."""

    setup_code: str = ""
    """Trusted code run before ``code`` (imports, fixtures); if it raises, the result is ``error``."""

    timeout: float | None = None
    """Wall-clock seconds for the whole job; ``None`` uses the backend's default."""

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise ConfigurationError(f"SandboxJob.code must be a str, got {type(self.code).__name__}")
        if isinstance(self.tests, str):
            raise ConfigurationError("SandboxJob.tests must be a list of test strings, got a single str; "
                                     "wrap it: tests=[test]")
        tests = tuple(self.tests)
        for i, test in enumerate(tests):
            if not isinstance(test, str):
                raise ConfigurationError(f"SandboxJob.tests[{i}] must be a str, got {type(test).__name__}")
        object.__setattr__(self, "tests", tests)
        if not isinstance(self.setup_code, str):
            raise ConfigurationError(f"SandboxJob.setup_code must be a str, got {type(self.setup_code).__name__}")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigurationError(f"SandboxJob.timeout must be a positive number of seconds or None, "
                                     f"got {self.timeout!r}")


JobLike = SandboxJob | Mapping[str, Any]


def as_job(job: JobLike) -> SandboxJob:
    """Accept a :class:`SandboxJob` or a mapping with the same keys."""
    if isinstance(job, SandboxJob):
        return job
    if isinstance(job, Mapping):
        unknown = set(job) - {"code", "tests", "setup_code", "timeout"}
        if unknown:
            raise ConfigurationError(f"unknown job keys {sorted(unknown)}; a job has code, tests, setup_code, "
                                     "timeout")
        if "code" not in job:
            raise ConfigurationError("a job mapping needs a 'code' key")
        return SandboxJob(**job)
    raise ConfigurationError(f"a job must be a SandboxJob or a mapping, got {type(job).__name__}")


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one job. Only ``passed`` and ``num_passed`` are meant as a reward signal."""

    passed: bool
    """True only when every test ran and passed and the harness reported completion (``status == "ok"``).
    Exiting early, printing a success marker or tampering with the report channel never makes this True."""

    num_passed: int
    """How many tests ran to the end without raising, as reported with each test's per-job secret."""

    num_tests: int
    """How many tests the job had (tests that did not run count as not passed)."""

    status: Status
    """``ok``: everything ran and passed. ``failed``: the program ran but a test failed, the solution raised,
    or the program ended before its tests finished. ``timeout``: wall-clock or CPU limit hit, job killed.
    ``memory``: a ``MemoryError`` (address-space limit) ended the solution or a test. ``error``: the job
    could not run (setup code raised, the sandbox could not confine it, its fork server died) -- not the
    program's fault. ``killed``: the job died from a signal other than the sandbox's timeout."""

    stderr_tail: str
    """The end of the job's stderr (tracebacks of failed tests) plus ``[sandbox]`` lines saying why the job
    ended as it did; the first place to look for an ``error``."""

    duration_s: float
    """Wall-clock seconds from fork to reap of the job process (not counting queueing)."""

    stdout_tail: str = ""
    """The end of what the job printed to stdout (never read as a result)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ConfigurationError(f"SandboxResult.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def fraction_passed(self) -> float:
        """``num_passed / num_tests``, or 1.0/0.0 by ``passed`` for a job without tests."""
        if self.num_tests == 0:
            return 1.0 if self.passed else 0.0
        return self.num_passed / self.num_tests

    @classmethod
    def error(cls, message: str, num_tests: int = 0, duration_s: float = 0.0) -> SandboxResult:
        """A result for a job that could not run, with ``message`` (what went wrong and the fix)."""
        return cls(passed=False, num_passed=0, num_tests=num_tests, status="error",
                   stderr_tail=f"[sandbox] {message}\n", duration_s=duration_s)
