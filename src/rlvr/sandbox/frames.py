"""The frames a fork server reads and writes for each kind of job, on the trainer's side.

What it is: :func:`frame` turns a :class:`SandboxJob` (a program and its tests) or a :class:`ScriptJob` (a whole
program) into the ``run`` frame the fork server reads; :func:`to_result` turns its ``result`` frame back into a
:class:`SandboxResult` or :class:`ScriptResult`; :func:`failed` is the ``error`` result of a job that could not run.
What it is not: the framing itself (``protocol``), or the server's side of it (``server``).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from rlvr.sandbox.result import SandboxJob, SandboxResult, ScriptJob, ScriptResult

Job = SandboxJob | ScriptJob


def frame(job: Job, key: int, default_timeout: float) -> tuple[dict[str, Any], int]:
    """The ``run`` frame of ``job`` for a fork server, and its size in characters."""
    timeout = job.timeout or default_timeout
    if isinstance(job, ScriptJob):
        files = {name: base64.b64encode(data).decode("ascii") for name, data in job.files.items()}
        stdin = job.stdin.encode("utf-8", "surrogateescape") if isinstance(job.stdin, str) else job.stdin
        message = {"op": "run", "id": key, "mode": "script", "code": job.code, "files": files,
                   "stdin": base64.b64encode(stdin).decode("ascii") if stdin else None, "timeout": timeout,
                   "fetch_files": list(job.fetch_files), "output_bytes": job.output_bytes,
                   "memory_bytes": job.memory_mb << 20 if job.memory_mb else None,
                   "script_name": f"tmp{secrets.token_hex(4)}.py"}  # SandboxFusion's names are tempfile's too
        return message, len(job.code) + sum(len(f) for f in files.values()) + len(message["stdin"] or "")
    message = {"op": "run", "id": key, "code": job.code, "setup_code": job.setup_code, "tests": list(job.tests),
               "timeout": timeout}
    return message, len(job.code) + len(job.setup_code) + sum(len(t) for t in job.tests)


def to_result(message: dict[str, Any], job: Job) -> SandboxResult | ScriptResult:
    """The result in a fork server's ``result`` frame for ``job``."""
    status = message["status"]
    if isinstance(job, ScriptJob):
        if "return_code" not in message:  # the server failed before the job ran: a tests-style error frame
            return ScriptResult.error(message.get("stderr_tail", "").removeprefix("[sandbox] ").strip(),
                                      float(message["duration_s"]))
        return ScriptResult(status=status, return_code=message["return_code"], stdout=message["stdout"],
                            stderr=message["stderr"], duration_s=float(message["duration_s"]),
                            files={k: base64.b64decode(v) for k, v in message.get("files", {}).items()})
    return SandboxResult(passed=status == "ok", num_passed=int(message["num_passed"]),
                         num_tests=int(message["num_tests"]), status=status,
                         stderr_tail=message.get("stderr_tail", ""), duration_s=float(message["duration_s"]),
                         stdout_tail=message.get("stdout_tail", ""))


def failed(job: Job, why: str) -> SandboxResult | ScriptResult:
    """The ``error`` result of a job that could not run, saying ``why``."""
    return ScriptResult.error(why) if isinstance(job, ScriptJob) else SandboxResult.error(why, len(job.tests))
