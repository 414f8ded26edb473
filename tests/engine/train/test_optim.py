"""The optimizer is chosen when a training client is created and fixed for its life: AdamW by default, Dimuon on
request; each refuses the other's step parameters by name, and ``get_info`` says which it is."""

from __future__ import annotations

import pytest
import torch
from tinker.types.optimizer import OptimizerConfigBase

from datums import ce_datum
from rlvr import types
from rlvr.errors import ConfigurationError

DATUM = ce_datum([4, 8, 15, 16, 23, 42])


def test_the_default_optimizer_is_adamw_and_dimuon_is_chosen_at_creation(service):
    adam = service.create_lora_training_client("tiny", rank=4, seed=1)
    dimuon = service.create_lora_training_client("tiny", rank=4, seed=1, optimizer=types.DimuonOptimizerConfig())
    explicit = service.create_lora_training_client("tiny", rank=4, seed=1, optimizer=types.AdamOptimizerConfig())
    assert adam.get_info().optimizer_config == explicit.get_info().optimizer_config == types.AdamOptimizerConfig()
    assert dimuon.get_info().optimizer_config == types.DimuonOptimizerConfig()
    for tc, params in ((adam, types.AdamParams(learning_rate=1e-2)), (dimuon, types.DimuonParams(learning_rate=1e-2))):
        tc.forward_backward([DATUM], "cross_entropy")
        assert tc.optim_step(params).result().metrics["learning_rate:mean"] == 1e-2
    a, d = adam.parameters(), dimuon.parameters()
    assert any(not torch.allclose(a[k], d[k]) for k in a)  # two different steps from the same start


@pytest.mark.parametrize(("optimizer", "wrong", "message"), [
    (types.DimuonOptimizerConfig(), types.AdamParams(learning_rate=1e-2),
     r"got types\.AdamParams, but this training client was created with optimizer=types\.DimuonOptimizerConfig\(\), "
     r"which takes types\.DimuonParams"),
    (None, types.DimuonParams(learning_rate=1e-2),
     r"got types\.DimuonParams, but this training client was created with optimizer=types\.AdamOptimizerConfig\(\), "
     r"which takes types\.AdamParams"),
])
def test_the_other_optimizers_params_are_refused_by_name_and_the_gradients_kept(service, optimizer, wrong, message):
    tc = service.create_lora_training_client("tiny", rank=4, seed=2, optimizer=optimizer)
    tc.forward_backward([DATUM], "cross_entropy")
    before = tc.parameters()
    with pytest.raises(ConfigurationError, match=message):
        tc.optim_step(wrong)
    assert all(torch.equal(before[k], v) for k, v in tc.parameters().items())
    right = types.DimuonParams(learning_rate=1e-2) if optimizer else types.AdamParams(learning_rate=1e-2)
    assert tc.optim_step(right).result().metrics["grad_norm:mean"] > 0  # the gradient was still there


def test_an_unknown_optimizer_is_refused_by_name(service):
    with pytest.raises(ConfigurationError, match=r"rlvr has AdamW .* and Dimuon"):
        service.create_lora_training_client("tiny", rank=4, optimizer=OptimizerConfigBase(type="sgd"))
    with pytest.raises(ConfigurationError, match="implements version 1"):
        service.create_lora_training_client("tiny", rank=4, optimizer=OptimizerConfigBase(type="dimuon", version=2))
