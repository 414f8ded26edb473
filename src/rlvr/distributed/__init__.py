"""The Ray backend: the same RL loop with its trainer, samplers and reward workers in Ray actors (``rlvr[ray]``).

    from rlvr.rl import DistributedConfig, LoopConfig, train
    train(LoopConfig(..., distributed=DistributedConfig(backend="ray", num_samplers=2, num_reward_workers=2)), source)

What it is: :func:`ray_backend` starts one trainer actor (an in-process ``rlvr`` engine holding the LoRA adapter and
its optimizer), ``num_samplers`` sampler actors (each the base model plus the adapters published to it) and
``num_reward_workers`` reward actors, and returns two objects the loop already knows how to drive: a Tinker-shaped
service client (``clients``) and a reward runner with ``score(items) -> BatchScores`` (``rewards``). The loop runs
on them unchanged, with:

- the same numbers: a seeded run gives the in-process run's metrics (sampling seeds travel with each request, so
  which replica serves a request does not matter; see tests/distributed for the tolerance and why);
- verified weight publication: the trainer hashes each published adapter, every sampler hashes what it loaded,
  and any mismatch, or a request for weights a replica holds in another version, is a ``SamplingError``;
- fault handling: a sampler or reward actor that dies is restarted by Ray and its work is sent again (a restarted
  sampler first reloads the newest adapter); deaths and re-sent requests are counted in each step's metrics
  (``distributed/sampler_restarts|retries``, ``distributed/reward_restarts|retries``, cumulative; from
  ``service.distributed_metrics()``);
- a small footprint: actors ask Ray for no CPUs (``num_cpus=0``) and the trainer and rlvr's sampler actors split
  their node's cores between them (each takes ``1 / (1 + num_samplers)``, ``torch.set_num_threads``), so everything
  fits on ``ray.init(num_cpus=2)``. Sampler and reward actors are placed with Ray's ``SPREAD`` strategy; published
  adapters travel through Ray's object store; ``RLVR_HOME``, when set, is forwarded to the actors.

Samplers on vLLM: ``DistributedConfig(backend="ray", sampler="vllm")`` starts ``vllm_sampler.VLLMSampler`` replicas
instead (``rlvr[vllm]``; one GPU each when the cluster has GPUs): the same methods, the same hash check of the files
that arrive, a fresh LoRA id per publication, and the loop's logprob probe after each publication to prove vLLM
serves the new adapter.

What it is not: a fault-tolerant trainer (a dead trainer actor is a ``WorkerLostError``; resume from the last
checkpoint with ``resume=True``), an FSDP2 trainer (the slot where one would replace ``TrainerActor`` is described
in docs/distributed.md; not implemented), or needed at all: ``import rlvr`` and the loop work without Ray, and
asking for the Ray backend without it installed says ``pip install 'rlvr[ray]'``.

Files: ``clients.py`` (the Tinker-shaped service, training and sampling clients the loop drives), ``actors.py``
(trainer and sampler actors), ``rewards.py`` (reward actors and ``RayRewardRunner``), ``weights.py`` (adapter files
and content hashes), ``cluster.py`` (starting Ray, restartable actors, restart counting), ``futures.py`` (Tinker
futures over actor calls, re-sent after a restart), ``vllm_sampler.py`` (the vLLM replica). Multi-node launch, what
is tested where, and what the backend costs on one machine: docs/distributed.md.
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
