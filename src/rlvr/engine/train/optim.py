"""A training client's optimizer, chosen when the client is created and fixed for its life, as in Tinker: AdamW
(``types.AdamOptimizerConfig``, the default) or Dimuon (``types.DimuonOptimizerConfig``, ``dimuon.py``).

Each ``optim_step`` brings the hyperparameters of its optimizer (``types.AdamParams`` or ``types.DimuonParams``, which
may change from one step to the next, e.g. for a learning-rate schedule); the other kind is refused by name. AdamW is
``torch.optim.AdamW`` with decoupled weight decay and global-norm gradient clipping.

Not here: Dimuon's math (``dimuon.py``), the checkpoint files (``checkpoint.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tinker import types

from rlvr.engine.train.dimuon import Dimuon
from rlvr.errors import ConfigurationError

Optimizer = torch.optim.AdamW | Dimuon

KINDS = ("adamw", "dimuon")
"""The optimizers by Tinker's ``optimizer_config.type``."""

_PARAMS = {"adamw": "types.AdamParams", "dimuon": "types.DimuonParams"}
_CONFIGS = {"adamw": "types.AdamOptimizerConfig()", "dimuon": "types.DimuonOptimizerConfig()"}


def kind_of_config(config: Any) -> str:
    """``"adamw"`` or ``"dimuon"`` for an ``optimizer=`` argument (None: AdamW, Tinker's default), or a refusal."""
    if config is None:
        return "adamw"
    kind = getattr(config, "type", None)
    if kind not in KINDS:
        raise ConfigurationError(f"optimizer={config!r}: rlvr has AdamW (types.AdamOptimizerConfig()) and Dimuon "
                                 "(types.DimuonOptimizerConfig()); pass one of them, or none for AdamW")
    version = getattr(config, "version", None) if kind == "dimuon" else None
    if kind == "dimuon" and version not in (None, 1):
        raise ConfigurationError(f"optimizer=DimuonOptimizerConfig(version={version!r}): rlvr implements version 1")
    return kind


def make_optimizer(params: list[torch.nn.Parameter], kind: str = "adamw", rank: int = 32) -> Optimizer:
    """The optimizer ``kind`` over ``params`` (a LoRA adapter's, of ``rank``); hyperparameters come with each step."""
    if kind == "dimuon":
        return Dimuon(params, rank)
    return torch.optim.AdamW(params, lr=0.0, foreach=False)


def kind_of(optimizer: Optimizer) -> str:
    return "dimuon" if isinstance(optimizer, Dimuon) else "adamw"


def config_of(optimizer: Optimizer) -> types.AdamOptimizerConfig | types.DimuonOptimizerConfig:
    """Tinker's ``optimizer_config`` for ``optimizer`` (what ``get_info`` reports)."""
    return types.DimuonOptimizerConfig() if isinstance(optimizer, Dimuon) else types.AdamOptimizerConfig()


def kind_of_params(params: Any) -> str:
    """Which optimizer an ``optim_step``'s params are for, or a refusal naming what rlvr takes."""
    if isinstance(params, types.AdamParams):
        return "adamw"
    if getattr(params, "type", None) == "dimuon":
        return "dimuon"
    raise ConfigurationError(f"optim_step takes types.AdamParams (AdamW) or types.DimuonParams (Dimuon), got "
                             f"{type(params).__name__}{f' of type {params.type!r}' if hasattr(params, 'type') else ''}")


def check_params_for(kind: str, params: Any) -> None:
    """Refuse ``params`` for an optimizer of another ``kind``, naming both and the fix."""
    given = kind_of_params(params)
    if given != kind:
        raise ConfigurationError(
            f"optim_step got {_PARAMS[given]}, but this training client was created with optimizer="
            f"{_CONFIGS[kind]}, which takes {_PARAMS[kind]}: pass {_PARAMS[kind]}(learning_rate=...), or create a "
            f"client with optimizer={_CONFIGS[given]} (the optimizer is fixed when the client is created)")


def step(optimizer: Optimizer, params: Any) -> dict[str, float]:
    """One step of ``optimizer`` with ``params`` (refused when they are another optimizer's); its metrics."""
    check_params_for(kind_of(optimizer), params)
    if isinstance(optimizer, Dimuon):
        return optimizer.step(params)
    check_adam_params(params)
    return adam_step(optimizer, params)


def check_adam_params(adam: types.AdamParams) -> None:
    for field in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
        value = getattr(adam, field)
        if not math.isfinite(value) or value < 0:
            raise ConfigurationError(f"AdamParams.{field} must be a finite number >= 0, got {value}")
    if not (adam.beta1 < 1 and adam.beta2 < 1):
        raise ConfigurationError(f"AdamParams betas must be < 1, got beta1={adam.beta1}, beta2={adam.beta2}")


def adam_step(optimizer: torch.optim.AdamW, adam: types.AdamParams) -> dict[str, float]:
    """Clip gradients to ``grad_clip_norm`` (0 = no clipping), take one AdamW step, zero the gradients.

    Returns metrics: ``grad_norm:mean`` (the global norm before clipping) and ``learning_rate:mean``.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(p.grad is None for p in params):
        raise ConfigurationError("optim_step was called with no gradients accumulated; call forward_backward first")
    for p in params:  # A parameter that received no gradient this step still takes its decay and moment updates.
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    for group in optimizer.param_groups:
        group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                     weight_decay=adam.weight_decay)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"grad_norm:mean": grad_norm, "learning_rate:mean": adam.learning_rate}
