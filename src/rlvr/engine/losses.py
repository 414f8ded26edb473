"""The built-in losses of ``forward_backward``, as pure functions of per-token tensors, in one table.

Every loss follows Tinker's definitions: it is a *sum* over tokens (and so over datums: the engine concatenates the
tokens of all datums in a batch), never a mean. Each takes

- ``target_logprobs``: log p_theta(target token) under the model being trained, shape (N,), differentiable;
- the ``loss_fn_inputs`` it declares in ``LOSSES`` (``weights``, or the sampler's ``logprobs`` and ``advantages``),
  each of shape (N,);
- its ``loss_fn_config`` entries as keyword arguments with defaults,

and returns ``(loss, metrics)``: a scalar tensor and a dict of floats keyed ``name:reduction``.

Adding a loss means one function and one row in ``LOSSES``. Custom losses go through
``TrainingClient.forward_backward_custom`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlvr.errors import ConfigurationError, UnknownLossError

Metrics = dict[str, float]


def cross_entropy(target_logprobs: Tensor, weights: Tensor) -> tuple[Tensor, Metrics]:
    """Weighted negative log-likelihood: ``loss = -sum_t w_t * log p(x_t)``."""
    loss = -(weights * target_logprobs).sum()
    return loss, {"loss:sum": loss.item()}


def importance_sampling(target_logprobs: Tensor, logprobs: Tensor, advantages: Tensor) -> tuple[Tensor, Metrics]:
    """REINFORCE with an importance weight for off-policy samples.

    ``ratio_t = exp(log p_theta(x_t) - log q(x_t))``; ``loss = -sum_t ratio_t * A_t``,
    where q is the sampler's distribution (``logprobs``) and A the advantages. Its gradient is
    ``-sum_t ratio_t * A_t * grad log p_theta(x_t)``, plain REINFORCE when p_theta = q.
    """
    ratio = torch.exp(target_logprobs - logprobs)
    loss = -(ratio * advantages).sum()
    return loss, {"loss:sum": loss.item()}


def ppo(
    target_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    clip_low_threshold: float = 0.8,
    clip_high_threshold: float = 1.2,
) -> tuple[Tensor, Metrics]:
    """PPO's clipped surrogate.

    ``ratio_t = exp(log p_theta - log q)``, ``clipped_t = clamp(ratio_t, low, high)``,
    ``loss = -sum_t min(ratio_t * A_t, clipped_t * A_t)``. A token whose ratio has left [low, high] in the direction
    its advantage pushes contributes no gradient.
    """
    ratio = torch.exp(target_logprobs - logprobs)
    clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold)
    objective = torch.minimum(ratio * advantages, clipped * advantages)
    loss = -objective.sum()
    was_clipped = (ratio * advantages) > (clipped * advantages)
    return loss, {"loss:sum": loss.item(), "clip_fraction:mean": _mean(was_clipped)}


def cispo(
    target_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    clip_low_threshold: float = 0.8,
    clip_high_threshold: float = 1.2,
) -> tuple[Tensor, Metrics]:
    """CISPO (MiniMax-M1): clip the importance weight, not the update, and stop its gradient.

    ``loss = -sum_t sg(clamp(ratio_t, low, high)) * A_t * log p_theta(x_t)``: every token keeps a gradient, scaled by
    its clipped weight. With ``clip_low_threshold=0`` and ``clip_high_threshold=C`` this is truncated importance
    sampling (TIS): REINFORCE with each token's importance weight capped at C, the usual correction when the sampler's
    numerics differ from the trainer's.
    """
    ratio = torch.exp(target_logprobs - logprobs)
    clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold).detach()
    loss = -(clipped * advantages * target_logprobs).sum()
    was_clipped = (ratio < clip_low_threshold) | (ratio > clip_high_threshold)
    return loss, {"loss:sum": loss.item(), "clip_fraction:mean": _mean(was_clipped)}


def dro(target_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, beta: float) -> tuple[Tensor, Metrics]:
    """Direct Reward Optimization: a policy gradient with a quadratic penalty on leaving the sampler.

    ``loss = -sum_t (log p_theta(x_t) * A_t - beta/2 * (log p_theta(x_t) - log q(x_t))^2)``.
    As in Tinker, the penalty covers every position, prompt positions included (where ``logprobs`` is usually 0):
    put only sampled tokens in a DRO datum, or give prompt positions their real logprobs.
    """
    quadratic = (target_logprobs - logprobs) ** 2
    loss = -(target_logprobs * advantages - 0.5 * beta * quadratic).sum()
    return loss, {"loss:sum": loss.item()}


def _mean(mask: Tensor) -> float:
    return mask.float().mean().item() if mask.numel() else 0.0


@dataclass(frozen=True)
class LossSpec:
    """One row of the loss table."""

    fn: Callable[..., tuple[Tensor, Metrics]]
    """The loss: ``fn(target_logprobs, *inputs, **config) -> (loss, metrics)``."""
    inputs: tuple[str, ...]
    """The ``loss_fn_inputs`` keys it needs besides ``target_tokens``, in the order ``fn`` takes them."""
    config: dict[str, float | None] = field(default_factory=dict)
    """Its ``loss_fn_config`` keys with their defaults (None: required)."""


LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(cross_entropy, ("weights",)),
    "importance_sampling": LossSpec(importance_sampling, ("logprobs", "advantages")),
    "ppo": LossSpec(ppo, ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": LossSpec(cispo, ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "dro": LossSpec(dro, ("logprobs", "advantages"), {"beta": None}),
}


def resolve_loss(name: str, config: dict[str, float] | None) -> tuple[LossSpec, dict[str, float]]:
    """The table row for ``name`` and its full config, or an error naming what is wrong."""
    if name not in LOSSES:
        raise UnknownLossError(f"loss_fn={name!r} is not a built-in loss; choose one of {sorted(LOSSES)}, or use "
                               "forward_backward_custom for your own")
    spec = LOSSES[name]
    config = dict(config or {})
    unknown = sorted(set(config) - set(spec.config))
    if unknown:
        allowed = sorted(spec.config) or "none"
        raise ConfigurationError(
            f"loss_fn_config keys {unknown} are not used by loss_fn={name!r} (it takes: {allowed})"
        )
    resolved: dict[str, float] = {}
    for key, default in spec.config.items():
        value = config.get(key, default)
        if value is None:
            raise ConfigurationError(f"loss_fn={name!r} needs loss_fn_config={{'{key}': ...}}")
        try:
            resolved[key] = float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"loss_fn_config[{key!r}]={value!r} is not a number") from exc
    if "clip_low_threshold" in resolved and not 0 <= resolved["clip_low_threshold"] <= resolved["clip_high_threshold"]:
        raise ConfigurationError(
            f"loss_fn={name!r} needs 0 <= clip_low_threshold <= clip_high_threshold, got "
            f"{resolved['clip_low_threshold']} and {resolved['clip_high_threshold']}"
        )
    return spec, resolved
