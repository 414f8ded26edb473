"""Fork servers come back when they die, and go away when the trainer does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rlvr.sandbox import Sandbox

SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_dead_fork_server_is_restarted_and_its_job_reported_as_error() -> None:
    with Sandbox(num_workers=1, timeout=5.0, use_bwrap=False) as pool:
        (victim,) = pool.server_pids()
        killer = threading.Timer(0.3, os.kill, (victim, signal.SIGKILL))
        killer.start()
        try:
            result = pool.run("import time\ntime.sleep(3)", ["assert True"])
        finally:
            killer.cancel()
        assert result.status == "error" and "died" in result.stderr_tail, result
        assert pool.restarts == 1 and pool.server_pids() != [victim]
        assert pool.run("x = 1", ["assert x == 1"]).passed


def test_jobs_queued_behind_a_dying_server_still_run() -> None:
    with Sandbox(num_workers=1, timeout=5.0, use_bwrap=False) as pool:
        (victim,) = pool.server_pids()
        killer = threading.Timer(0.3, os.kill, (victim, signal.SIGKILL))
        killer.start()
        try:
            results = pool.run_many([{"code": "import time\ntime.sleep(3)", "tests": []}]
                                    + [{"code": f"x = {i}", "tests": [f"assert x == {i}"]} for i in range(3)])
        finally:
            killer.cancel()
        assert results[0].status == "error"
        assert all(r.passed for r in results[1:]), results


def test_fork_servers_and_jobs_exit_when_the_trainer_is_killed() -> None:
    """SIGKILL the process that owns a Sandbox mid-job: its servers and their job must not linger."""
    driver = (
        "import os, sys, types\n"
        f"sys.path.insert(0, {str(SRC)!r})\n"
        "package = types.ModuleType('rlvr')\n"
        f"package.__path__ = [{str(SRC / 'rlvr')!r}]\n"
        "sys.modules['rlvr'] = package\n"  # skip rlvr/__init__.py and its heavy imports
        "from rlvr.sandbox import Sandbox\n"
        "pool = Sandbox(num_workers=2, timeout=30.0, use_bwrap=False)\n"
        "print(pool._root, *pool.server_pids(), flush=True)\n"
        "pool.run('import time\\ntime.sleep(30)', [])\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    try:
        root, *pids = trainer.stdout.readline().split()
        servers = [int(pid) for pid in pids]
        assert len(servers) == 2
        time.sleep(0.3)  # let the sleeping job start
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in servers):
            time.sleep(0.05)
        assert not [pid for pid in servers if os.path.exists(f"/proc/{pid}")], "fork servers outlived the trainer"
        with Sandbox(num_workers=1, use_bwrap=False):  # the next Sandbox deletes what the killed one left
            assert not os.path.exists(root)
    finally:
        if trainer.poll() is None:
            trainer.kill()
