"""What goes into and comes out of the sandbox: :class:`SandboxJob` and :class:`SandboxResult` (a program and its
tests, for rewards), :class:`ScriptJob` and :class:`ScriptResult` (a whole program run as ``python main.py``, for
``/run_code``).

What it is: plain dataclasses shared by every backend, local or remote, and the lists of statuses.
What it is not: the code that runs jobs (``executor``) or the interface a backend implements (``backend``).
"""

from __future__ import annotations

import posixpath
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


ScriptStatus = Literal["finished", "timeout", "error"]

#: Every value :attr:`ScriptResult.status` can take.
SCRIPT_STATUSES: tuple[str, ...] = ("finished", "timeout", "error")

#: How much of a script's stdout and of its stderr comes back by default (SandboxFusion keeps 1 MiB of each).
SCRIPT_OUTPUT_BYTES = 1 << 20


def job_relative_path(path: object, field_name: str) -> str:
    """``path`` as a normalised path inside the job folder, or ConfigurationError naming ``field_name``."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigurationError(f"{field_name}: {path!r} is not a file name; give a non-empty relative path such as "
                                 "'data/input.txt'")
    normal = posixpath.normpath(path)
    if posixpath.isabs(path) or normal == ".." or normal.startswith("../") or normal == ".":
        raise ConfigurationError(f"{field_name}: {path!r} is not inside the job folder; give a relative path without "
                                 "'..' such as 'data/input.txt'")
    return normal


@dataclass(frozen=True)
class ScriptJob:
    """One whole program, run as ``python main.py`` would run it: as ``__main__``, in a fresh job folder holding
    ``files``, reading ``stdin``; its exit status, stdout and stderr are the result (no tests, no secrets: whatever
    the program does is its own outcome)."""

    code: str
    """The program's source, written to the job folder and run as the main module."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    """Files to create in the job folder before the program starts, by relative path (``{"lib/util.py": b"..."}``);
    the program's folder is first on ``sys.path``, so it can import the ``.py`` ones."""

    stdin: str | bytes | None = None
    """What the program reads on stdin (None: nothing, end of file at once)."""

    timeout: float | None = None
    """Wall-clock seconds for the program (also its CPU seconds, rounded up); ``None`` uses the backend's default."""

    fetch_files: Sequence[str] = field(default_factory=tuple)
    """Files of the job folder to return after the run, by relative path (missing ones are left out)."""

    memory_mb: int | None = None
    """Address-space limit for this program in MiB, at most the backend's own (None: the backend's)."""

    output_bytes: int = SCRIPT_OUTPUT_BYTES
    """How much of stdout, and of stderr, comes back (the first bytes; the rest is dropped)."""

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise ConfigurationError(f"ScriptJob.code must be a str, got {type(self.code).__name__}")
        files = {}
        for path, content in dict(self.files).items():
            name = job_relative_path(path, f"ScriptJob.files[{path!r}]")
            if not isinstance(content, bytes | bytearray):
                raise ConfigurationError(f"ScriptJob.files[{path!r}] must be bytes, got {type(content).__name__}; "
                                         "encode text with .encode()")
            files[name] = bytes(content)
        object.__setattr__(self, "files", files)
        if self.stdin is not None and not isinstance(self.stdin, str | bytes):
            raise ConfigurationError(f"ScriptJob.stdin must be a str, bytes or None, got {type(self.stdin).__name__}")
        if isinstance(self.fetch_files, str):
            raise ConfigurationError("ScriptJob.fetch_files must be a list of paths, got a single str; wrap it: "
                                     "fetch_files=[path]")
        object.__setattr__(self, "fetch_files", tuple(
            job_relative_path(p, f"ScriptJob.fetch_files[{i}]") for i, p in enumerate(self.fetch_files)))
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigurationError(f"ScriptJob.timeout must be a positive number of seconds or None, "
                                     f"got {self.timeout!r}")
        if self.memory_mb is not None and (not isinstance(self.memory_mb, int) or self.memory_mb < 16):
            raise ConfigurationError(f"ScriptJob.memory_mb must be an int >= 16 or None, got {self.memory_mb!r}")
        if not isinstance(self.output_bytes, int) or self.output_bytes < 0:
            raise ConfigurationError(f"ScriptJob.output_bytes must be an int >= 0, got {self.output_bytes!r}")


@dataclass(frozen=True)
class ScriptResult:
    """How one :class:`ScriptJob` ended."""

    status: ScriptStatus
    """``finished``: the program ran to its end, whatever its exit status (a non-zero ``return_code`` is the program's
    failure, not the sandbox's). ``timeout``: the wall-clock or CPU limit ended it. ``error``: it could not run (its
    files could not be written, the sandbox could not confine it, its fork server died); ``stderr`` says why."""

    return_code: int | None
    """The exit status as ``subprocess`` reports it (negative: killed by that signal); None unless ``finished``."""

    stdout: str
    """The first ``output_bytes`` of what the program printed, decoded as UTF-8 (bad bytes replaced)."""

    stderr: str
    """The first ``output_bytes`` of its stderr, then ``[sandbox]`` lines saying why it ended as it did, if not by
    itself."""

    duration_s: float
    """Wall-clock seconds from fork to reap of the program (not counting queueing)."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    """The ``fetch_files`` that existed as regular files inside the job folder after the run."""

    def __post_init__(self) -> None:
        if self.status not in SCRIPT_STATUSES:
            raise ConfigurationError(f"ScriptResult.status must be one of {SCRIPT_STATUSES}, got {self.status!r}")

    @classmethod
    def error(cls, message: str, duration_s: float = 0.0) -> ScriptResult:
        """A result for a program that could not run, with ``message`` (what went wrong and the fix)."""
        return cls(status="error", return_code=None, stdout="", stderr=f"[sandbox] {message}\n",
                   duration_s=duration_s)
