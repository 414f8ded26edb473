"""A learned state-value function for PPO's GAE: V(s_t), linear in hashed features of what the policy has seen.

The Tinker API gives a trainer the logprobs of tokens, not hidden states, so there is no trunk for a value head to
share. The critic is therefore its own small model: the state before answer token t is the prompt plus the first t
answer tokens, described by the prompt's token frequencies and the answer-so-far's token frequencies (token ids
hashed into ``buckets`` bins each), log(1 + t) and a bias. A value depends only on that state, never on tokens at
or after t, so as a baseline it keeps the policy gradient unbiased whatever it has learned.

It is fitted to the returns by gradient steps on the mean squared error. ``value_coef`` (PPO's weight of the value
loss in its combined objective) scales those steps: the critic shares no parameters with the policy, so that
weight acts on the critic alone.

Not here: the advantages themselves (``rlvr.rl.advantages.gae``), PPO (``algorithms.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BUCKETS = 256
"""Hash bins per token-frequency block."""
STEP_SIZE = 0.2
"""Gradient step on the squared error before ``value_coef`` scales it (features are at most 1 in size, so steps up to
~0.25 are stable)."""
FIT_STEPS = 20
"""Gradient steps per fit."""


class LinearCritic:
    """V(s_t) = w . features(prompt, answer[:t]); see the module docstring. float64 numpy throughout."""

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.buckets = buckets
        self.weights = np.zeros(2 * buckets + 2, dtype=np.float64)

    def features(self, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> np.ndarray:
        """(T, 2 buckets + 2): one row per answer token t, describing the state before it."""
        B, T = self.buckets, len(response_tokens)
        prompt = np.bincount(np.asarray(prompt_tokens, dtype=np.int64) % B, minlength=B).astype(np.float64)
        prompt /= max(len(prompt_tokens), 1)
        seen = np.zeros((T, B), dtype=np.float64)  # row t: counts of answer tokens before t
        if T > 1:
            hot = np.zeros((T - 1, B), dtype=np.float64)  # one-hot rows of the answer tokens before the last
            hot[np.arange(T - 1), np.asarray(response_tokens[:-1], dtype=np.int64) % B] = 1.0
            seen[1:] = hot.cumsum(0)
        steps = np.arange(T, dtype=np.float64)
        seen /= np.maximum(steps, 1)[:, None]
        return np.concatenate([np.broadcast_to(prompt, (T, B)), seen, (np.log1p(steps) / 8)[:, None],
                               np.ones((T, 1), dtype=np.float64)], axis=1)

    def values(self, prompt_tokens: Sequence[int], response_tokens: Sequence[int]) -> list[float]:
        """V(s_t) for every answer token t."""
        return self.predict(self.features(prompt_tokens, response_tokens))

    def predict(self, features: np.ndarray) -> list[float]:
        """V(s_t) for each row of ``features`` (from ``features``)."""
        return (features @ self.weights).tolist()

    def fit(self, features: Sequence[np.ndarray], targets: Sequence[Sequence[float]], value_coef: float,
            steps: int = FIT_STEPS) -> float:
        """Move the values of episodes (their ``features``) towards ``targets`` (one per answer token); returns the
        mean squared error before the fit (the value loss)."""
        x = np.concatenate(list(features))
        y = np.asarray([v for t in targets for v in t], dtype=np.float64)
        if len(y) != len(x):
            raise ValueError(f"{len(y)} value targets for {len(x)} answer tokens")
        loss = float(((x @ self.weights - y) ** 2).mean())
        with np.errstate(over="ignore", invalid="ignore"):  # divergence is raised below, not warned about per step
            for _ in range(steps):
                error = x @ self.weights - y
                self.weights -= STEP_SIZE * value_coef * 2 * (x.T @ error) / len(y)
        if not math.isfinite(float(np.abs(self.weights).max())):
            raise FloatingPointError("the critic's weights diverged; lower value_coef")
        return loss

    def state(self) -> dict:
        return {"buckets": self.buckets, "weights": self.weights.tolist()}

    @classmethod
    def from_state(cls, state: dict) -> LinearCritic:
        critic = cls(state["buckets"])
        critic.weights = np.asarray(state["weights"], dtype=np.float64)
        return critic
