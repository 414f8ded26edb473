"""The optimizer step: AdamW with decoupled weight decay and global-norm gradient clipping, driven by Tinker's
``AdamParams`` (which may change from one step to the next, e.g. for a learning-rate schedule)."""

from __future__ import annotations

import math

import torch
from tinker import types

from rlvr.errors import ConfigurationError


def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    """An AdamW over ``params``; its hyperparameters are set by each ``adam_step``."""
    return torch.optim.AdamW(params, lr=0.0, foreach=False)


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
