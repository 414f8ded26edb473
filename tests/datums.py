"""Datum builders shared by the engine tests."""

from rlvr import types


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
