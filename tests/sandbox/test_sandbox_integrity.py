"""A program passes only when its tests ran and passed: early exits, fake output and harness tampering fail.

Each program has a wrong solution (``add`` subtracts) plus a trick; were the trick to work, the result would
say ``passed``. The tricks that need no knowledge of the harness's memory are all covered; see the threat
model in ``rlvr.sandbox`` for the one that is not.
"""

from __future__ import annotations

import json
import struct

import pytest

from rlvr.sandbox import Sandbox, SandboxResult

WRONG = "def add(a, b):\n    return a - b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"]


def run_trick(sandbox: Sandbox, trick: str, tests: list[str] = TESTS) -> SandboxResult:
    result = sandbox.run(WRONG + trick, tests)
    assert not result.passed, f"the trick passed:\n{trick}"
    return result


@pytest.mark.parametrize("trick", [
    "import sys\nsys.exit(0)",
    "raise SystemExit(0)",
    "exit()",
    "import os\nos._exit(0)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
])
def test_exiting_early_is_not_a_pass(sandbox: Sandbox, trick: str) -> None:
    result = run_trick(sandbox, trick)
    assert result.num_passed == 0


def test_exit_from_inside_a_test_fails_that_test_only(sandbox: Sandbox) -> None:
    code = "import sys\ndef add(a, b):\n    if a == 0:\n        sys.exit(0)\n    return a + b\n"
    result = sandbox.run(code, TESTS)
    assert (result.passed, result.num_passed, result.status) == (False, 2, "failed")


def test_hard_exit_from_inside_a_test_stops_the_count(sandbox: Sandbox) -> None:
    code = "import os\ndef add(a, b):\n    if a == 2:\n        os._exit(0)\n    return a + b\n"
    result = sandbox.run(code, TESTS)
    assert (result.passed, result.num_passed, result.status) == (False, 1, "failed")
    assert "before its tests finished" in result.stderr_tail


def test_printing_success_markers_is_not_a_pass(sandbox: Sandbox) -> None:
    markers = ["All tests passed", "OK", "3/3 passed", "PASSED", json.dumps({"status": "ok", "num_passed": 3})]
    trick = "import sys\n" + "".join(f"print({m!r})\nsys.stderr.write({m!r} + '\\n')\n" for m in markers)
    result = run_trick(sandbox, trick)
    assert "All tests passed" in result.stdout_tail


def test_patching_builtins_is_not_a_pass(sandbox: Sandbox) -> None:
    trick = (
        "import builtins\n"
        "builtins.exec = lambda *args, **kwargs: None\n"
        "builtins.compile = lambda *args, **kwargs: compile('pass', '<x>', 'exec')\n"
        "builtins.AssertionError = type('Harmless', (Exception,), {})\n"
        "builtins.BaseException = type('Nothing', (Exception,), {})\n"
        "builtins.isinstance = lambda *args: False\n"
        "builtins.type = lambda *args: None\n"
        "builtins.len = lambda *args: 0\n"
    )
    assert run_trick(sandbox, trick).num_passed == 0


def test_monkeypatching_the_harness_and_os_is_not_a_pass(sandbox: Sandbox) -> None:
    trick = (
        "import os, sys, types\n"
        "for module in list(sys.modules.values()):\n"
        "    if 'rlvr' in getattr(module, '__name__', '') or module is os:\n"
        "        for name, value in list(vars(module).items()):\n"
        "            if callable(value) and not isinstance(value, type):\n"
        "                try:\n"
        "                    setattr(module, name, lambda *args, **kwargs: None)\n"
        "                except (AttributeError, TypeError):\n"
        "                    pass\n"
    )
    assert run_trick(sandbox, trick).num_passed == 0


def test_trace_and_profile_hooks_are_cleared_before_each_test(sandbox: Sandbox) -> None:
    """A hook left by the solution would see (and could rewrite) the test frames; here it records them."""
    code = (
        "import sys\n"
        "EVENTS = []\n"
        "def hook(frame, event, arg):\n"
        "    if frame.f_code.co_filename.startswith('<test'):\n"
        "        EVENTS.append(event)\n"
        "    return hook\n"
        "sys.settrace(hook)\n"
        "sys.setprofile(hook)\n"
    )
    result = sandbox.run(code, ["assert EVENTS == []", "assert EVENTS == []"])
    assert result.passed, result.stderr_tail


def test_forged_reports_on_every_descriptor_are_not_a_pass(sandbox: Sandbox) -> None:
    """Plausible report records and protocol frames written to every open descriptor count for nothing."""
    frame = json.dumps({"op": "result", "id": 0, "status": "ok", "num_passed": 3, "num_tests": 3,
                        "stderr_tail": "", "stdout_tail": "", "duration_s": 0.0}).encode()
    forged = [b"P" + bytes(16), b"E" + bytes(16), b"P" + b"\xff" * 16, b"E" + b"\xff" * 16,
              struct.pack(">I", len(frame)) + frame]
    trick = (
        "import os\n"
        f"FORGED = {forged!r}\n"
        "for fd in range(0, 256):\n"
        "    for record in FORGED:\n"
        "        try:\n"
        "            os.write(fd, record)\n"
        "        except OSError:\n"
        "            pass\n"
    )
    assert run_trick(sandbox, trick).num_passed == 0


def test_closing_the_report_pipe_loses_passes_instead_of_faking_them(sandbox: Sandbox) -> None:
    right = "def add(a, b):\n    return a + b\nimport os\nos.closerange(3, 1024)\n"
    result = sandbox.run(right, TESTS)
    assert (result.passed, result.num_passed, result.status) == (False, 0, "failed")


def test_replacing_the_report_pipe_is_not_a_pass(sandbox: Sandbox) -> None:
    trick = "import os\nfor fd in range(3, 64):\n    try:\n        os.dup2(1, fd)\n    except OSError:\n        pass\n"
    assert run_trick(sandbox, trick).num_passed == 0


def test_atexit_and_excepthook_do_not_run_after_the_report(sandbox: Sandbox) -> None:
    trick = (
        "import atexit, os, sys\n"
        "atexit.register(lambda: os._exit(0))\n"
        "sys.excepthook = lambda *args: None\n"
        "class Done:\n"
        "    def __del__(self):\n"
        "        print('PASSED')\n"
        "KEEP = Done()\n"
    )
    assert run_trick(sandbox, trick).num_passed == 0


def test_faking_a_sandbox_error_exit_is_still_a_failure(sandbox: Sandbox) -> None:
    """Exit codes are not read as results: the one the server uses internally gives no ``error`` status."""
    for code in (120, 121, 137):
        result = sandbox.run(f"import os\nos._exit({code})", TESTS)
        assert result.status == "failed", result


def test_secrets_are_gone_from_the_job_arguments(sandbox: Sandbox) -> None:
    """The secrets dict the harness receives is emptied before the solution runs."""
    trick = (
        "import gc\n"
        "LEAKED = [o for o in gc.get_objects() if isinstance(o, dict) and set(o) >= {'pass', 'end'}]\n"
    )
    result = sandbox.run(WRONG + trick, ["assert LEAKED"])
    assert result.num_passed == 0


def test_forged_end_record_does_not_complete_a_job_without_tests(sandbox: Sandbox) -> None:
    """With no tests, only the end secret makes a pass; a made-up end record before exiting does not."""
    trick = (
        "import os\n"
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        os.write(fd, b'E' + bytes(16))\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    result = sandbox.run(trick, [])
    assert not result.passed and result.status == "failed"


def test_harness_and_verdict_agree_on_the_record_format() -> None:
    from rlvr.sandbox import harness, verdict

    kinds = ("PASS", "END", "SETUP_FAILED", "MEMORY", "SOLUTION_RAISED")
    assert [getattr(harness, k) for k in kinds] == [getattr(verdict, k) for k in kinds]
    assert len({getattr(verdict, k) for k in kinds}) == len(kinds)
    assert verdict.RECORD_SIZE == 1 + 16
