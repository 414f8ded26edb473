"""Harmless programs work, tests are counted one by one, and the API behaves as documented."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError, SandboxError
from rlvr.sandbox import STATUSES, Sandbox, SandboxJob, SandboxResult

ADD = "def add(a, b):\n    return a + b\n"


def test_passing_program_counts_every_test(sandbox: Sandbox) -> None:
    result = sandbox.run(ADD, ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"])
    assert (result.passed, result.num_passed, result.num_tests, result.status) == (True, 3, 3, "ok")
    assert result.duration_s > 0


def test_failing_test_is_counted_and_the_rest_still_run(sandbox: Sandbox) -> None:
    result = sandbox.run(ADD, ["assert add(1, 2) == 3", "assert add(1, 1) == 3", "assert add(2, 2) == 4"])
    assert (result.passed, result.num_passed, result.status) == (False, 2, "failed")
    assert "test 1 failed" in result.stderr_tail and "AssertionError" in result.stderr_tail


def test_test_that_raises_counts_as_failed(sandbox: Sandbox) -> None:
    code = "def inv(x):\n    return 1 / x\n"
    result = sandbox.run(code, ["assert inv(0) == 0", "assert inv(2) == 0.5", "assert undefined_name"])
    assert (result.num_passed, result.status) == (1, "failed")
    assert "ZeroDivisionError" in result.stderr_tail and "NameError" in result.stderr_tail


def test_test_with_syntax_error_counts_as_failed(sandbox: Sandbox) -> None:
    result = sandbox.run(ADD, ["assert add(1, 2) == 3", "assert add(1, 2) =="])
    assert (result.num_passed, result.status) == (1, "failed")
    assert "does not compile" in result.stderr_tail


def test_solution_syntax_error_fails_every_test(sandbox: Sandbox) -> None:
    result = sandbox.run("def add(a, b) return a + b", ["assert True"])
    assert (result.passed, result.num_passed, result.status) == (False, 0, "failed")
    assert "SyntaxError" in result.stderr_tail


def test_solution_that_raises_fails_even_if_its_function_works(sandbox: Sandbox) -> None:
    result = sandbox.run(ADD + "raise RuntimeError('late')\n", ["assert add(1, 2) == 3"])
    assert (result.passed, result.num_passed, result.status) == (False, 0, "failed")
    assert "RuntimeError: late" in result.stderr_tail


def test_setup_code_runs_before_the_solution(sandbox: Sandbox) -> None:
    result = sandbox.run("def f():\n    return BASE + 1\n", ["assert f() == 42"], setup_code="BASE = 41")
    assert result.passed


def test_setup_code_that_raises_is_an_error_not_a_failure(sandbox: Sandbox) -> None:
    result = sandbox.run(ADD, ["assert add(1, 2) == 3"], setup_code="import not_a_module_anywhere")
    assert (result.passed, result.status) == (False, "error")
    assert "setup_code raised" in result.stderr_tail


def test_standard_library_imports_work(sandbox: Sandbox) -> None:
    code = (
        "import collections, itertools, functools, heapq, bisect, math, re, json, datetime, fractions, string\n"
        "import random, statistics, decimal, typing, dataclasses, hashlib, textwrap, operator\n"
        "def f(xs):\n"
        "    return sorted(collections.Counter(xs).items())[0][0] + math.gcd(12, 18)\n"
    )
    result = sandbox.run(code, ["assert f([3, 1, 1]) == 7", "assert json.loads('[1]') == [1]",
                                "assert random.Random(1).random() < 1"])
    assert result.passed, result.stderr_tail


def test_threads_work(sandbox: Sandbox) -> None:
    code = (
        "import threading\n"
        "def run(n):\n"
        "    out = []\n"
        "    threads = [threading.Thread(target=out.append, args=(i,)) for i in range(n)]\n"
        "    for t in threads: t.start()\n"
        "    for t in threads: t.join()\n"
        "    return sorted(out)\n"
    )
    result = sandbox.run(code, ["assert run(8) == list(range(8))"])
    assert result.passed, result.stderr_tail


def test_recursion_works(sandbox: Sandbox) -> None:
    code = "import sys\nsys.setrecursionlimit(5000)\ndef depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
    result = sandbox.run(code, ["assert depth(3000) == 3000"])
    assert result.passed, result.stderr_tail


def test_job_reads_and_writes_its_own_folder(sandbox: Sandbox) -> None:
    code = (
        "import os, tempfile\n"
        "os.mkdir('sub')\n"
        "with open('sub/data.txt', 'w') as f:\n"
        "    f.write('hello')\n"
        "fd, tmp = tempfile.mkstemp()\n"
        "os.close(fd)\n"
        "def check():\n"
        "    return open('sub/data.txt').read() == 'hello' and os.listdir('.') != [] and os.path.exists(tmp)\n"
    )
    result = sandbox.run(code, ["assert check()"])
    assert result.passed, result.stderr_tail


def test_job_folders_are_private_and_fresh(sandbox: Sandbox) -> None:
    writer = sandbox.run("open('left_behind.txt', 'w').write('x')\nimport os\nprint(os.getcwd())", ["assert True"])
    reader = sandbox.run("import os\nfiles = os.listdir('.')\nprint(os.getcwd())", ["assert files == []"])
    assert writer.passed and reader.passed
    assert writer.stdout_tail.strip() != reader.stdout_tail.strip()
    assert not os.path.exists(writer.stdout_tail.strip()), "the job folder was not deleted"


def test_stdout_is_captured_but_never_read_as_a_result(sandbox: Sandbox) -> None:
    result = sandbox.run("print('hello from the job')", ["assert False"])
    assert result.stdout_tail == "hello from the job\n"
    assert not result.passed


def test_zero_tests_pass_when_the_program_completes(sandbox: Sandbox) -> None:
    assert sandbox.run(ADD, []).passed
    assert not sandbox.run("raise SystemExit(0)", []).passed


def test_run_many_keeps_order_and_runs_in_parallel(sandbox: Sandbox) -> None:
    jobs = [SandboxJob(code=f"import time\ntime.sleep(0.4)\nX = {i}", tests=[f"assert X == {i}"]) for i in range(4)]
    started = time.monotonic()
    results = sandbox.run_many(jobs)
    elapsed = time.monotonic() - started
    assert [r.passed for r in results] == [True] * 4
    assert elapsed < 1.4, f"4 jobs of 0.4 s on 2 workers took {elapsed:.2f} s: not parallel"


def test_mappings_are_accepted_as_jobs(sandbox: Sandbox) -> None:
    (result,) = sandbox.run_many([{"code": ADD, "tests": ["assert add(2, 2) == 4"], "timeout": 1.0}])
    assert result.passed


def test_per_job_timeout_overrides_the_default(sandbox: Sandbox) -> None:
    result = sandbox.run("import time\ntime.sleep(1.5)", ["assert True"], timeout=0.5)
    assert result.status == "timeout"
    assert result.duration_s < 1.2


@pytest.mark.parametrize("job", [
    {"tests": ["assert True"]},
    {"code": "x = 1", "tests": "assert x == 1"},
    {"code": "x = 1", "tests": [1]},
    {"code": "x = 1", "tests": [], "timeout": 0},
    {"code": "x = 1", "test": []},
])
def test_malformed_jobs_raise_configuration_error(sandbox: Sandbox, job: dict) -> None:
    with pytest.raises(ConfigurationError):
        sandbox.run_many([job])


@pytest.mark.parametrize("kwargs", [{"num_workers": 0}, {"timeout": -1}, {"memory_mb": 1},
                                    {"python": "/nonexistent/python"}, {"extra_paths": ["/nonexistent"]}])
def test_bad_settings_raise_configuration_error(kwargs: dict) -> None:
    with pytest.raises(ConfigurationError):
        Sandbox(**kwargs)


def test_extra_paths_are_importable(tmp_path: Path) -> None:
    (tmp_path / "helper_lib.py").write_text("def triple(x):\n    return 3 * x\n")
    with Sandbox(num_workers=1, use_bwrap=False, extra_paths=[str(tmp_path)]) as pool:
        assert pool.run("from helper_lib import triple", ["assert triple(2) == 6"]).passed


def test_result_rejects_unknown_status() -> None:
    assert set(STATUSES) == {"ok", "failed", "timeout", "memory", "error", "killed"}
    with pytest.raises(ConfigurationError):
        SandboxResult(passed=False, num_passed=0, num_tests=0, status="weird", stderr_tail="", duration_s=0.0)


def test_close_stops_the_servers_and_refuses_more_work() -> None:
    with Sandbox(num_workers=1, use_bwrap=False) as pool:
        pids = pool.server_pids()
        assert pool.run(ADD, ["assert add(1, 1) == 2"]).passed
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    with pytest.raises(SandboxError):
        pool.run(ADD, [])
    pool.close()  # idempotent
