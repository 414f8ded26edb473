"""``rlvr sandbox serve``: SandboxFusion's ``/run_code`` as tinker-cookbook's own ``SandboxFusionClient`` and verl's
SandboxFusion reward call it, on loopback HTTP against the app running in this process (and once as the CLI)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from rlvr.sandbox import Sandbox
from rlvr.sandbox.fusion import Limits, RunCodeRequest, create_app, default_import_paths, to_job

uvicorn = pytest.importorskip("uvicorn")
cookbook_sandbox = pytest.importorskip("tinker_cookbook.sandbox")
SandboxFusionClient = cookbook_sandbox.SandboxFusionClient

KEY = "sandbox-key-for-the-tests-0123456789"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Served:
    url: str  #: .../run_code
    port: int
    pool: Sandbox


def _serve(app: object) -> tuple[uvicorn.Server, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the sandbox server did not start"
        time.sleep(0.05)
    return server, port


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """The app on a pool of two fork servers that may import numpy, as ``rlvr sandbox serve`` runs it."""
    paths = default_import_paths()
    with Sandbox(num_workers=2, timeout=10.0, memory_mb=1024, use_bwrap=False, extra_paths=paths) as pool:
        server, port = _serve(create_app(pool, limits=Limits(max_run_timeout=120, memory_mb=1024)))
        yield Served(f"http://127.0.0.1:{port}/run_code", port, pool)
        server.should_exit = True


def cookbook_run(url: str, code: str, files: dict[str, str] | None = None, timeout: float = 10,
                 language: str = "python") -> tuple[bool, dict]:
    """One call of tinker-cookbook's client, as its code grading makes it."""
    async def call() -> tuple[bool, dict]:
        client = SandboxFusionClient(url=url)
        try:
            return await client.run(code=code, files=files or {}, timeout=timeout, language=language)
        finally:
            await client.close()
    return asyncio.run(call())


# -- tinker-cookbook's SandboxFusionClient ------------------------------------------------------------------------


def test_cookbook_client_passing_program_with_files(served: Served) -> None:
    code = "from helper import greet\nprint(greet(open('name.txt').read()))\n"
    ok, data = cookbook_run(served.url, code, {"helper.py": "def greet(n):\n    return 'hello ' + n\n",
                                               "name.txt": "rlvr"})
    assert ok, data
    assert (data["status"], data["run_result"]["status"], data["run_result"]["return_code"]) == (
        "Success", "Finished", 0)
    assert data["run_result"]["stdout"] == "hello rlvr\n" and data["compile_result"] is None
    assert data["run_result"]["execution_time"] > 0


def test_cookbook_client_failing_program(served: Served) -> None:
    ok, data = cookbook_run(served.url, "import sys\nprint('wrong')\nsys.exit(-1)\n")
    assert not ok
    assert (data["status"], data["run_result"]["status"], data["run_result"]["return_code"]) == (
        "Failed", "Finished", 255)
    ok, data = cookbook_run(served.url, "raise ValueError('no')")
    assert not ok and data["run_result"]["return_code"] == 1 and "ValueError: no" in data["run_result"]["stderr"]


def test_cookbook_client_timeout(served: Served) -> None:
    started = time.monotonic()
    ok, data = cookbook_run(served.url, "print('begun', flush=True)\nwhile True:\n    pass\n", timeout=1)
    assert not ok and time.monotonic() - started < 4
    assert (data["status"], data["run_result"]["status"], data["run_result"]["return_code"]) == (
        "Failed", "TimeLimitExceeded", None)
    assert data["run_result"]["stdout"] == "begun\n"


def test_another_language_is_refused_by_name(served: Served) -> None:
    ok, data = cookbook_run(served.url, "int main() { return 0; }", language="cpp")
    assert not ok and data["status"] == "SandboxError"
    assert "language='cpp'" in data["error"] and "Python only" in data["error"]


@pytest.mark.parametrize("attack", ["call_the_server", "kill_the_server", "write_outside", "fork"])
def test_a_hostile_program_is_contained(served: Served, attack: str, tmp_path: Path) -> None:
    """Each attack aims at the machine serving it: posting to its own /run_code (a program that spawns programs),
    killing the server process, writing outside its folder, forking. Each fails; the server answers the next call."""
    target = tmp_path / "pwned.txt"
    programs = {
        "call_the_server": (f"import urllib.request\nurllib.request.urlopen(urllib.request.Request({served.url!r}, "
                            "data=b'{\"code\": \"print(1)\", \"language\": \"python\"}', "
                            "headers={'Content-Type': 'application/json'}), timeout=2)\nprint('reached')"),
        "kill_the_server": f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint('reached')",
        "write_outside": f"open({str(target)!r}, 'w').write('x')\nprint('reached')",
        "fork": "import os\npid = os.fork()\nprint('reached')",
    }
    ok, data = cookbook_run(served.url, programs[attack])
    assert not ok and data["status"] == "Failed", data
    assert data["run_result"]["return_code"] == 1 and "reached" not in data["run_result"]["stdout"]
    assert not target.exists()
    assert cookbook_run(served.url, "print(6 * 7)")[1]["run_result"]["stdout"] == "42\n"


def test_two_hundred_concurrent_requests_are_all_answered(served: Served) -> None:
    """200 requests at once on a pool of 2 (a few of them slow): each is answered with its own output, none dropped,
    and the slow ones do not hold up the rest."""
    async def main() -> list[tuple[bool, dict]]:
        client = SandboxFusionClient(url=served.url, max_concurrency=200)
        try:
            calls = [client.run(code=(f"import time\ntime.sleep(1.5)\nprint({i})" if i % 50 == 0 else f"print({i})"),
                                files={}, timeout=10) for i in range(200)]
            return await asyncio.gather(*calls)
        finally:
            await client.close()

    started = time.monotonic()
    results = asyncio.run(main())
    assert [data["run_result"]["stdout"] for _, data in results] == [f"{i}\n" for i in range(200)]
    assert all(ok for ok, _ in results)
    assert time.monotonic() - started < 60


# -- verl's SandboxFusion reward -----------------------------------------------------------------------------------


def verl_call(url: str, code: str, stdin: str | None, timeout: int = 10, language: str = "python") -> dict:
    """The request verl's ``call_sandbox_api`` (verl/utils/reward_score/sandbox_fusion/utils.py) sends: a JSON string
    body with these fields and headers, through ``requests``; 2xx answers are read as JSON."""
    payload = json.dumps({"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
                          "memory_limit_MB": 1024, "language": language, "files": {}, "fetch_files": []})
    response = requests.post(url, headers={"Content-Type": "application/json", "Accept": "application/json"},
                             data=payload, timeout=2 * timeout + 10)
    response.raise_for_status()
    return response.json()


def verl_verdict(response: dict, expected_output: str | None) -> bool | int:
    """verl's ``_process_single_case`` reading of a response: True/False on the output, -1 sandbox error, -2 runtime
    error, -3 timeout, -4 compile error."""
    status, compile_result, run = response.get("status"), response.get("compile_result"), response.get("run_result")
    if status == "SandboxError":
        return -1
    if status == "Failed":
        if compile_result and (compile_result.get("status") in ("Error", "TimeLimitExceeded")
                               or compile_result.get("return_code") != 0):
            return -4
        if run and run.get("status") == "TimeLimitExceeded":
            return -3
        if run and (run.get("status") == "Error" or run.get("return_code") != 0):
            return -2
        return -1
    if status == "Success" and run and run.get("status") == "Finished":
        return expected_output is None or run["stdout"].rstrip("\n") == expected_output.rstrip("\n")
    return -1


SUM_TWO = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_verl_request_shape_right_and_wrong_answers(served: Served) -> None:
    assert verl_verdict(verl_call(served.url, SUM_TWO, "2 3\n"), "5\n") is True
    assert verl_verdict(verl_call(served.url, SUM_TWO, "2 3\n"), "6\n") is False
    assert verl_verdict(verl_call(served.url, SUM_TWO, "two three\n"), "5\n") == -2
    assert verl_verdict(verl_call(served.url, "while True:\n    pass\n", None, timeout=1), "5\n") == -3
    assert verl_verdict(verl_call(served.url, "fn main() {}", None, language="rust"), None) == -1


def test_verl_function_call_wrapper_runs(served: Served) -> None:
    """verl wraps a function-style solution in a script that imports many modules with ``from m import *`` and reads
    JSON arguments from stdin; the wrapper's shape, reduced to what it relies on."""
    wrapper = ("from string import *\nfrom collections import *\nfrom sys import *\nfrom json import *\n"
               "import sys, json\n"
               "def add(a, b):\n    return a + b\n"
               "if __name__ == '__main__':\n"
               "    args = [json.loads(line) for line in sys.stdin.read().split('\\n')]\n"
               "    print(json.dumps(add(*args)))\n")
    assert verl_verdict(verl_call(served.url, wrapper, "[1, 2]\n[3]"), "[1, 2, 3]") is True


# -- tinker-cookbook's code grading --------------------------------------------------------------------------------

PROBLEMS = [  # LiveCodeBench-style test cases, as the code_rl recipe's dataset gives them
    [{"input": "2 3\n", "output": "5\n", "testtype": "stdin_stdout", "metadata": {}},
     {"input": "10 -4\n", "output": "6\n", "testtype": "stdin_stdout", "metadata": {}}],
    [{"input": "[1, 2, 3]", "output": "6", "testtype": "functional", "metadata": {"func_name": "total"}},
     {"input": "[]", "output": "0", "testtype": "functional", "metadata": {"func_name": "total"}}],
]


def test_cookbook_code_grading_on_local_problems(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    grading = pytest.importorskip("tinker_cookbook.recipes.code_rl.code_grading")
    monkeypatch.setenv("SANDBOX_URL", served.url)
    monkeypatch.setattr(grading, "_sandboxfusion_client", None)  # built from SANDBOX_URL on first use
    answers = [
        (PROBLEMS[0], "```python\nimport sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n```", True),
        (PROBLEMS[0], "```python\na, b = map(int, input().split())\nprint(a - b)\n```", False),
        (PROBLEMS[0], "```python\nwhile True:\n    pass\n```", False),
        (PROBLEMS[1], "```python\nclass Solution:\n    def total(self, xs):\n        return sum(xs)\n```", True),
        (PROBLEMS[1], "```python\nclass Solution:\n    def total(self, xs):\n        return len(xs)\n```", False),
    ]

    async def grade() -> list[bool]:
        try:
            return [(await grading.sandbox_check_correctness(tests, grading.extract_code_from_model(reply),
                                                             timeout=1))[0] for tests, reply, _ in answers]
        finally:
            await grading._get_sandboxfusion_client().close()

    assert asyncio.run(grade()) == [want for _, _, want in answers]


# -- the server's own checks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "field"), [
    ({"run_timeout": 1000}, "run_timeout=1000"), ({"run_timeout": 0}, "run_timeout=0"),
    ({"memory_limit_MB": 4096}, "memory_limit_MB=4096"), ({"files": {"a.txt": "not base64!"}}, "files['a.txt']"),
    ({"files": {"../a.txt": ""}}, "files['../a.txt']"),
    ({"fetch_files": ["/etc/passwd"]}, "fetch_files['/etc/passwd']"),
])
def test_a_request_that_cannot_run_is_a_sandbox_error_naming_its_field(served: Served, change: dict,
                                                                       field: str) -> None:
    body = {"code": "print(1)", "language": "python", **change}
    data = requests.post(served.url, json=body, timeout=10).json()
    assert data["status"] == "SandboxError" and data["message"].startswith(field), data


def test_to_job_reads_sandboxfusion_fields() -> None:
    request = RunCodeRequest(code="print(1)", language="python", run_timeout=3, memory_limit_MB=256, stdin="x",
                             files={"d/f.txt": base64.b64encode(b"data").decode(), "skipped": None},
                             fetch_files=["out.txt"])
    job = to_job(request, Limits())
    assert (job.timeout, job.memory_mb, job.stdin, dict(job.files), job.fetch_files) == (
        3, 256, "x", {"d/f.txt": b"data"}, ("out.txt",))
    assert to_job(RunCodeRequest(code="", language="python"), Limits()).memory_mb is None  # -1: the server's


def test_fetch_files_come_back_as_base64(served: Served) -> None:
    body = {"code": "open('out.bin', 'wb').write(bytes(range(5)))", "language": "python", "fetch_files": ["out.bin"]}
    data = requests.post(served.url, json=body, timeout=10).json()
    assert data["status"] == "Success" and base64.b64decode(data["files"]["out.bin"]) == bytes(range(5))


def test_with_a_key_only_keyed_requests_run(served: Served) -> None:
    server, port = _serve(create_app(served.pool, [KEY]))
    try:
        url = f"http://127.0.0.1:{port}/run_code"
        assert requests.post(url, json={"code": "print(1)", "language": "python"}, timeout=10).status_code == 401
        ok, data = cookbook_run(url, "print(1)")
        assert not ok and data["error"].startswith("HTTP 401")
        ok, data = cookbook_run(f"{url}?api_key={KEY}", "print(2)")  # the cookbook client sends no headers of its own
        assert ok and data["run_result"]["stdout"] == "2\n"
        keyed = requests.post(url, json={"code": "print(3)", "language": "python"}, headers={"X-API-Key": KEY},
                              timeout=10)
        assert keyed.json()["run_result"]["stdout"] == "3\n"
        assert requests.get(f"http://127.0.0.1:{port}/v1/ping", timeout=10).json() == "pong"
    finally:
        server.should_exit = True


# -- the command -------------------------------------------------------------------------------------------------


CLI = [sys.executable, "-c", "from rlvr.cli import app; app()", "sandbox", "serve"]


def test_the_command_serves_run_code() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([*CLI, "--port", str(port), "--workers", "1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v1/ping", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "rlvr sandbox serve did not come up"
            time.sleep(0.2)
        program = "import numpy as np\nprint(int(np.arange(5).sum()), input())"  # the cookbook's harness needs numpy
        data = verl_call(f"http://127.0.0.1:{port}/run_code", program, "piped")
        assert (data["status"], data["run_result"]["stdout"]) == ("Success", "10 piped\n"), data
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_command_refuses_an_open_public_address() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RLVR_SANDBOX_API_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run([*CLI, "--host", "0.0.0.0", "--port", str(free_port())], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "without an API key would run anyone's code" in done.stderr
