"""The interface every code-execution backend implements, so a remote executor can replace the local one.

What it is: :class:`SandboxBackend`, a small abstract base class. Reward functions take a backend; the
default is :class:`rlvr.sandbox.Sandbox` (local fork-server pool), and a user can plug in anything that
implements :meth:`SandboxBackend.run_many`.
What it is not: an implementation of any remote protocol; rlvr ships none (see the example below).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from types import TracebackType

from rlvr.sandbox.result import JobLike, SandboxJob, SandboxResult, as_job


class SandboxBackend(ABC):
    """Runs batches of untrusted programs with their tests and returns one :class:`SandboxResult` each.

    Implementations must return results in the order of the jobs, never raise for a job that merely fails
    (that is a result with ``status="failed"``/``"timeout"``/...), and report a job they could not run as
    ``status="error"`` with the reason in ``stderr_tail``. They raise :class:`rlvr.errors.SandboxError` only
    when the backend as a whole cannot work.

    A minimal remote backend for a SandboxFusion-style HTTP service (one POST per job; the service must run
    the tests itself and say how many passed)::

        import json, urllib.request
        from rlvr.sandbox import SandboxBackend, SandboxResult

        class HttpSandbox(SandboxBackend):
            def __init__(self, url: str, timeout: float = 10.0):
                self.url, self.timeout = url, timeout

            def run_many(self, jobs):
                results = []
                for job in map(self.as_job, jobs):
                    body = json.dumps({"code": job.code, "tests": list(job.tests),
                                       "setup_code": job.setup_code}).encode()
                    request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(request, timeout=job.timeout or self.timeout) as reply:
                            data = json.load(reply)
                    except OSError as exc:
                        results.append(SandboxResult.error(f"{self.url} did not answer: {exc}", len(job.tests)))
                        continue
                    results.append(SandboxResult(
                        passed=data["num_passed"] == len(job.tests) and data["status"] == "ok",
                        num_passed=data["num_passed"], num_tests=len(job.tests), status=data["status"],
                        stderr_tail=data.get("stderr", "")[-4000:], duration_s=data.get("duration_s", 0.0)))
                return results
    """

    @abstractmethod
    def run_many(self, jobs: Iterable[JobLike]) -> list[SandboxResult]:
        """Run ``jobs`` (each a :class:`SandboxJob` or a mapping with its fields), results in the same order."""

    def run(self, code: str, tests: Sequence[str], setup_code: str = "", timeout: float | None = None
            ) -> SandboxResult:
        """Run one program and its tests; see :meth:`run_many`."""
        return self.run_many([SandboxJob(code=code, tests=tests, setup_code=setup_code, timeout=timeout)])[0]

    @staticmethod
    def as_job(job: JobLike) -> SandboxJob:
        """Normalise a job given as a mapping; raises :class:`rlvr.errors.ConfigurationError` if malformed."""
        return as_job(job)

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the backend's resources (processes, connections). Idempotent."""

    def __enter__(self) -> SandboxBackend:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
