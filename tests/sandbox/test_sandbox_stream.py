"""Submitted jobs: from many threads at once, each runs as soon as a fork server is free, and every one is answered."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.errors import SandboxError
from rlvr.sandbox import Sandbox, SandboxResult, ScriptJob


def test_jobs_from_many_threads_are_all_answered_in_kind(sandbox: Sandbox) -> None:
    futures: dict[int, object] = {}

    def send(start: int) -> None:
        for i in range(start, start + 20):
            job = ScriptJob(f"print({i} * {i})") if i % 2 else {"code": f"x = {i}", "tests": [f"assert x == {i}"]}
            futures[i] = sandbox.submit(job)

    threads = [threading.Thread(target=send, args=(20 * t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, future in sorted(futures.items()):
        result = future.result(timeout=60)
        if i % 2:
            assert result.stdout == f"{i * i}\n"
        else:
            assert isinstance(result, SandboxResult) and result.passed


def test_a_slow_job_holds_up_only_its_own_server(sandbox: Sandbox) -> None:
    slow = sandbox.submit(ScriptJob("import time\ntime.sleep(3)", timeout=10))
    time.sleep(0.2)  # the slow job is on a server
    started = time.monotonic()
    quick = [sandbox.submit(ScriptJob(f"print({i})")) for i in range(10)]
    assert [f.result(timeout=30).stdout for f in quick] == [f"{i}\n" for i in range(10)]
    assert time.monotonic() - started < 2.0, "quick jobs waited for the slow one"
    assert slow.result(timeout=30).return_code == 0


def test_run_many_takes_turns_with_submitted_jobs(sandbox: Sandbox) -> None:
    futures = [sandbox.submit(ScriptJob("import time\ntime.sleep(0.3)\nprint('submitted')")) for _ in range(4)]
    results = sandbox.run_many([{"code": "y = 2", "tests": ["assert y == 2"]}] * 4)
    assert all(r.passed for r in results)
    assert [f.result(timeout=30).stdout for f in futures] == ["submitted\n"] * 4


def test_closing_fails_what_was_submitted_and_not_done() -> None:
    pool = Sandbox(num_workers=1, timeout=10.0, use_bwrap=False)
    running = pool.submit(ScriptJob("import time\ntime.sleep(30)"))
    waiting = pool.submit(ScriptJob("print('never')"))
    time.sleep(0.3)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 5.0
    for future in (running, waiting):
        with pytest.raises(SandboxError, match="closed"):
            future.result(timeout=5)
    with pytest.raises(SandboxError, match="closed"):
        pool.submit(ScriptJob("pass"))
