"""Top-K targets: cross_entropy with (N, K) target_tokens and weights, dense or sparse, against the full-vocabulary
log-softmax of the model computed here by hand."""

import pytest
import torch

import rlvr
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.gpu.packing import GpuPaths
from rlvr.errors import InvalidDatumError

INPUT = [5, 6, 7, 8, 9]
TARGETS = torch.tensor([[6, 11, 3], [7, 0, 0], [8, 40, 2], [9, 9, 100], [10, 12, 0]])  # (T, K)
WEIGHTS = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0], [0.5, 0.25, 0.25], [0.0, 0.0, 0.0], [0.6, 0.4, 0.0]])
# Mostly empty (T, 6): the SDK sends these as sparse CSR; unlisted cells densify to token 0 with weight 0.
SPARSE_TARGETS = torch.zeros(5, 6, dtype=torch.int64)
SPARSE_TARGETS[:, 0] = torch.tensor([6, 7, 8, 9, 10])
SPARSE_TARGETS[[0, 2, 4], 3] = torch.tensor([50, 60, 70])
SPARSE_WEIGHTS = torch.zeros(5, 6)
SPARSE_WEIGHTS[:, 0] = torch.tensor([0.9, 1.0, 0.5, 0.3, 0.8])
SPARSE_WEIGHTS[[0, 2, 4], 3] = torch.tensor([0.1, 0.5, 0.2])


def _full_log_softmax(tc, tokens):
    """log softmax over the whole vocabulary at every position of ``tokens``, by hand from the model's logits."""
    trainer = tc._trainer
    with torch.no_grad(), trainer.host.active(trainer.adapter) as model:
        return model(input_ids=torch.tensor([tokens])).logits[0].float().log_softmax(-1)  # (T, V)


def _topk_datum(targets=TARGETS, weights=WEIGHTS, tokens=INPUT):
    # 2-D torch tensors: the SDK's Datum stores target_tokens and weights as sparse CSR where that is smaller.
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": targets, "weights": weights})


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("paths", [None, GpuPaths(row_tokens=16, logit_chunk=2)], ids=["cpu-path", "packed-path"])
def test_topk_cross_entropy_is_the_weighted_sum_of_full_log_softmax_entries(paths, sparse):
    tc = rlvr.ServiceClient(Engine(device="cpu", gpu_paths=paths)).create_lora_training_client("tiny", rank=4, seed=3)
    targets, weights = (SPARSE_TARGETS, SPARSE_WEIGHTS) if sparse else (TARGETS, WEIGHTS)
    datum = _topk_datum(targets, weights)
    assert (datum.loss_fn_inputs["target_tokens"].sparse_crow_indices is not None) == sparse
    out = tc.forward([datum], "cross_entropy").result()
    full = _full_log_softmax(tc, INPUT)  # (T, V)
    want = full.gather(-1, targets)  # (T, K): log p(x_{t,k}) from the whole vocabulary's log-softmax
    got = out.loss_fn_outputs[0]["logprobs"].to_torch()
    assert got.shape == targets.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert out.metrics["loss:sum"] == pytest.approx(-(weights * want).sum().item(), rel=1e-5)


@pytest.mark.parametrize("paths", [None, GpuPaths(row_tokens=16, logit_chunk=2)], ids=["cpu-path", "packed-path"])
def test_topk_gradient_equals_k_one_dimensional_cross_entropies(paths):
    # -sum_t sum_k w_tk log p(x_tk) is the sum over k of the 1-D loss on column k: same loss, same step.
    service = rlvr.ServiceClient(Engine(device="cpu", gpu_paths=paths))
    columns = [types.Datum(model_input=types.ModelInput.from_ints(INPUT),
                           loss_fn_inputs={"target_tokens": TARGETS[:, k].tolist(), "weights": WEIGHTS[:, k].tolist()})
               for k in range(TARGETS.shape[1])]
    results = []
    for data in ([_topk_datum()], columns):
        tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=4)
        before = tc.parameters()
        loss = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        results.append((loss, tc.parameters()))
        assert any(not torch.equal(before[k], v) for k, v in results[-1][1].items())
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    for key, value in results[0][1].items():
        torch.testing.assert_close(value, results[1][1][key])


def test_topk_shapes_are_checked(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=5)
    with pytest.raises(InvalidDatumError, match=r"\['weights'\] has shape \(5,\) but target_tokens has \(5, 3\)"):
        tc.forward([_topk_datum(weights=torch.ones(5))], "cross_entropy").result()
    two = _topk_datum(targets=TARGETS[:, :2], weights=WEIGHTS[:, :2])
    with pytest.raises(InvalidDatumError, match="use one K"):
        tc.forward([_topk_datum(), two], "cross_entropy").result()
    with pytest.raises(InvalidDatumError, match=r"must be 1-D \(T,\), got shape \(5, 3\)"):
        tc.forward([types.Datum(model_input=types.ModelInput.from_ints(INPUT), loss_fn_inputs={
            "target_tokens": TARGETS, "logprobs": torch.zeros(5, 3), "advantages": torch.zeros(5, 3)})],
            "importance_sampling").result()
