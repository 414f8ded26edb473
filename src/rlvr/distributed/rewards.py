"""Reward scoring on Ray: :class:`RayRewardRunner` spreads each batch over reward worker actors.

What it is: the Ray counterpart of ``rlvr.rewards.RewardRunner``, with the same ``score(items) -> BatchScores`` and
context-manager lifetime. Each :class:`RewardActor` runs an ordinary ``RewardRunner`` (one killable forked worker,
the same per-call timeout; inline rewards such as ``code_tests`` run through the actor's own sandbox), so scores,
parts and counted failures are exactly what the in-process runner gives; the batch is cut into one contiguous chunk
per actor and the chunks' results are joined in order. A reward actor that dies is restarted by Ray and its chunk
scored again (rewards are pure functions of their item, so this is safe); ``distributed_metrics()`` counts
``distributed/reward_restarts`` and ``distributed/reward_retries``.

The reward travels to the actors with cloudpickle, as Ray sends everything. Rewards resolved by name from the
registry, and functions in importable modules, travel; a reward holding an open sandbox, a lock or a file does not,
and one defined in a module the workers cannot import fails there. Both are a ConfigurationError naming the reward.

What it is not: the reward functions or the timeout machinery (``rlvr.rewards``). This module does not import torch,
so reward actors start in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlvr.distributed.cluster import MAX_RESTARTS, Replicas, RestartableActor, import_ray
from rlvr.errors import ConfigurationError
from rlvr.rewards.registry import Reward, RewardFn, RewardItem, as_item, resolve_reward
from rlvr.rewards.runner import BatchScores, RewardRunner


def ship_reward(reward: Reward) -> bytes:
    """``reward`` as cloudpickle bytes, or a ConfigurationError naming it and saying how to make it shippable."""
    from ray import cloudpickle

    try:
        return cloudpickle.dumps(reward)
    except Exception as exc:
        raise ConfigurationError(
            f"reward {reward.name!r} cannot be sent to Ray reward workers: cloudpickle failed with "
            f"{type(exc).__name__}: {exc}. Use a reward registered by name in an importable module (@register_reward), "
            "or keep unpicklable things (an open Sandbox, locks, files) out of its attributes; or use "
            "distributed.backend='local'") from exc


class RewardActor(RestartableActor):
    """One reward worker: a RewardRunner (one forked worker) around the shipped reward."""

    def __init__(self, blob: bytes, name: str, timeout: float) -> None:
        super().__init__()
        self._error: str | None = None
        self._runner: RewardRunner | None = None
        try:
            from ray import cloudpickle

            reward = cloudpickle.loads(blob)
            self._runner = RewardRunner(reward, timeout=timeout, num_workers=1)
        except Exception as exc:  # reported by ready(), where the driver turns it into a ConfigurationError
            self._error = (f"reward {name!r} could not be loaded in a Ray reward worker: {type(exc).__name__}: "
                           f"{exc}. Its code must be importable on every node (install the package defining it, "
                           "or pass it by value with ray.cloudpickle.register_pickle_by_value)")

    def ready(self) -> dict[str, Any]:
        if self._error is not None:
            raise ConfigurationError(self._error)
        return super().ready()

    def score(self, items: list[RewardItem]) -> BatchScores:
        assert self._runner is not None, self._error
        return self._runner.score(items)


class RayRewardRunner:
    """Scores batches on ``num_workers`` Ray reward actors; a drop-in for ``RewardRunner`` (see module docstring).

    Args:
        reward_fn: a reward name, :class:`Reward` or function, resolved as ``RewardRunner`` does.
        timeout: wall-clock seconds per reward call, enforced inside each actor.
        num_workers: reward actors.
        name: prefix of the actors' Ray names (``ray list actors``); default ``rlvr-<random>``.
    """

    def __init__(self, reward_fn: str | Reward | RewardFn, *, timeout: float = 10.0, num_workers: int = 2,
                 name: str | None = None) -> None:
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ConfigurationError(f"RayRewardRunner(num_workers={num_workers!r}): must be an int >= 1")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ConfigurationError(f"RayRewardRunner(timeout={timeout!r}): must be a positive number of seconds")
        self.ray = import_ray()
        self.reward = resolve_reward(reward_fn)
        self.timeout = float(timeout)
        self.num_workers = num_workers
        self._blob = ship_reward(self.reward)
        self.name = name or f"rlvr-{uuid.uuid4().hex[:8]}"
        self._replicas: Replicas | None = None
        self._starts = 0
        self._restarts = 0
        self._retries = 0

    # -- lifetime --------------------------------------------------------------------------------------------------
    def start(self) -> RayRewardRunner:
        """Start the actors (done on first use too); a reward that cannot load there raises ConfigurationError."""
        if self._replicas is None:
            self._starts += 1
            actor = self.ray.remote(RewardActor)
            handles = [actor.options(name=f"{self.name}-reward-{self._starts}-{i}", num_cpus=0,
                                     max_restarts=MAX_RESTARTS, max_task_retries=0, scheduling_strategy="SPREAD"
                                     ).remote(self._blob, self.reward.name, self.timeout)
                       for i in range(self.num_workers)]
            try:
                self._replicas = Replicas("reward", handles)
            except BaseException:
                for handle in handles:
                    self.ray.kill(handle, no_restart=True)
                raise
        return self

    @property
    def replicas(self) -> Replicas:
        """The reward actors (started if needed): their handles, incarnations and fault counters."""
        self.start()
        assert self._replicas is not None
        return self._replicas

    def close(self) -> None:
        """End the actors. Idempotent; the runner starts new ones if used again (counters carry on)."""
        if self._replicas is not None:
            self._restarts += self._replicas.restarts
            self._retries += self._replicas.retries
            for handle in self._replicas.handles:
                self.ray.kill(handle, no_restart=True)
            self._replicas = None

    def __enter__(self) -> RayRewardRunner:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- scoring ---------------------------------------------------------------------------------------------------
    def score(self, items: Iterable[RewardItem | Mapping[str, Any] | Sequence[Any]]) -> BatchScores:
        """Score ``items``: one chunk per actor, joined in order; failures counted exactly as RewardRunner does."""
        batch = [as_item(item) for item in items]
        started = time.monotonic()
        if not batch:
            return BatchScores(scores=[])
        replicas = self.replicas
        size = -(-len(batch) // self.num_workers)
        chunks = [batch[k:k + size] for k in range(0, len(batch), size)]
        futures = [replicas.future(i, "score", chunk) for i, chunk in enumerate(chunks)]
        merged = BatchScores(scores=[])
        for chunk, future in zip(chunks, futures, strict=True):
            offset = len(merged.scores)
            part: BatchScores = future.result()
            merged.scores.extend(part.scores)
            merged.failures.extend(dataclasses.replace(f, index=f.index + offset) for f in part.failures)
            for name, values in part.parts.items():  # every chunk has the same parts: the same reward scored it
                merged.parts.setdefault(name, []).extend(values)
            assert len(part.scores) == len(chunk), (len(part.scores), len(chunk))
        merged.duration_s = time.monotonic() - started
        return merged

    def distributed_metrics(self) -> dict[str, float]:
        """Cumulative fault counters: ``distributed/reward_restarts`` (reward actor deaths, each restarted by Ray)
        and ``distributed/reward_retries`` (chunks scored again because their actor died)."""
        restarts, retries = self._restarts, self._retries
        if self._replicas is not None:
            restarts += self._replicas.restarts
            retries += self._replicas.retries
        return {"distributed/reward_restarts": float(restarts), "distributed/reward_retries": float(retries)}
