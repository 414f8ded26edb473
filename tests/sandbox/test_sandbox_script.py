"""Script jobs: a whole program runs as ``python main.py`` would, confined like any job, and its exit status, output
and files come back."""

from __future__ import annotations

import os

import pytest

from rlvr.errors import ConfigurationError
from rlvr.sandbox import Sandbox, ScriptJob


def run(sandbox: Sandbox, job: ScriptJob):
    (result,) = sandbox.run_scripts([job])
    return result


def test_stdin_stdout_and_exit_status(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1])\nsys.exit(3)",
                                    stdin="abc\nxyz\n"))
    assert (result.status, result.return_code, result.stdout, result.stderr) == ("finished", 3, "cba\nzyx\n", "")


def test_files_are_importable_readable_and_fetched_back(sandbox: Sandbox) -> None:
    code = ("from helper import twice\n"
            "value = int(open('data/in.txt').read())\n"
            "open('out.txt', 'w').write(str(twice(value)))\n")
    result = run(sandbox, ScriptJob(code, files={"helper.py": b"def twice(x):\n    return 2 * x\n",
                                                 "data/in.txt": b"21"},
                                    fetch_files=["out.txt", "data/in.txt", "never-written.txt"]))
    assert (result.status, result.return_code) == ("finished", 0), result.stderr
    assert result.files == {"out.txt": b"42", "data/in.txt": b"21"}


def test_the_program_is_the_main_module(sandbox: Sandbox) -> None:
    code = ("import sys, pickle\n"
            "from dataclasses import dataclass\n"
            "@dataclass\nclass Point:\n    x: int\n"
            "assert __name__ == '__main__' and sys.argv == [__file__] and sys.modules['__main__'].Point is Point\n"
            "assert pickle.loads(pickle.dumps(Point(3))) == Point(3)\n"
            "print(open(__file__).read() == open(sys.argv[0]).read())\n")
    result = run(sandbox, ScriptJob(code))
    assert (result.return_code, result.stdout) == (0, "True\n"), result.stderr


def test_an_uncaught_exception_gives_status_one_and_its_traceback(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("def f():\n    raise ValueError('boom')\nf()\n"))
    assert (result.status, result.return_code) == ("finished", 1)
    assert result.stderr.startswith("Traceback (most recent call last):") and "ValueError: boom" in result.stderr
    assert "script.py" not in result.stderr  # the sandbox's own frame is left out, as the interpreter leaves its own


def test_a_syntax_error_gives_status_one(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("print('unclosed'"))
    assert (result.status, result.return_code) == ("finished", 1) and "SyntaxError" in result.stderr


def test_system_exit_with_a_message_prints_it_and_gives_one(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("raise SystemExit('wrong answer')"))
    assert (result.return_code, result.stderr) == (1, "wrong answer\n")


def test_threads_are_joined_and_atexit_runs_before_the_exit(sandbox: Sandbox) -> None:
    code = ("import atexit, threading, time\n"
            "atexit.register(lambda: print('atexit'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n")
    assert run(sandbox, ScriptJob(code)).stdout == "thread\natexit\n"


def test_an_endless_program_times_out(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("print('started', flush=True)\nwhile True:\n    pass\n", timeout=1.0))
    assert (result.status, result.return_code, result.stdout) == ("timeout", None, "started\n")
    assert 0.9 < result.duration_s < 1.6 and "timeout" in result.stderr


def test_a_program_killed_by_a_signal_has_a_negative_return_code(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"))
    assert (result.status, result.return_code) == ("finished", -11) and "SIGSEGV" in result.stderr


def test_output_comes_back_up_to_its_limit(sandbox: Sandbox) -> None:
    result = run(sandbox, ScriptJob("import sys\nsys.stdout.write('x' * 3_000_000)\nsys.stderr.write('e' * 10)",
                                    output_bytes=1000))
    assert (result.return_code, result.stdout, result.stderr) == (0, "x" * 1000, "e" * 10)


def test_a_job_asks_for_less_memory_than_the_pool(sandbox: Sandbox) -> None:
    code = "block = bytearray(100 << 20)\nprint(len(block) >> 20)"
    assert run(sandbox, ScriptJob(code)).stdout == "100\n"  # the pool's 256 MiB hold it
    small = run(sandbox, ScriptJob(code, memory_mb=64))
    assert small.return_code == 1 and "MemoryError" in small.stderr


def test_paths_outside_the_job_folder_are_refused_by_name() -> None:
    for bad in ("../escape.py", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(ConfigurationError, match=r"ScriptJob\.files"):
            ScriptJob("pass", files={bad: b""})
    with pytest.raises(ConfigurationError, match=r"ScriptJob\.fetch_files\[0\]"):
        ScriptJob("pass", fetch_files=["../../etc/shadow"])


def test_a_path_that_slips_past_the_check_still_lands_nowhere(sandbox: Sandbox, tmp_path) -> None:
    """The job writes its own files, under Landlock and as its own uid: a path forced past ``ScriptJob``'s check is
    refused there, and nothing appears outside the job folder."""
    target = tmp_path / "escaped.txt"
    job = ScriptJob("print('ran')")
    job_dir = os.path.join(sandbox._root, "w0", "jobs", "name")  # where a job's folder sits, as seen from it
    object.__setattr__(job, "files", {os.path.relpath(target, job_dir): b"escaped"})
    result = run(sandbox, job)
    assert (result.status, result.stdout) == ("error", "") and "did not run" in result.stderr
    assert not target.exists()


def test_a_fetched_symlink_cannot_read_outside_the_job_folder(sandbox: Sandbox) -> None:
    code = "import os\nos.symlink('/etc/hostname', 'link')\nos.symlink('/proc/1/environ', 'env')"
    result = run(sandbox, ScriptJob(code, fetch_files=["link", "env"]))
    assert result.return_code == 0 and result.files == {}
    assert "'link' leads outside the job folder" in result.stderr


def test_writing_outside_the_job_folder_fails(sandbox: Sandbox, tmp_path) -> None:
    target = tmp_path / "written-by-a-script.txt"
    result = run(sandbox, ScriptJob(f"open({str(target)!r}, 'w').write('x')"))
    assert result.return_code == 1 and "PermissionError" in result.stderr
    assert not target.exists()


def test_script_jobs_and_test_jobs_share_the_pool(sandbox: Sandbox) -> None:
    assert sandbox.run("def f():\n    return 1\n", ["assert f() == 1"]).passed
    assert run(sandbox, ScriptJob("print(1)")).stdout == "1\n"
    with pytest.raises(ConfigurationError, match="run_scripts: job 0 is a dict, not a ScriptJob"):
        sandbox.run_scripts([{"code": "pass"}])
