"""Datum builders shared by the engine tests."""

import torch

from rlvr import types

LOSS_CONFIGS = {"dro": {"beta": 0.5}}
"""The config each loss of the table needs in tests (the others take their defaults)."""


def ce_datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    """Next-token cross-entropy datum for ``tokens``."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)},
    )


def rl_datum(prompt: list[int], completion: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    """The cookbook's RL datum: prompt positions masked with zero advantage and zero logprob."""
    tokens = prompt + completion
    ob_len = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * ob_len + list(logprobs),
            "advantages": [0.0] * ob_len + [advantage] * len(completion),
        },
    )


def loss_batch(loss_fn: str) -> list[types.Datum]:
    """Five sampled-looking completions of two prompts (three share the first), with the inputs ``loss_fn`` takes:
    cross_entropy's weights, gspo's ``sequence_ratio_mask``, stable_reinforce's provenance."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (12, 7)]
    data = []
    for p, n in ((0, 5), (0, 3), (0, 6), (1, 4), (1, 9)):
        completion = torch.randint(3, 250, (n,), generator=g).tolist()
        sampled = (-torch.rand(n, generator=g) * 3).tolist()
        datum = rl_datum(prompts[p], completion, sampled, advantage=float(torch.randn(1, generator=g)))
        if loss_fn == "cross_entropy":
            datum = types.Datum(model_input=datum.model_input,
                                loss_fn_inputs={"target_tokens": datum.loss_fn_inputs["target_tokens"],
                                                "weights": datum.loss_fn_inputs["advantages"]})
        ob_len = len(prompts[p]) - 1  # target positions that predict prompt tokens
        if loss_fn == "gspo":
            datum = types.Datum(model_input=datum.model_input, loss_fn_inputs={
                **datum.loss_fn_inputs, "sequence_ratio_mask": [0.0] * ob_len + [1.0] * n})
        if loss_fn == "stable_reinforce":
            datum = datum.with_provenance(
                model_input=[types.PromptProvenanceSpan(sequence_id="s", length=ob_len + n)],
                loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id="s", offset=1, length=ob_len),
                                types.SampledProvenanceSpan(sequence_id="s", length=n)])
        data.append(datum)
    return data
