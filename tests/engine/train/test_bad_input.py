"""Bad input gets an error that names what is wrong, and a rejected call loses nothing already trained."""

import math

import pytest
import torch

from datums import ce_datum, rl_datum
from rlvr import types
from rlvr.errors import InvalidDatumError, UnknownLossError


@pytest.fixture
def tc(service):
    return service.create_lora_training_client(base_model="tiny", rank=4, seed=31)


def assert_untouched(tc, before):
    after = tc.parameters()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    ("datum", "loss", "message"),
    [
        (ce_datum([1, 2, 3]), "reinforce", "'reinforce' is not a built-in loss"),
        (types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]}),
         "cross_entropy", r"lacks \['weights'\]"),
        (types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                     loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]}),
         "cross_entropy", "has 2 entries but model_input has 3 tokens"),
        (types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                     loss_fn_inputs={"target_tokens": [2, 99999], "weights": [1.0, 1.0]}),
         "cross_entropy", "token id 99999 outside the vocabulary"),
        (types.Datum(model_input=types.ModelInput.from_ints([1, 70000]),
                     loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]}),
         "cross_entropy", r"model_input has token id 70000"),
        (rl_datum([1, 2], [3, 4], [-1.0, -1.0], math.nan), "importance_sampling",
         r"\['advantages'\]\[1\] is nan; it must be finite"),
        (rl_datum([1, 2], [3, 4], [-1.0, math.inf], 1.0), "ppo", r"\['logprobs'\]\[2\] is inf"),
        (types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                     loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0],
                                     "mask": types.TensorData(data=[1.0, 1.0], dtype="float32")}),
         "cross_entropy", r"keys \['mask'\] that this loss does not use"),
    ],
)
def test_bad_datum_is_named_and_changes_nothing(tc, datum, loss, message):
    good = ce_datum([4, 5, 6, 7])
    tc.forward_backward([good], "cross_entropy").result()  # a gradient is pending
    before = tc.parameters()
    with pytest.raises((InvalidDatumError, UnknownLossError), match=message):
        # A valid datum first: everything is checked before any of it is computed.
        valid = good if loss in ("cross_entropy", "reinforce") else rl_datum([4, 5], [6, 7], [-1.0, -1.0], 1.0)
        tc.forward_backward([valid, datum], loss).result()
    # The pending gradient survived the rejected call: the step equals one on the good datum alone.
    reference = tc.service.create_lora_training_client(base_model="tiny", rank=4, seed=31)
    reference.forward_backward([good], "cross_entropy")
    expect = reference.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["grad_norm:mean"]
    assert_untouched(tc, before)
    got = tc.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["grad_norm:mean"]
    assert got == pytest.approx(expect, rel=1e-6)


def test_empty_data_and_wrong_types(tc):
    with pytest.raises(InvalidDatumError, match="non-empty list"):
        tc.forward_backward([], "cross_entropy").result()
    with pytest.raises(InvalidDatumError, match=r"data\[0\] must be a tinker Datum"):
        tc.forward_backward([{"model_input": [1]}], "cross_entropy").result()


def test_optim_step_without_gradients_says_so(tc):
    with pytest.raises(ValueError, match="no gradients accumulated; call forward_backward first"):
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def test_bad_adam_params_change_nothing(tc):
    tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy").result()
    before = tc.parameters()
    with pytest.raises(ValueError, match="AdamParams.learning_rate must be a finite number"):
        tc.optim_step(types.AdamParams(learning_rate=math.nan)).result()
    assert_untouched(tc, before)
    assert tc.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm:mean"] > 0


def test_failed_request_does_not_poison_the_client(tc):
    with pytest.raises(UnknownLossError):
        tc.forward_backward([ce_datum([1, 2, 3])], "nope").result()
    assert tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy").result().metrics["loss:sum"] > 0
