"""The GPU trainer's pieces, on the CPU: the packing plan, packed rows (equal to one forward per datum), activation
checkpointing (the same gradients), and the engine on those paths (the same losses, logprobs and steps as its CPU
path, for every loss of the table). Its chunked logprobs (``train.logprobs``): tests/engine/train/test_logprobs.py."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

import rlvr
from datums import LOSS_CONFIGS, loss_batch
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.device import GpuPaths
from rlvr.engine.gpu import packing
from rlvr.engine.gpu.packing import PackedRow, checkpointed, packed_logprobs, plan
from rlvr.engine.models.random_models import small_config
from rlvr.engine.models.tiny import build_tiny_model
from rlvr.engine.train.losses import LOSSES


def test_plan_packs_first_fit_longest_first():
    # lengths 5, 4, 3, 3, 1 into rows of 8: 5 opens row A, 4 opens row B, 3 joins A (8), 3 joins B (7), 1 joins B (8).
    assert plan([3, 5, 1, 4, 3], row_tokens=8, max_tokens=100) == [[PackedRow((1, 0)), PackedRow((3, 4, 2))]]
    # max_tokens 8: each row alone (two rows pad to 16 positions).
    assert plan([3, 5, 1, 4, 3], row_tokens=8, max_tokens=8) == [[PackedRow((1, 0))], [PackedRow((3, 4, 2))]]


def test_plan_covers_every_datum_once_within_both_budgets():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (60,), generator=g).tolist() + [100]  # one longer than a row
    batches = plan(lengths, row_tokens=64, max_tokens=200)
    datums = [i for batch in batches for row in batch for i in row.rows]
    assert sorted(datums) == list(range(len(lengths)))
    for batch in batches:
        widths = [sum(lengths[i] for i in row.rows) for row in batch]
        assert all(w <= 64 or row.rows == (60,) for w, row in zip(widths, batch, strict=True))
        assert len(batch) * max(widths) <= 200 or len(batch) == 1
    assert any(PackedRow((60,)) in batch for batch in batches)  # the long datum: a row of its own


def _lora(base: torch.nn.Module, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "lm_head"])
    return get_peft_model(base, config)


@pytest.fixture(scope="module", params=["tiny", "qwen2", "qwen3"])
def model(request):
    """tiny (Llama), and small random Qwen2 (biased q/k/v) and Qwen3 (q/k norms) models, with LoRA (B not zero)."""
    if request.param == "tiny":
        base = build_tiny_model()[0]
    else:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(small_config(request.param))
    return _lora(base.eval().requires_grad_(False), seed=1)


def _plain(model, ids: list[int], targets: list[int]) -> torch.Tensor:
    """The definition: one forward on the datum alone, full log-softmax."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (T, V)
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(targets)]


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_rows_equal_one_forward_per_datum(model, checkpointing):
    g = torch.Generator().manual_seed(4)
    sequences = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (9, 3, 14, 1, 6, 11, 2)]
    targets = [torch.randint(3, 250, (len(s),), generator=g).tolist() for s in sequences]
    weights = [torch.rand(len(s), generator=g) for s in sequences]

    expected = [_plain(model, s, t) for s, t in zip(sequences, targets, strict=True)]
    torch.stack([(w * e).sum() for w, e in zip(weights, expected, strict=True)]).sum().backward()
    expected_grads = _grads(model)

    paths = GpuPaths(row_tokens=16, logit_chunk=5, checkpointing=checkpointing)
    batches = plan([len(s) for s in sequences], paths.row_tokens, max_tokens=40)
    assert len(batches) > 1 and any(len(row.rows) > 1 for batch in batches for row in batch)  # packed, padded
    got: dict[int, torch.Tensor] = {}
    for batch in batches:
        got.update(packed_logprobs(model, [torch.tensor(s) for s in sequences], [torch.tensor(t) for t in targets],
                                   batch, 0, paths))
    assert sorted(got) == list(range(len(sequences)))
    for i, e in enumerate(expected):
        torch.testing.assert_close(got[i], e.detach(), atol=2e-5, rtol=1e-5)
    torch.stack([(weights[i] * got[i]).sum() for i in range(len(sequences))]).sum().backward()
    grads = _grads(model)
    assert grads.keys() == expected_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=2e-5, rtol=1e-4, msg=name)


def test_checkpointing_recomputes_the_layers_and_gives_the_same_gradients():
    model = _lora(build_tiny_model()[0].eval().requires_grad_(False), seed=5)
    decoder = model.get_base_model().get_decoder()
    ids = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(6))
    calls = []
    # the first module of each layer (a recompute stops early, once it has what the backward pass needs)
    hooks = [layer.input_layernorm.register_forward_hook(lambda *_: calls.append(1)) for layer in decoder.layers]
    results = []
    for on in (False, True):
        calls.clear()
        with checkpointed(decoder.layers, on):
            loss = model(input_ids=ids).logits.float().logsumexp(-1).sum()
        loss.backward()
        results.append((len(calls), _grads(model)))
    for hook in hooks:
        hook.remove()
    layers = len(decoder.layers)
    assert results[0][0] == layers and results[1][0] == 2 * layers  # each layer ran again in the backward pass
    assert all("forward" not in vars(layer) for layer in decoder.layers)  # put back as it was
    for name, grad in results[1][1].items():
        torch.testing.assert_close(grad, results[0][1][name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_the_engine_on_gpu_paths_trains_as_on_its_cpu_path(loss_fn, monkeypatch):
    # Same datums, same seed: losses, logprobs, gradient norms and the weights after two steps agree between the
    # shared-prefix CPU path and the packed GPU paths (with small rows and chunks, so both really pack and chunk).
    data = loss_batch(loss_fn)
    packed_calls = []
    real = packing.packed_logprobs
    monkeypatch.setattr(packing, "packed_logprobs", lambda *a, **k: packed_calls.append(1) or real(*a, **k))
    runs = []
    for paths in (None, GpuPaths(row_tokens=20, logit_chunk=6)):
        engine = Engine(device="cpu", gpu_paths=paths, max_tokens_per_microbatch=40)
        tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model="tiny", rank=4, seed=8)
        outputs = []
        for _ in range(2):
            out = tc.forward_backward(data, loss_fn, LOSS_CONFIGS.get(loss_fn)).result()
            step = tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            outputs.append((out, step.metrics["grad_norm:mean"]))
        runs.append((outputs, tc.parameters()))
        assert bool(packed_calls) == (paths is not None)  # each engine took its own path
    (cpu, cpu_weights), (gpu, gpu_weights) = runs
    for (a, norm_a), (b, norm_b) in zip(cpu, gpu, strict=True):
        assert a.metrics.keys() == b.metrics.keys()
        for key in a.metrics:
            assert b.metrics[key] == pytest.approx(a.metrics[key], rel=1e-4, abs=1e-5), key
        assert norm_b == pytest.approx(norm_a, rel=1e-4)
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
            torch.testing.assert_close(y["logprobs"].to_torch(), x["logprobs"].to_torch(), atol=1e-5, rtol=1e-5)
    # AdamW (eps 1e-12) moves an element whose gradient is ~1e-9 by about the learning rate whatever that gradient's
    # rounding, so the weights are compared to 1% of one step (lr 1e-2); logprobs and norms above are held tighter.
    for name, value in cpu_weights.items():
        torch.testing.assert_close(gpu_weights[name], value, atol=1e-4, rtol=1e-4, msg=name)


def test_custom_losses_get_cpu_logprobs_that_carry_gradient():
    engine = Engine(device="cpu", gpu_paths=GpuPaths(row_tokens=16))
    tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model="tiny", rank=4, seed=9)
    datum = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 4})

    def nll(data, logprobs_list):
        assert all(lp.device.type == "cpu" and lp.requires_grad for lp in logprobs_list)
        return -sum((d.loss_fn_inputs["weights"].to_torch() * lp).sum() for d, lp in zip(data, logprobs_list,
                                                                                            strict=True)), {}

    custom = tc.forward_backward_custom([datum], nll).result()
    assert tc.optim_step(types.AdamParams(learning_rate=0.0)).result().metrics["grad_norm:mean"] > 0
    builtin = tc.forward_backward([datum], "cross_entropy").result()
    assert custom.metrics["loss:sum"] == pytest.approx(builtin.metrics["loss:sum"], rel=1e-6)
