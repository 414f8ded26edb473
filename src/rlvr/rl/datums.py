"""Loss inputs: turning a sampled answer and its advantage into a Tinker ``Datum``, and the metrics that compare
the sampler's logprobs with the trainer's.

Alignment is Tinker's: ``model_input`` is the full sequence without its last token, ``target_tokens`` the sequence
without its first; prompt positions get advantage 0 and logprob 0, so only sampled tokens carry gradient. The
completion mask is returned beside the datum (the engine refuses keys a loss does not use).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlvr import types


def rl_datum(
    prompt_tokens: Sequence[int], completion_tokens: Sequence[int], sampling_logprobs: Sequence[float], advantage: float
) -> tuple[types.Datum, list[float]]:
    """The datum for one sampled completion, and its mask over target positions (1.0 = a sampled token)."""
    if len(completion_tokens) != len(sampling_logprobs):
        raise ValueError(f"{len(completion_tokens)} completion tokens but {len(sampling_logprobs)} logprobs")
    if not prompt_tokens or not completion_tokens:
        raise ValueError("a datum needs at least one prompt token and one completion token")
    full = [*prompt_tokens, *completion_tokens]
    ob_len = len(prompt_tokens) - 1
    mask = [0.0] * ob_len + [1.0] * len(completion_tokens)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": full[1:],
            "logprobs": [0.0] * ob_len + list(sampling_logprobs),
            "advantages": [0.0] * ob_len + [advantage] * len(completion_tokens),
        },
    )
    return datum, mask


def sample_train_metrics(
    training_logprobs: Sequence[Sequence[float]],
    sampling_logprobs: Sequence[Sequence[float]],
    masks: Sequence[Sequence[float]],
) -> dict[str, float]:
    """Compare the trainer's logprobs of the sampled tokens with the sampler's, over masked positions.

    With ``d_t = log q(x_t) - log p_train(x_t)`` (q the sampler):
    ``optim/kl_sample_train_v1 = mean(d)`` (the k1 estimator of KL(q || p)),
    ``optim/kl_sample_train_v2 = mean(d^2) / 2`` (k2), and ``optim/entropy = -mean(log p_train)``, the sampled
    estimate of the policy's per-token entropy. At equal weights both KL terms are ~0.
    """
    diffs, train = [], []
    for train_T, sample_T, mask_T in zip(training_logprobs, sampling_logprobs, masks, strict=True):
        for p, q, m in zip(train_T, sample_T, mask_T, strict=True):
            if m:
                diffs.append(q - p)
                train.append(p)
    if not diffs:
        return {}
    n = len(diffs)
    return {
        "optim/kl_sample_train_v1": sum(diffs) / n,
        "optim/kl_sample_train_v2": sum(d * d for d in diffs) / (2 * n),
        "optim/entropy": -sum(train) / n,
        "optim/max_abs_logprob_diff": max(abs(d) for d in diffs) if all(math.isfinite(d) for d in diffs) else math.inf,
    }
