"""The sandbox run by an unprivileged user (the usual laptop case), driven from this root test process.

The test starts a small driver script as uid/gid 65534 through ``setpriv`` (util-linux). The driver loads
``rlvr.sandbox`` without executing ``rlvr/__init__.py`` (whose heavy dependencies may live where that uid
cannot read), runs benign and hostile jobs, and prints what happened as JSON. A same-uid job is the
interesting case: Unix permissions no longer separate the job from its fork server and the driver, so only
Landlock, seccomp and the rlimits do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
UID = 65534

DRIVER = r"""
import json, os, sys, types
sys.path.insert(0, SRC)
package = types.ModuleType("rlvr")
package.__path__ = [os.path.join(SRC, "rlvr")]
sys.modules["rlvr"] = package
from rlvr.sandbox import Sandbox

import socket
outside = os.path.join(TARGET, "written-by-job")
agent_path = os.path.join(TARGET, "agent.sock")
agent = socket.socket(socket.AF_UNIX)
agent.bind(agent_path)
os.chmod(agent_path, 0o600)  # like ssh-agent's: only its uid may connect, and the job runs as that uid
agent.listen(1)
agent.setblocking(False)
with Sandbox(num_workers=1, timeout=2.0, use_bwrap=False) as sandbox:
    layers = {name: layer["active"] for name, layer in sandbox.layers.items()}
    pids = sandbox.server_pids()
    me = os.getpid()
    jobs = {
        "benign": ("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3"]),
        "uid": ("import os", [f"assert os.getuid() == {UID}"]),
        "fork": ("import os", ["os.fork()"]),
        "write_outside": (f"open({outside!r}, 'w').write('x')", ["assert True"]),
        "driver_environ": ("", [f"assert open('/proc/{me}/environ', 'rb').read()"]),
        "kill_server": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", ["assert True"]),
        "kill_driver": ("import os", [f"os.kill({me}, 0)"]),
        "network": ("import socket", ["socket.create_connection(('127.0.0.1', 9), timeout=0.5)"]),
        "agent": ("import socket", [f"socket.socket(socket.AF_UNIX).connect({agent_path!r})"]),
    }
    results = dict(zip(jobs, sandbox.run_many([{"code": c, "tests": t} for c, t in jobs.values()])))
    after = sandbox.run("x = 1", ["assert x == 1"])
    same_servers = sandbox.server_pids() == pids and sandbox.restarts == 0
    try:
        agent.accept()[0].close()
        agent_reached = True
    except BlockingIOError:
        agent_reached = False
with Sandbox(num_workers=1, timeout=5.0, use_bwrap=False, disk_mb=32, file_size_mb=8) as small_disk:
    fill = (
        "written = 0\n"
        "for i in range(30):\n"
        "    with open(f'f{i}', 'wb') as f:\n"
        "        f.write(bytes(8 << 20))\n"
        "    written += 8\n"
        "    print(written, flush=True)\n"
    )
    disk = small_disk.run(fill, ["assert True"])
print(json.dumps({
    "layers": layers,
    "passed": {name: r.passed for name, r in results.items()},
    "statuses": {name: r.status for name, r in results.items()},
    "same_servers": same_servers,
    "after": after.passed,
    "agent_reached": agent_reached,
    "written": os.path.exists(outside),
    "disk": {"status": disk.status, "written_mb": int((disk.stdout_tail.split() or ["0"])[-1])},
}))
"""


def _interpreter_for(uid: int) -> str | None:
    """A Python >= 3.10 that ``uid`` can run and reach by its path (pyenv under /root is not one), or None."""
    candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
    for python in dict.fromkeys(candidates):
        if not os.path.exists(python):
            continue
        check = "import os, sys; assert sys.version_info >= (3, 10) and os.access(os.path.realpath(sys.executable), 1)"
        probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-I", "-c",
                                check], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def unprivileged_run() -> dict:
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the whole suite runs the sandbox without root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed, so this test cannot switch to an unprivileged user")
    python = _interpreter_for(UID)
    if python is None:
        pytest.skip(f"no Python >= 3.10 here is executable by uid {UID}")
    check = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", python, "-I", "-c",
                            f"import os; assert os.access({str(SRC / 'rlvr' / 'sandbox' / 'server.py')!r}, os.R_OK)"],
                           capture_output=True, timeout=30)
    if check.returncode != 0:
        pytest.skip(f"uid {UID} cannot read the source tree at {SRC}")
    target = tempfile.mkdtemp(prefix="rlvr-unprivileged-")
    os.chown(target, UID, UID)  # a folder the job's own uid may write: only Landlock keeps the job out
    try:
        script = f"SRC = {str(SRC)!r}\nTARGET = {target!r}\nUID = {UID}\n" + DRIVER
        done = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", python, "-I",
                               "-c", script], capture_output=True, text=True, timeout=60, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_unprivileged_sandbox_runs_benign_jobs(unprivileged_run: dict) -> None:
    assert unprivileged_run["passed"]["benign"] and unprivileged_run["passed"]["uid"]
    assert unprivileged_run["after"]


def test_unprivileged_job_cannot_fork_or_connect(unprivileged_run: dict) -> None:
    if not unprivileged_run["layers"]["seccomp"]:
        pytest.skip("seccomp is not active for the unprivileged user here")
    assert not unprivileged_run["passed"]["fork"]
    assert not unprivileged_run["passed"]["network"]


def test_unprivileged_job_cannot_reach_its_uids_agent_socket(unprivileged_run: dict) -> None:
    if not unprivileged_run["layers"]["seccomp"]:
        pytest.skip("seccomp is not active for the unprivileged user here")
    assert not unprivileged_run["agent_reached"], "the job connected to a socket of its uid outside its folder"
    assert not unprivileged_run["passed"]["agent"]


def test_unprivileged_job_cannot_write_its_uids_files_or_read_its_driver(unprivileged_run: dict) -> None:
    if not unprivileged_run["layers"]["landlock"]:
        pytest.skip("Landlock is not active for the unprivileged user here")
    assert not unprivileged_run["written"], "the job wrote a file its uid owns outside its folder"
    assert not unprivileged_run["passed"]["driver_environ"], "the job read its driver's environment"


def test_unprivileged_disk_watchdog_stops_a_disk_filler(unprivileged_run: dict) -> None:
    disk = unprivileged_run["disk"]
    assert disk["status"] == "killed"
    assert disk["written_mb"] < 200, "the job wrote most of its 240 MiB although the limit is 32 MiB"


def test_unprivileged_job_cannot_kill_its_same_uid_server_or_driver(unprivileged_run: dict) -> None:
    assert not unprivileged_run["passed"]["kill_server"]
    assert not unprivileged_run["passed"]["kill_driver"]
    assert unprivileged_run["same_servers"], "the fork server was killed and restarted"
