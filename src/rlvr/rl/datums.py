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
from rlvr.errors import SamplingError


def loss_fn_inputs(**columns: Sequence[int] | Sequence[float]) -> types.LossFnInputs:
    """``columns`` as a Datum's ``loss_fn_inputs``, as plain lists: tinker's ``Datum`` turns each into TensorData
    itself (``target_tokens`` int64, the others float32), though ``LossFnInputs`` is annotated as TensorData only."""
    return {key: list(values) for key, values in columns.items()}  # type: ignore[misc]  # Datum converts (above)


def sampled_logprobs(sequence: types.SampledSequence) -> list[float]:
    """The sampler's logprob of each of ``sequence``'s tokens, which the loop trains with; a SamplingError where the
    sampler gave none (every rlvr sampler gives them; Tinker's types allow a sequence without)."""
    if sequence.logprobs is None:
        raise SamplingError("the sampler returned a sequence without logprobs; the RL loop needs one per sampled "
                            "token (importance weights, the KL to the sampler)")
    return list(sequence.logprobs)


def masked_datum(
    tokens: Sequence[int], logprobs: Sequence[float], sampled: Sequence[float], advantage: float | Sequence[float]
) -> tuple[types.Datum, list[float]]:
    """The datum over a whole sequence ``tokens`` whose ``sampled[i] == 1.0`` marks the tokens the policy sampled
    (trained with ``advantage`` and their sampler ``logprobs``); the others get advantage 0 and logprob 0. Returns it
    with its mask over target positions (1.0 = a sampled token). ``advantage``: one number for every sampled token,
    or one per sampled token in order (e.g. ``advantages.entropy_shaped``)."""
    mask = list(sampled[1:])
    count = sum(1 for m in mask if m)
    per_token = [float(advantage)] * count if isinstance(advantage, (int, float)) else list(advantage)
    if len(per_token) != count:
        raise ValueError(f"{len(per_token)} advantages for {count} sampled tokens")
    values = iter(per_token)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(list(tokens[:-1])),
        loss_fn_inputs=loss_fn_inputs(
            target_tokens=list(tokens[1:]),
            logprobs=[lp if m else 0.0 for lp, m in zip(logprobs[1:], mask, strict=True)],
            advantages=[next(values) if m else 0.0 for m in mask],
        ),
    )
    return datum, mask


def rl_datum(
    prompt_tokens: Sequence[int], completion_tokens: Sequence[int], sampling_logprobs: Sequence[float],
    advantage: float | Sequence[float],
) -> tuple[types.Datum, list[float]]:
    """The datum for one sampled completion, and its mask over target positions (1.0 = a sampled token)."""
    if len(completion_tokens) != len(sampling_logprobs):
        raise ValueError(f"{len(completion_tokens)} completion tokens but {len(sampling_logprobs)} logprobs")
    if not prompt_tokens or not completion_tokens:
        raise ValueError("a datum needs at least one prompt token and one completion token")
    prompt = [0.0] * len(prompt_tokens)
    return masked_datum([*prompt_tokens, *completion_tokens], [*prompt, *sampling_logprobs],
                        [*prompt, *[1.0] * len(completion_tokens)], advantage)


def sft_datum(prompt_tokens: Sequence[int], completion_tokens: Sequence[int]) -> types.Datum:
    """The ``cross_entropy`` datum that teaches ``completion_tokens`` after ``prompt_tokens`` (prompt weight 0)."""
    if not prompt_tokens or not completion_tokens:
        raise ValueError("a supervised datum needs at least one prompt token and one completion token")
    full = [*prompt_tokens, *completion_tokens]
    ob_len = len(prompt_tokens) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs=loss_fn_inputs(target_tokens=full[1:],
                                                     weights=[0.0] * ob_len + [1.0] * len(completion_tokens)))


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


def apply_kl_penalty(
    datums: Sequence[types.Datum], masks: Sequence[Sequence[float]], base_logprobs: Sequence[Sequence[float]],
    coef: float,
) -> tuple[list[types.Datum], dict[str, float]]:
    """Penalise drifting from a reference (base) model, per token, inside the advantages.

    With ``k_t = log q(x_t) - log p_base(x_t)`` on sampled tokens (q: the sampler, i.e. the current policy) and
    ``k̄`` its mean over the batch, each sampled token's advantage becomes ``A_t + coef * (k̄ - k_t)``: tokens the
    policy likes much more than the base model are pushed back, and the batch's mean advantage is unchanged.
    ``base_logprobs[i]`` are the base model's logprobs of datum i's target tokens. Metric: ``kl_policy_base``
    (the mean ``k_t``).
    """
    diffs: list[list[float]] = []
    for datum, mask, base in zip(datums, masks, base_logprobs, strict=True):
        sampled = datum.loss_fn_inputs["logprobs"].tolist()
        diffs.append([(q - b) if m else 0.0 for q, b, m in zip(sampled, base, mask, strict=True)])
    count = sum(sum(m) for m in masks)
    mean = sum(sum(d) for d in diffs) / count if count else 0.0
    out = []
    for datum, mask, diff in zip(datums, masks, diffs, strict=True):
        advantages = datum.loss_fn_inputs["advantages"].tolist()
        adjusted = [a + coef * (mean - k) if m else a for a, k, m in zip(advantages, diff, mask, strict=True)]
        out.append(types.Datum(model_input=datum.model_input,
                               loss_fn_inputs={**datum.loss_fn_inputs, **loss_fn_inputs(advantages=adjusted)}))
    return out, {"kl_policy_base": mean}
