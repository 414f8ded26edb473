"""The built-in losses of ``forward_backward``, as pure functions of per-token tensors, in one table.

Every loss follows Tinker's definitions: it is a *sum* over tokens (and so over datums: the engine concatenates the
tokens of all datums in a batch), never a mean. Each takes

- ``target_logprobs``: log p_theta(target token) under the model being trained, shape (N,), differentiable;
- the ``loss_fn_inputs`` it declares in ``LOSSES`` (``weights``, or the sampler's ``logprobs`` and ``advantages``),
  each of shape (N,);
- ``sampled_mask`` (N,) if its row sets ``provenance``: 1.0 where the datum's provenance
  (``Datum.loss_fn_input_spans``) names a sampled token, 0.0 where it names a prompt token;
- ``lengths``, the datums' token counts in order, if its row sets ``per_datum`` (a loss over whole sequences);
- its ``loss_fn_config`` entries as keyword arguments with defaults,

and returns ``(loss, metrics)``: a scalar tensor and a dict of floats keyed ``name:reduction``.

Adding a loss means one function and one row in ``LOSSES``, and its inputs in ``rlvr/loss_inputs.py`` (the
torch-free copy ``rlvr train --help`` reads; a test holds it to this table). Custom losses go through
``TrainingClient.forward_backward_custom`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlvr.errors import ConfigurationError, InvalidDatumError, UnknownLossError

Metrics = dict[str, float]


def cross_entropy(target_logprobs: Tensor, weights: Tensor) -> tuple[Tensor, Metrics]:
    """Weighted negative log-likelihood: ``loss = -sum_t w_t * log p(x_t)``.

    With (N, K) ``target_tokens`` and ``weights`` (top-K distillation) ``target_logprobs`` is (N, K) too and
    ``loss = -sum_t sum_k w_{t,k} * log p(x_{t,k})``; soft-target distillation sets ``w_{t,k}`` to the teacher's
    probability of ``x_{t,k}``.
    """
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


def gspo(
    target_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    sequence_ratio_mask: Tensor,
    lengths: list[int],
    clip_low_threshold: float = 0.8,
    clip_high_threshold: float = 1.2,
) -> tuple[Tensor, Metrics]:
    """GSPO, token-level variant (GSPO-token) as Tinker defines it: PPO's clipped surrogate on a sequence-level ratio.

    Per datum, over the positions M its ``sequence_ratio_mask`` marks (non-zero), the sequence ratio is the geometric
    mean of the token ratios, ``s = exp(mean_{t in M} (log p_theta(x_t) - log q(x_t)))``. Every token of the datum
    carries s's value with the gradient of its own log-probability,
    ``s_t = sg(s) * p_theta(x_t) / sg(p_theta(x_t))``, and
    ``loss = -sum_t min(s_t * A_t, clamp(s_t, low, high) * A_t)``. Clipping the one ratio keeps or drops a whole
    sequence; per-token advantages still weight each token's gradient.
    """
    loss = target_logprobs.new_zeros(())
    clipped_tokens = 0
    for lp, q, adv, mask in zip(target_logprobs.split(lengths), logprobs.split(lengths), advantages.split(lengths),
                                sequence_ratio_mask.split(lengths), strict=True):
        in_ratio = mask != 0
        if not in_ratio.any():
            raise InvalidDatumError("a gspo datum's loss_fn_inputs['sequence_ratio_mask'] marks no position; mark its "
                                    "sampled tokens with 1.0 (the sequence ratio is their mean log-ratio)")
        log_ratio = (lp.detach() - q)[in_ratio].mean()
        ratio = torch.exp(log_ratio + lp - lp.detach())
        clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold)
        loss = loss - torch.minimum(ratio * adv, clipped * adv).sum()
        clipped_tokens += int(((ratio * adv) > (clipped * adv)).sum())
    total = sum(lengths)
    return loss, {"loss:sum": loss.item(), "clip_fraction:mean": clipped_tokens / total if total else 0.0}


def stable_reinforce(
    target_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    sampled_mask: Tensor,
    kl_coeff: float = 0.0,
) -> tuple[Tensor, Metrics]:
    """StableReinforce: REINFORCE on the sampled tokens with a truncated, stop-gradient importance weight.

    Tinker documents the inputs (``target_tokens``, ``logprobs``, ``advantages``, provenance naming the sampled
    sequence behind every target, a ``kl_coeff`` config) but not the objective, so rlvr defines it as follows.
    Over the positions S that the provenance names as sampled tokens (``sampled_mask``), with
    ``r_t = exp(log p_theta(x_t) - log q(x_t))``:

        ``loss = -sum_{t in S} sg(min(r_t, 1)) * A_t * log p_theta(x_t) + kl_coeff * sum_{t in S} (r_t - 1 - log r_t)``

    On-policy (r = 1) this is exactly REINFORCE. Off-policy, a token the trained model now finds less likely than the
    sampler did has its gradient scaled down by r_t, and no token is ever scaled up, so stale or low-precision samples
    cannot blow an update up. The second term is the k3 estimate of KL(q || p_theta) on the sampled tokens; its
    gradient per token is ``kl_coeff * (r_t - 1)``. Prompt positions (outside S) contribute nothing, whatever their
    ``logprobs`` padding and advantages.
    """
    sampled = sampled_mask != 0
    log_ratio = target_logprobs - logprobs
    ratio = torch.exp(torch.where(sampled, log_ratio, torch.zeros_like(log_ratio)))  # 1 off S: no overflow from padding
    weight = torch.clamp(ratio, max=1.0).detach()
    pg = (weight * advantages * target_logprobs)[sampled].sum()
    kl = (ratio - 1 - torch.log(ratio))[sampled].sum()
    loss = -pg + kl_coeff * kl
    return loss, {"loss:sum": loss.item(), "kl_sample_train_k3:sum": kl.item(),
                  "truncated_tokens:sum": float((ratio < 1)[sampled].sum())}


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
    provenance: bool = False
    """Every datum must carry provenance (``Datum.with_provenance``); ``fn`` also takes ``sampled_mask``."""
    per_datum: bool = False
    """``fn`` also takes ``lengths``, the datums' token counts, to work per sequence."""
    topk: bool = False
    """``target_tokens`` and ``inputs`` may be (N, K): K targets per position, ``target_logprobs`` (N, K) too."""

    @property
    def arguments(self) -> tuple[str, ...]:
        """The per-token tensors ``fn`` takes after ``target_logprobs``, in order."""
        return (*self.inputs, "sampled_mask") if self.provenance else self.inputs


LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(cross_entropy, ("weights",), topk=True),
    "importance_sampling": LossSpec(importance_sampling, ("logprobs", "advantages")),
    "ppo": LossSpec(ppo, ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": LossSpec(cispo, ("logprobs", "advantages"), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "dro": LossSpec(dro, ("logprobs", "advantages"), {"beta": None}),
    "gspo": LossSpec(gspo, ("logprobs", "advantages", "sequence_ratio_mask"),
                     {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, per_datum=True),
    "stable_reinforce": LossSpec(stable_reinforce, ("logprobs", "advantages"), {"kl_coeff": 0.0}, provenance=True),
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
    if resolved.get("kl_coeff", 0.0) < 0:
        raise ConfigurationError(f"loss_fn_config['kl_coeff']={resolved['kl_coeff']} must be >= 0 (0 = no KL term)")
    return spec, resolved
