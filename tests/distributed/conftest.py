"""A local Ray instance for the distributed tests, one at a time: ``ray.init(num_cpus=2)``, as on a 2-core CI machine.

Each test module starts one and shares it between its tests (module scope; starting Ray costs a few seconds); it ends
with the module's last test, so its daemons (GCS, raylet, log monitor) leave the cores to the rest of the suite. (This
folder is not a Python package, so a "package" scope would last the whole session.) The tests that need Ray skip
when it is not installed; the ones that check what happens without it run either way.
"""

import fcntl
import os
import time

import pytest


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Ray for one module's tests. Under ``./run-tests``' two workers, a worker that reaches such a module while the
    other runs one waits for it (a lock file in the run's shared temporary folder): one Ray instance at a time."""
    ray = pytest.importorskip("ray")
    with open(tmp_path_factory.getbasetemp().parent / "ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray
        ray.shutdown()


@pytest.fixture(scope="module")
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
