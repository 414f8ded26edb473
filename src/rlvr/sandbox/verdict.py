"""Turning what a finished job left behind into its verdict: status, verified pass count, notes.

What it is: standard-library-only functions the fork server calls after reaping a job (it loads this file by
path). :func:`count_reports` checks the job's report records against the secrets the server generated for
that job -- only records carrying a valid secret count -- and :func:`decide` combines them with how the job
ended (exit status, signal, timeout, disk watchdog) into one of ``ok / failed / timeout / memory / error /
killed`` plus ``[sandbox]`` notes explaining it. :func:`tail` and :func:`force_rmtree` read the output files
and remove the job folder.

What it is not: the harness that produces the records (``harness``) or the supervision that decides how the
job ended (``server``).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
from dataclasses import dataclass, field

# The record format written by ``harness`` (which defines the same kinds; a test checks they agree).
RECORD_SIZE = 17
PASS, END, SETUP_FAILED, MEMORY, SOLUTION_RAISED = b"P", b"E", b"S", b"M", b"C"


@dataclass
class Reports:
    """What the job's report pipe held, after checking the secrets."""

    passed: set[int] = field(default_factory=set)
    """Indices of tests whose pass record carried that test's secret."""

    complete: bool = False
    """The end record carried the end secret: the harness ran every test."""

    setup_failed: bool = False
    """The setup-failed record carried the setup secret: setup code or confinement failed."""

    memory: bool = False
    """A MemoryError reached the harness (advisory: unauthenticated)."""

    solution_raised: bool = False
    """The solution raised before the tests (advisory: unauthenticated)."""


def count_reports(report: bytes, expected: dict[bytes, int], end_secret: bytes, setup_secret: bytes) -> Reports:
    """Parse fixed-size records; records whose secret does not match are ignored."""
    found = Reports()
    for offset in range(0, len(report) - RECORD_SIZE + 1, RECORD_SIZE):
        kind, payload = report[offset:offset + 1], report[offset + 1:offset + RECORD_SIZE]
        if kind == PASS and payload in expected:
            found.passed.add(expected[payload])
        elif kind == END and payload == end_secret:
            found.complete = True
        elif kind == SETUP_FAILED and payload == setup_secret:
            found.setup_failed = True
        elif kind == MEMORY:
            found.memory = True
        elif kind == SOLUTION_RAISED:
            found.solution_raised = True
    return found


def decide(found: Reports, num_tests: int, how: str, wait_status: int, cpu_s: float, timeout: float,
           disk_limit: int | None) -> tuple[str, list[str]]:
    """The job's status and the notes that explain it.

    ``how`` is how supervision ended: ``exited``, ``timeout``, ``disk`` (watchdog) or ``abort`` (trainer gone).
    """
    num_passed = len(found.passed)
    progress = f"{num_passed} of {num_tests} tests had passed"
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    exit_code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
    if how == "abort":
        return "error", ["the trainer went away while the job ran; it was killed"]
    if found.setup_failed:
        return "error", []
    if how == "disk":
        return "killed", [f"the job wrote more than {(disk_limit or 0) >> 20} MiB to disk and was killed ({progress})"]
    if how == "timeout":
        return "timeout", [f"wall-clock timeout after {timeout:g} s; the job's process group was killed ({progress})"]
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_s >= timeout):
        return "timeout", [f"timeout: CPU time limit of {timeout:g} s exceeded ({progress})"]
    if signum is not None:
        return "killed", [f"the job was killed by signal {signal.Signals(signum).name} ({progress})"]
    if found.complete and exit_code == 0 and num_passed == num_tests:
        return "ok", []
    if found.memory:
        return "memory", [f"memory limit reached (MemoryError); {num_passed} of {num_tests} tests passed"]
    if not found.complete and not found.solution_raised:
        return "failed", [f"the program ended (exit status {exit_code}) before its tests finished; {progress} and "
                          "the rest count as failed"]
    return "failed", []


def tail(path: str, limit: int) -> str:
    """The last ``limit`` bytes of a file as text ("" if empty or missing), marked when cut."""
    try:
        if os.stat(path).st_size == 0:
            return ""
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            data = handle.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return text if size <= limit else "[...]" + text


def force_rmtree(path: str) -> None:
    """Delete a job folder, even one whose subfolders the job made unreadable to this uid."""
    try:
        os.rmdir(path)  # the common case: the job left its folder empty
        return
    except OSError:
        pass

    def retry(function, failed_path, _exc_info):
        try:
            os.chmod(os.path.dirname(failed_path), stat.S_IRWXU)
            os.chmod(failed_path, stat.S_IRWXU)
        except OSError:
            pass
        try:
            function(failed_path)
        except FileNotFoundError:
            pass

    shutil.rmtree(path, onerror=retry)
