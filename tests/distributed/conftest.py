"""One local Ray instance for every distributed test: ``ray.init(num_cpus=2)``, as on a 2-core CI machine.

Starting Ray costs seconds, so the test modules share it (session scope). The tests that need Ray skip when it is
not installed; the ones that check what happens without it run either way.
"""

import os
import time

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def kill_and_wait(ray_cluster):
    """``kill_and_wait(handle, pid)``: kill the actor (Ray restarts it) and return once its process has ended, so
    the next call meets a dead or restarting actor rather than racing the kill."""

    def kill(handle, pid: int) -> None:
        ray_cluster.kill(handle, no_restart=False)
        deadline = time.monotonic() + 30
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            assert time.monotonic() < deadline, f"actor process {pid} still runs 30 s after ray.kill"
            time.sleep(0.01)

    return kill
