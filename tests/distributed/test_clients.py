"""The Ray clients are drop-in stand-ins: they have every public method of the in-process clients, their async twins
too (runs without Ray; what the methods do is tested through the loop in test_distributed_loop.py)."""

import inspect

import pytest

from rlvr.client import SamplingClient, ServiceClient, TrainingClient
from rlvr.distributed.clients import RaySamplingClient, RayServiceClient, RayTrainingClient


@pytest.mark.parametrize(("local", "remote"), [(ServiceClient, RayServiceClient),
                                               (TrainingClient, RayTrainingClient),
                                               (SamplingClient, RaySamplingClient)])
def test_the_ray_clients_have_the_in_process_clients_methods(local, remote):
    public = {name for name in dir(local) if not name.startswith("_")}
    missing = sorted(name for name in public if not hasattr(remote, name))
    assert not missing, f"{remote.__name__} lacks {missing}"


@pytest.mark.parametrize("remote", [RayServiceClient, RayTrainingClient, RaySamplingClient])
def test_the_ray_clients_async_twins_are_coroutines_with_their_sync_calls_parameters(remote):
    twins = [name for name in dir(remote) if name.endswith("_async") and name != "result_async"]
    assert twins
    for name in twins:
        twin, sync = getattr(remote, name), getattr(remote, name.removesuffix("_async"))
        assert inspect.iscoroutinefunction(twin), name
        assert inspect.signature(twin).parameters == inspect.signature(sync).parameters, name
