"""Compatibility names for scripts written against the TenSafe RLVR cookbook (``tg_tinker`` / ``tensafe.rlvr``).

Such a script runs on rlvr by changing its imports to::

    from rlvr.integrations.tensafe import ServiceClient, TrainingConfig, LoRAConfig
    from rlvr.integrations.tensafe import (MockRolloutSampler, PPO, PPOConfig, REINFORCE, REINFORCEConfig,
                                           TrajectoryBatch)
    from rlvr.integrations.tensafe import register_reward, resolve_reward

The package holds the cookbook's algorithm objects (``algorithms.py``: REINFORCE, PPO, GRPO, ``update(batch,
training_client)``) and PPO's learned critic (``critic.py``); this module adapts names and call shapes
(``TrainingConfig``, ``LoRAConfig``, ``Checkpoint``, a ServiceClient with ``create_training_client``). rlvr's own API
is ``rlvr.ServiceClient`` (Tinker's) and the loops of ``rlvr.rl``. ``model_ref`` is any rlvr ``base_model`` ("tiny",
"smollm2-135m", a path, a hub id).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from rlvr.client import LORA_ALPHA
from rlvr.client import ServiceClient as RlvrServiceClient
from rlvr.client import TrainingClient as RlvrTrainingClient
from rlvr.errors import ConfigurationError
from rlvr.integrations.tensafe.algorithms import (
    GRPO,
    PPO,
    REINFORCE,
    GRPOConfig,
    MockRolloutSampler,
    PPOConfig,
    REINFORCEConfig,
    ScoredAnswer,
    TrajectoryBatch,
)
from rlvr.rewards import register_reward, resolve_reward

Trajectory = ScoredAnswer
"""TenSafe's name for one scored answer (``ScoredAnswer``; rlvr's own ``envs.Trajectory`` is an episode's turns)."""

__all__ = [
    "GRPO",
    "PPO",
    "REINFORCE",
    "Checkpoint",
    "GRPOConfig",
    "LoRAConfig",
    "MockRolloutSampler",
    "PPOConfig",
    "REINFORCEConfig",
    "ScoredAnswer",
    "ServiceClient",
    "TrainingConfig",
    "Trajectory",
    "TrajectoryBatch",
    "register_reward",
    "resolve_reward",
]


@dataclass
class LoRAConfig:
    """LoRA settings in the cookbook's shape."""

    rank: int = 16
    """LoRA rank."""
    alpha: int = LORA_ALPHA
    """LoRA alpha; rlvr's adapters use alpha 32, so only 32 is accepted."""


@dataclass
class TrainingConfig:
    """A training client's settings in the cookbook's shape."""

    model_ref: str
    """The base model (any rlvr base_model)."""
    lora_config: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA settings."""
    seed: int | None = None
    """Seeds the adapter's initial weights (None: random)."""


@dataclass
class Checkpoint:
    """What ``save_state`` returns in the cookbook: an artifact id (here the rlvr:// path) and the metadata."""

    artifact_id: str
    """The checkpoint's path, usable as ``checkpoint_id`` when creating a training client."""
    metadata: dict[str, Any]
    """The metadata passed to save_state."""


class TrainingClient:
    """An rlvr TrainingClient whose ``save_state`` takes ``metadata`` and returns a ``Checkpoint`` at once."""

    _names = itertools.count()

    def __init__(self, client: RlvrTrainingClient) -> None:
        self._client = client

    def save_state(self, name: str | None = None, metadata: dict[str, Any] | None = None) -> Checkpoint:
        name = name or f"checkpoint-{next(self._names):04d}"
        path = self._client.save_state(name).result().path
        return Checkpoint(artifact_id=path, metadata=dict(metadata or {}))

    def __getattr__(self, name: str) -> Any:  # forward_backward, optim_step, forward, get_tokenizer, ...
        return getattr(self._client, name)


class ServiceClient(RlvrServiceClient):
    """rlvr's ServiceClient plus the cookbook's ``create_training_client(config, checkpoint_id=None)``."""

    def create_training_client(self, config: TrainingConfig, checkpoint_id: str | None = None) -> TrainingClient:
        if config.lora_config.alpha != LORA_ALPHA:
            raise ConfigurationError(f"LoRAConfig.alpha={config.lora_config.alpha}: rlvr's adapters use alpha "
                                     f"{LORA_ALPHA} (the update is scaled by alpha / rank); set alpha={LORA_ALPHA}")
        if checkpoint_id is not None:
            return TrainingClient(self.create_training_client_from_state_with_optimizer(checkpoint_id))
        return TrainingClient(self.create_lora_training_client(config.model_ref, rank=config.lora_config.rank,
                                                               seed=config.seed))
