"""The RL loop library: environments, rollouts, advantages and the training loops, driving only the client API.

    from rlvr.rl import LoopConfig, train

    result = train(LoopConfig(base_model="smollm2-135m", steps=30, out="runs/arith"), source)

The names in ``__all__`` are its public face, each defined in one module and imported here on first use (so that
``rlvr.rl.config``, which the run application's config checks import, loads no torch): ``config`` (``LoopConfig``,
``DistributedConfig``), ``loop`` (the training loop, a function per mode), ``envs`` (``Env``, ``EnvGroupBuilder``,
``RLDataset``, how a batch plays (``Play``, ``TurnByTurn``) and what a rollout records), ``protocols`` (the client
API the loop is typed against: ``ServiceAPI``, ``TrainingAPI``, ``SamplingAPI``), ``phases`` (the sampler checks),
``problems`` (``curriculum_problems``) and ``advantages`` (``group_advantages``).

Not here: the run application (``rlvr.app``: ``rlvr.train``, recipes, config files, run folders) and the
integrations (``rlvr.integrations``: textarena, verifiers, TenSafe), which sit on this library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlvr.rl.advantages import group_advantages
    from rlvr.rl.config import DistributedConfig, LoopConfig
    from rlvr.rl.envs import (
        Env,
        EnvGroupBuilder,
        Play,
        RLDataset,
        StepResult,
        Trajectory,
        TrajectoryGroup,
        Transition,
        TurnByTurn,
    )
    from rlvr.rl.loop import train, train_off_policy, train_streamed, train_sync
    from rlvr.rl.phases import check_sampler_fresh, check_vllm_arithmetic
    from rlvr.rl.problems import curriculum_problems
    from rlvr.rl.protocols import SamplingAPI, ServiceAPI, TrainingAPI

_HOMES = {
    "DistributedConfig": "config", "LoopConfig": "config",
    "Env": "envs", "EnvGroupBuilder": "envs", "RLDataset": "envs", "StepResult": "envs", "Trajectory": "envs",
    "TrajectoryGroup": "envs", "Transition": "envs", "Play": "envs", "TurnByTurn": "envs",
    "SamplingAPI": "protocols", "ServiceAPI": "protocols", "TrainingAPI": "protocols",
    "train": "loop", "train_off_policy": "loop", "train_streamed": "loop", "train_sync": "loop",
    "check_sampler_fresh": "phases", "check_vllm_arithmetic": "phases",
    "curriculum_problems": "problems",
    "group_advantages": "advantages",
}


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'rlvr.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlvr.rl.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DistributedConfig",
    "Env",
    "EnvGroupBuilder",
    "LoopConfig",
    "Play",
    "RLDataset",
    "SamplingAPI",
    "ServiceAPI",
    "StepResult",
    "TrainingAPI",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "TurnByTurn",
    "check_sampler_fresh",
    "check_vllm_arithmetic",
    "curriculum_problems",
    "group_advantages",
    "train",
    "train_off_policy",
    "train_streamed",
    "train_sync",
]
