"""Advantages: how much better each answer was than its group, as pure functions of rewards.

GRPO-style group centring is the default (``A_i = r_i - mean(r_G)``); optional division by the group's standard
deviation (``normalize_std``); a running-mean REINFORCE baseline for single-sample settings. A group whose rewards are
all equal carries no signal under centring and is dropped by the loop (counted in ``by_group/frac_all_*``).
``entropy_shaped`` adds an entropy bonus per token; ``gae`` gives per-token advantages against a critic's values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def is_constant(rewards_G: Sequence[float]) -> bool:
    """Whether every reward of the group is the same (centred advantages would all be 0)."""
    return all(r == rewards_G[0] for r in rewards_G)


def entropy_shaped(advantage: float | Sequence[float], logprobs_T: Sequence[float], coef: float) -> list[float]:
    """Per-token advantages with an entropy bonus: ``A_t = advantage - coef * sum_{t' >= t} logprobs_T[t']``
    (``advantage``: one value for the answer, or one per token).

    The bonus is the answer's surprisal ``-log pi(y)`` paid as extra reward: since ``E[grad log pi(y)] = 0``, the
    policy gradient of ``E[-coef * log pi(y)]`` is ``coef * grad H`` (H: the entropy of the answer distribution),
    and each token keeps only the surprisal of itself and what follows it (earlier tokens do not depend on it), which
    removes variance and no signal. ``logprobs_T`` are the sampler's logprobs of the answer's tokens.
    """
    if coef < 0:
        raise ValueError(f"entropy coefficient must be >= 0, got {coef}")
    advantages_T = [advantage] * len(logprobs_T) if isinstance(advantage, (int, float)) else list(advantage)
    if len(advantages_T) != len(logprobs_T):
        raise ValueError(f"{len(advantages_T)} per-token advantages for {len(logprobs_T)} logprobs")
    shaped_T = []
    suffix = 0.0
    for a, logprob in zip(reversed(advantages_T), reversed(logprobs_T), strict=True):
        suffix += logprob
        shaped_T.append(a - coef * suffix)
    return shaped_T[::-1]


def gae(rewards_T: Sequence[float], values_T: Sequence[float], gamma: float = 1.0, lam: float = 0.95) -> list[float]:
    """Generalised advantage estimates of one episode: ``A_t = sum_k (gamma lam)^k delta_{t+k}`` with
    ``delta_t = r_t + gamma V_{t+1} - V_t`` and ``V_T = 0`` (the episode ends after its last token). ``lam=1``
    gives the return minus the value; ``lam=0`` the one-step TD error."""
    if len(rewards_T) != len(values_T):
        raise ValueError(f"{len(rewards_T)} rewards but {len(values_T)} values")
    advantages_T, running, next_value = [], 0.0, 0.0
    for reward, value in zip(reversed(rewards_T), reversed(values_T), strict=True):
        running = reward + gamma * next_value - value + gamma * lam * running
        advantages_T.append(running)
        next_value = value
    return advantages_T[::-1]


def returns_to_go(rewards_T: Sequence[float], gamma: float = 1.0) -> list[float]:
    """``G_t = sum_k gamma^k r_{t+k}``: what a critic's value of step t should predict."""
    out, running = [], 0.0
    for reward in reversed(rewards_T):
        running = reward + gamma * running
        out.append(running)
    return out[::-1]


def group_advantages(rewards_G: Sequence[float], normalize_std: bool = False, eps: float = 1e-6) -> list[float]:
    """``r_i - mean(r)``, divided by ``std(r) + eps`` (population std) when ``normalize_std``."""
    if not rewards_G:
        return []
    mean = sum(rewards_G) / len(rewards_G)
    advantages_G = [r - mean for r in rewards_G]
    if normalize_std:
        std = math.sqrt(sum(a * a for a in advantages_G) / len(advantages_G))
        advantages_G = [a / (std + eps) for a in advantages_G]
    return advantages_G


@dataclass
class RunningBaseline:
    """REINFORCE's baseline: an exponential moving average of rewards; advantage = reward - baseline."""

    decay: float = 0.9
    """Weight of the past in each update (0 = last batch's mean only)."""
    value: float | None = None
    """Current baseline; None until the first update."""

    def advantages(self, rewards: Sequence[float]) -> list[float]:
        """Advantages against the baseline as it stood, then fold ``rewards`` into it."""
        batch_mean = sum(rewards) / len(rewards)
        baseline = batch_mean if self.value is None else self.value
        self.value = batch_mean if self.value is None else self.decay * self.value + (1 - self.decay) * batch_mean
        return [r - baseline for r in rewards]


def group_outcomes(groups: Sequence[Sequence[float]], best: float = 1.0) -> dict[str, float]:
    """``by_group/frac_mixed|frac_all_good|frac_all_bad``: how many groups had signal, were all solved, all failed."""
    n = len(groups) or 1
    all_good = sum(1 for g in groups if is_constant(g) and g[0] >= best)
    constant = sum(1 for g in groups if is_constant(g))
    return {
        "by_group/frac_mixed": (len(groups) - constant) / n,
        "by_group/frac_all_good": all_good / n,
        "by_group/frac_all_bad": (constant - all_good) / n,
    }
