"""RayRewardRunner: the in-process runner's scores and counted failures, actor deaths retried, clear errors for
rewards that cannot travel."""

import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from rlvr.distributed.rewards import RayRewardRunner  # noqa: E402
from rlvr.errors import ConfigurationError  # noqa: E402
from rlvr.rewards import RewardItem, RewardRunner, resolve_reward  # noqa: E402
from rlvr.rewards.registry import Reward  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster

# The rewards below are defined in this test module, which Ray's workers cannot import: send them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def picky(prompt, response, meta=None) -> float:
    """Length of the response; raises on 'boom', hangs on 'hang'."""
    if response == "boom":
        raise ValueError("cannot judge this")
    if response == "hang":
        time.sleep(60)
    return float(len(response))


def slow_length(prompt, response, meta=None) -> float:
    time.sleep(0.25)
    return float(len(response))


def items(responses):
    return [RewardItem("q", r, {"answer": "4"}) for r in responses]


def test_scores_and_failures_match_the_in_process_runner(ray_cluster):
    reward = resolve_reward("combine", rewards={picky: 1.0, "math_correct": 2.0})
    batch = items(["4", "boom", "the answer is 4", "hang", "5", "44", "boom"])
    with RewardRunner(reward, timeout=1.0, num_workers=2) as runner:
        local = runner.score(batch)
    with RayRewardRunner(reward, timeout=1.0, num_workers=3) as runner:
        remote = runner.score(batch)
        assert runner.score([]).scores == []
    assert remote.scores == local.scores
    assert remote.parts == local.parts
    assert [(f.index, f.reward, f.kind) for f in remote.failures] == [(f.index, f.reward, f.kind)
                                                                       for f in local.failures]
    assert remote.metrics() == local.metrics()
    assert remote.errors == 2 and remote.timeouts == 1  # counted, never scored 0


def test_a_reward_worker_that_dies_mid_batch_is_restarted_and_its_chunk_retried(ray_cluster):
    batch = items([f"{'x' * n}" for n in range(8)])
    with RayRewardRunner(slow_length, timeout=5.0, num_workers=2) as runner:
        victim = runner.replicas.handles[0]
        threading.Timer(0.4, lambda: ray.kill(victim, no_restart=False)).start()  # while it scores items 0-3
        scores = runner.score(batch)
        assert scores.scores == [float(n) for n in range(8)]
        assert not scores.failures
        assert runner.distributed_metrics() == {"distributed/reward_restarts": 1.0,
                                                "distributed/reward_retries": 1.0}


def test_a_restart_while_idle_is_counted_too(ray_cluster, kill_and_wait):
    with RayRewardRunner(picky, timeout=5.0, num_workers=1) as runner:
        assert runner.score(items(["ab"])).scores == [2.0]
        victim = runner.replicas.handles[0]
        kill_and_wait(victim, runner.replicas.incarnations[0].pid)
        deadline = time.monotonic() + 60
        while True:  # wait until Ray has restarted it, so no request of ours ever fails
            try:
                ray.get(victim.ready.remote(), timeout=10)
                break
            except ray.exceptions.RayActorError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert runner.score(items(["abc"])).scores == [3.0]
        assert runner.distributed_metrics() == {"distributed/reward_restarts": 1.0,
                                                "distributed/reward_retries": 0.0}


class HoldsALock(Reward):
    name = "holds_a_lock"

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, prompt, response, meta=None) -> float:
        return 0.0


def test_a_reward_that_cannot_be_pickled_is_a_configuration_error(ray_cluster):
    with pytest.raises(ConfigurationError, match="reward 'holds_a_lock' cannot be sent to Ray reward workers"):
        RayRewardRunner(HoldsALock())


def test_a_reward_the_workers_cannot_import_is_a_configuration_error(ray_cluster, tmp_path, monkeypatch):
    (tmp_path / "only_here_rewards.py").write_text("def only_here(prompt, response, meta=None):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from only_here_rewards import only_here

    runner = RayRewardRunner(only_here, num_workers=1)
    with pytest.raises(ConfigurationError, match="reward 'only_here' could not be loaded in a Ray reward worker"):
        runner.start()
