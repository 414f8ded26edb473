"""The Ray backend: the same RL loop with its trainer, samplers and reward workers in Ray actors (``rlvr[ray]``).

    from rlvr.rl import DistributedConfig, LoopConfig, train
    train(LoopConfig(..., distributed=DistributedConfig(backend="ray", num_samplers=2, num_reward_workers=2)), source)

:func:`ray_backend` starts one trainer actor (an in-process engine holding the LoRA adapter and its optimizer),
``num_samplers`` sampler actors (rlvr's, or vLLM's with ``sampler="vllm"``) and ``num_reward_workers`` reward actors,
and returns a Tinker-shaped service client (``clients``) and a reward runner (``rewards``) that the loop drives
unchanged. Contract:

- the same numbers: a seeded run gives the in-process run's metrics (sampling seeds travel with each request);
- verified weights: each published adapter is hashed by the trainer and by every sampler that loads it, and a
  mismatch, or a request for weights a replica holds in another version, is a ``SamplingError``;
- faults: a dead sampler or reward actor is restarted and its work sent again, counted in each step's
  ``distributed/...`` metrics; a dead trainer is a ``WorkerLostError`` (resume from the last checkpoint);
- a small footprint: actors ask Ray for no CPUs and split their node's cores, so all fits on ``ray.init(num_cpus=2)``;
- not needed: ``import rlvr`` and the loop work without Ray; asking for it uninstalled says ``pip install
  'rlvr[ray]'``.

Files: ``clients.py`` (the clients the loop drives), ``actors.py`` (trainer and sampler actors), ``rewards.py``
(reward actors, ``RayRewardRunner``), ``weights.py`` (adapter files and hashes), ``cluster.py`` (starting Ray,
restartable actors), ``futures.py`` (futures over actor calls, re-sent after a restart), ``vllm_sampler.py``. Placement,
multi-node launch, the FSDP2 slot (not implemented) and what is tested where: ``docs/distributed.md``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Protocol

from rlvr.distributed.cluster import MAX_RESTARTS, actor_env, connect, import_ray

if TYPE_CHECKING:
    from rlvr.distributed.clients import RayServiceClient
    from rlvr.distributed.rewards import RayRewardRunner
    from rlvr.numerics import Numerics
    from rlvr.rewards.registry import Reward, RewardFn

SAMPLER_CONCURRENCY = 32
"""Requests one sampler actor accepts at once; the engine decodes the waiting ones as a batch."""


class Placement(Protocol):
    """What ray_backend reads from ``rlvr.rl.config.DistributedConfig`` (not imported: rl sits above us)."""

    address: str | None
    num_samplers: int
    num_reward_workers: int
    sampler: str
    vllm_options: dict


def ray_backend(config: Placement, reward: str | Reward | RewardFn | None, *, timeout: float = 10.0,
                seed: int | None = None, numerics: Numerics | None = None
                ) -> tuple[RayServiceClient, RayRewardRunner | None]:
    """Start the actors ``config`` (a ``DistributedConfig``) asks for; return ``(service, runner)`` for the loop.

    ``reward`` is what the runner scores with (it must survive cloudpickle: ConfigurationError otherwise, before
    any model actor starts; None: no reward actors and no runner, for envs that score themselves), ``timeout``
    the seconds per reward call, ``seed`` seeds requests that bring no seed, ``numerics`` the driver's numerics
    policy (``rlvr.numerics``; None: the driver's environment's), which the rlvr actors' engines compute by, each
    resolving it on its own machine (their thread counts are their share of it, below).
    Connects to ``config.address`` unless this process is already connected to Ray.
    """
    from rlvr.distributed.rewards import RayRewardRunner

    ray = connect(config.address)
    tag = uuid.uuid4().hex[:8]
    runner = (None if reward is None else
              RayRewardRunner(reward, timeout=timeout, num_workers=config.num_reward_workers, name=f"rlvr-{tag}"))
    from rlvr.distributed.actors import SamplerActor, TrainerActor
    from rlvr.distributed.clients import RayServiceClient
    from rlvr.numerics import Numerics

    numerics = numerics or Numerics.resolve()  # read here, in the driver: the actors compute as it asks

    env = actor_env() or None
    share = 1 + config.num_samplers  # model-holding actors on one machine split its cores
    trainer = ray.remote(TrainerActor).options(name=f"rlvr-{tag}-trainer", num_cpus=0, max_restarts=0,
                                               runtime_env=env).remote(share, numerics=numerics)
    sampler_options = {"num_cpus": 0, "max_restarts": MAX_RESTARTS, "max_task_retries": 0,
                       "max_concurrency": SAMPLER_CONCURRENCY, "scheduling_strategy": "SPREAD", "runtime_env": env}
    if getattr(config, "sampler", "rlvr") == "vllm":
        from rlvr.distributed.vllm_sampler import VLLMSampler, gpus_per_sampler

        samplers = [ray.remote(VLLMSampler).options(name=f"rlvr-{tag}-vllm-sampler-{i}", num_gpus=gpus_per_sampler(ray),
                                                    **sampler_options).remote(i, dict(config.vllm_options))
                    for i in range(config.num_samplers)]
    else:
        samplers = [ray.remote(SamplerActor).options(name=f"rlvr-{tag}-sampler-{i}", **sampler_options)
                    .remote(i, share, numerics=numerics) for i in range(config.num_samplers)]
    try:
        service = RayServiceClient(trainer, samplers, seed=seed)
        if runner is not None:
            runner.start()  # the reward actors start while the model actors import torch
            service.runners.append(runner)
    except BaseException:
        if runner is not None:
            runner.close()
        for handle in [trainer, *samplers]:
            ray.kill(handle, no_restart=True)
        raise
    return service, runner


__all__ = ["Placement", "import_ray", "ray_backend"]
