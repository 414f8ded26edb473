"""Checkpoints: exact resume, atomic writes, sampler weights on disk, clear errors for missing paths."""

import json

import pytest
import torch

from datums import ce_datum
from rlvr import types
from rlvr.errors import CheckpointError, CheckpointNotFoundError
from rlvr.home import resolve

ADAM = types.AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=5.0)


def steps(tc, n, params: types.AdamParams | types.DimuonParams = ADAM):
    data = [ce_datum([3, 1, 4, 1, 5, 9, 2, 6]), ce_datum([2, 7, 1, 8, 2, 8])]
    for _ in range(n):
        tc.forward_backward(data, "cross_entropy")
        tc.optim_step(params)
    return tc.parameters()


def test_resume_with_optimizer_is_bit_identical(service):
    original = service.create_lora_training_client(base_model="tiny", rank=8, seed=21)
    steps(original, 2)  # Adam moments are non-zero at the save
    path = original.save_state("mid").result().path
    assert path.startswith("rlvr://") and path.endswith("/weights/mid")
    resumed = service.create_training_client_from_state_with_optimizer(path)
    a, b = steps(original, 3), steps(resumed, 3)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_optimizer_differs(service):
    # The control for the test above: a fresh optimizer (zero moments) must give different weights.
    original = service.create_lora_training_client(base_model="tiny", rank=8, seed=21)
    steps(original, 2)
    path = original.save_state("mid2").result().path
    fresh = service.create_training_client_from_state(path)
    assert all(torch.equal(v, original.parameters()[k]) for k, v in fresh.parameters().items())
    a, b = steps(original, 3), steps(fresh, 3)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_tinker_scheme_is_an_alias(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=22)
    path = tc.save_state("alias").result().path
    again = service.create_training_client_from_state(path.replace("rlvr://", "tinker://"))
    assert all(torch.equal(v, tc.parameters()[k]) for k, v in again.parameters().items())


def test_sampler_weights_on_disk_reload_to_the_same_logprobs(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=23)
    steps(tc, 2)
    prompt = types.ModelInput.from_ints([5, 6, 7, 8])
    path = tc.save_weights_for_sampler("s0").result().path
    live = service.create_sampling_client(model_path=path).compute_logprobs(prompt).result()
    folder = resolve(path)
    assert (folder / "adapter_model.safetensors").exists() and not (folder / "optimizer.pt").exists()
    meta = json.loads((folder / "rlvr.json").read_text())
    assert meta["base_model"] == "tiny" and meta["lora"]["rank"] == 4
    # A fresh engine has no in-memory snapshot: it must read the files.
    import rlvr
    from rlvr.engine import Engine

    cold = rlvr.ServiceClient(Engine()).create_sampling_client(model_path=path)
    assert cold.compute_logprobs(prompt).result() == pytest.approx(live, abs=1e-6)
    base = service.create_sampling_client(base_model="tiny").compute_logprobs(prompt).result()
    assert base != pytest.approx(live, abs=1e-4)  # the adapter really is applied


def test_a_crash_mid_save_leaves_the_previous_checkpoint(service, monkeypatch):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=24)
    path = tc.save_state("same").result().path
    saved = dict(tc.parameters())
    steps(tc, 1)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        tc.save_state("same").result()
    monkeypatch.undo()
    folder = resolve(path)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp folder left behind
    restored = service.create_training_client_from_state(path)
    assert all(torch.equal(v, saved[k]) for k, v in restored.parameters().items())


def test_missing_and_malformed_paths_are_named(service):
    with pytest.raises(CheckpointNotFoundError, match="rlvr://nope/weights/x"):
        service.create_training_client_from_state("rlvr://nope/weights/x")
    with pytest.raises(FileNotFoundError):
        service.create_sampling_client(model_path="rlvr://nope/sampler_weights/x")
    with pytest.raises(CheckpointError, match="must look like"):
        service.create_training_client_from_state("rlvr://just-a-run")


def test_sampler_weights_cannot_resume_an_optimizer(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=25)
    tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy")
    tc.optim_step(ADAM).result()
    path = tc.save_weights_for_sampler("only-weights").result().path
    with pytest.raises(CheckpointError, match="no optimizer.pt"):
        service.create_training_client_from_state_with_optimizer(path)


DIMUON = types.DimuonParams(learning_rate=3e-2, beta1=0.8, grad_clip_norm=5.0)


def test_a_dimuon_resume_keeps_the_optimizer_and_equals_an_uninterrupted_run(service):
    original = service.create_lora_training_client("tiny", rank=8, seed=31, optimizer=types.DimuonOptimizerConfig())
    steps(original, 2, DIMUON)  # the running averages are non-zero at the save
    path = original.save_state("dimuon-mid").result().path
    assert json.loads((resolve(path) / "rlvr.json").read_text())["optimizer"] == {
        "type": "dimuon", "version": 1}
    resumed = service.create_training_client_from_state_with_optimizer(path)
    assert resumed.get_info().optimizer_config == types.DimuonOptimizerConfig()
    a, b = steps(original, 3, DIMUON), steps(resumed, 3, DIMUON)
    assert all(torch.equal(a[k], b[k]) for k in a)
    reloaded = service.create_lora_training_client("tiny", rank=8, seed=99, optimizer=types.DimuonOptimizerConfig())
    reloaded.load_state_with_optimizer(path).result()
    c = steps(reloaded, 3, DIMUON)
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_a_dimuon_resume_without_its_averages_differs(service):
    """The control for the test above: weights only, with a fresh Dimuon (zero averages), end elsewhere."""
    original = service.create_lora_training_client("tiny", rank=8, seed=31, optimizer=types.DimuonOptimizerConfig())
    steps(original, 2, DIMUON)
    path = original.save_state("dimuon-mid2").result().path
    fresh = service.create_training_client_from_state(path, optimizer=types.DimuonOptimizerConfig())
    assert fresh.get_info().optimizer_config == types.DimuonOptimizerConfig()
    a, b = steps(original, 3, DIMUON), steps(fresh, 3, DIMUON)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert service.create_training_client_from_state(path).get_info().optimizer_config == types.AdamOptimizerConfig()


def test_optimizer_state_of_the_other_kind_is_refused_by_name(service):
    dimuon = service.create_lora_training_client("tiny", rank=4, seed=32, optimizer=types.DimuonOptimizerConfig())
    adam = service.create_lora_training_client("tiny", rank=4, seed=32)
    for tc in (dimuon, adam):
        tc.forward_backward([ce_datum([1, 2, 3])], "cross_entropy")
    dimuon.optim_step(DIMUON).result()
    adam.optim_step(ADAM).result()
    dimuon_path, adam_path = dimuon.save_state("kind-d").result().path, adam.save_state("kind-a").result().path
    with pytest.raises(CheckpointError, match="holds dimuon optimizer state and this client trains with adamw"):
        adam.load_state_with_optimizer(dimuon_path).result()
    with pytest.raises(CheckpointError, match="holds adamw optimizer state and this client trains with dimuon"):
        dimuon.load_state_with_optimizer(adam_path).result()
    dimuon.load_state(adam_path).result()  # weights only: any checkpoint
    assert dimuon.get_info().optimizer_config == types.DimuonOptimizerConfig()
