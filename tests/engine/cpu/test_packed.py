"""Prepacked matmuls: a packed frozen linear gives F.linear's output and input gradient; a model whose frozen
linears are packed gives the unpacked model's logits and LoRA gradients."""

import pytest
import torch
import torch.nn.functional as F

from rlvr.engine import Engine
from rlvr.engine.cpu import packed
from rlvr.engine.models.load import load_base_model
from rlvr.engine.models.lora import AdapterHost, LoraSpec
from rlvr.errors import ConfigurationError

pytestmark = pytest.mark.skipif("mkldnn" not in packed.pack_kinds(), reason="this torch has no oneDNN matmul")


@pytest.fixture
def force(monkeypatch):
    """Make the process-wide kernel choice for the trainer, instead of timing it."""
    def choose(kind: str) -> None:
        monkeypatch.setattr(packed, "_CHOSEN", {"train": kind})
    return choose


def test_a_packed_frozen_linear_matches_f_linear(force):
    force("mkldnn")
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(48, 80).requires_grad_(False)
    reference = torch.nn.Linear(48, 80).requires_grad_(False)
    reference.load_state_dict(layer.state_dict())
    assert packed.pack_frozen_linears(layer) == 1
    x = torch.randn(3, 7, 48, generator=gen, requires_grad=True)  # (batch, tokens, features), as a model feeds it
    x_ref = x.detach().clone().requires_grad_(True)
    grad = torch.randn(3, 7, 80, generator=gen)
    out, out_ref = layer(x), F.linear(x_ref, reference.weight, reference.bias)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    (out * grad).sum().backward()
    (out_ref * grad).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)  # g @ W, on the packed transpose
    assert x.grad.abs().max() > 0.1  # not trivially zero


def test_a_linear_that_trains_is_not_packed(force):
    force("mkldnn")
    assert packed.pack_frozen_linears(torch.nn.Linear(4, 4)) == 0  # requires_grad: its weight changes


def lora_logits_and_grads(kind: str, force) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    force(kind)
    host = AdapterHost(load_base_model("tiny"))
    assert any(hasattr(m, "packed_weight") for m in host.base.model.modules()) == bool(kind)
    host.add("tuned", LoraSpec(rank=4), seed=0)
    params = host.parameters("tuned")
    with torch.no_grad():
        for name, param in params.items():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    with host.active("tuned") as model:
        logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10]])).logits
        logits.log_softmax(-1)[0, :, 3].sum().backward()
    return logits.detach(), {k: p.grad.clone() for k, p in params.items()}


def test_a_packed_model_gives_the_same_logits_and_lora_gradients(force):
    logits, grads = lora_logits_and_grads("mkldnn", force)
    logits_ref, grads_ref = lora_logits_and_grads("", force)
    torch.testing.assert_close(logits, logits_ref, atol=2e-5, rtol=1e-4)
    for key in grads_ref:
        torch.testing.assert_close(grads[key], grads_ref[key], atol=2e-5, rtol=1e-4)
    assert any(grads_ref[k].abs().max() > 1e-3 for k in grads_ref if "lora_A" in k)  # gradients reach the A's


def test_the_environment_can_fix_the_kernel(monkeypatch):
    weight = torch.randn(8, 4)
    monkeypatch.setenv("RLVR_MATMUL", "plain")
    assert packed.fastest_kind("decode", weight, 16) == ""
    monkeypatch.setenv("RLVR_MATMUL", "mkldnn")
    assert packed.fastest_kind("train", weight, 16, kinds=["mkldnn"]) == "mkldnn"
    monkeypatch.setenv("RLVR_MATMUL", "mkl")  # a kind the trainer does not take: plain there, MKL's for decoding
    assert packed.fastest_kind("train", weight, 16, kinds=["mkldnn"]) == ""
    assert packed.fastest_kind("decode", weight, 16) == "mkl"
    monkeypatch.setenv("RLVR_MATMUL", "blas")
    with pytest.raises(ConfigurationError, match="RLVR_MATMUL='blas': choose plain or one of \\['mkldnn', 'mkl'"):
        packed.fastest_kind("train", weight, 16, kinds=["mkldnn"])


# -- precision ----------------------------------------------------------------------------------------------------

needs_bf16 = pytest.mark.skipif(not packed.bfloat16_supported(), reason="no oneDNN bfloat16 matmul on this CPU")


def test_precision_is_float32_unless_asked_and_checked(monkeypatch):
    monkeypatch.delenv("RLVR_PRECISION", raising=False)
    assert packed.base_precision() == "float32"
    with pytest.raises(ConfigurationError, match=r"precision='float16': choose one of \['float32', 'bfloat16'\]"):
        packed.base_precision("float16")
    monkeypatch.setenv("RLVR_PRECISION", "fp8")
    with pytest.raises(ConfigurationError, match="RLVR_PRECISION='fp8'"):
        packed.base_precision()
    assert packed.base_precision("float32") == "float32"  # an explicit choice wins over the environment


def test_an_engine_refuses_a_precision_this_machine_lacks(monkeypatch):
    # rlvr.precision only knows the names; whether the CPU can multiply in bfloat16 is the engine's to check.
    monkeypatch.setattr(packed, "bfloat16_supported", lambda: False)
    assert packed.supported_precision("float32") == "float32"
    with pytest.raises(ConfigurationError, match="bfloat16 needs oneDNN's bfloat16 matmul"):
        Engine(precision="bfloat16")


def test_the_shared_engine_keeps_its_precision(monkeypatch):
    # One engine per process: asking it for another precision once it exists is an error, not a silent switch.
    monkeypatch.setattr(Engine, "_default", None)
    engine = Engine.default("float32")
    assert Engine.default() is engine and Engine.default("float32") is engine
    with pytest.raises(ConfigurationError, match="bfloat16"):  # on a CPU without it: base_precision says so
        Engine.default("bfloat16")
    if packed.bfloat16_supported():
        with pytest.raises(ConfigurationError, match=r"already multiplies in float32 .* RLVR_PRECISION=bfloat16"):
            Engine.default("bfloat16")


def bf16_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T of the bfloat16-rounded operands, summed exactly, rounded to bfloat16: what the kernel should give."""
    return (a.bfloat16().double() @ b.bfloat16().double().T).bfloat16().float()


@needs_bf16
def test_a_bfloat16_frozen_linear_is_the_bfloat16_product():
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 96).requires_grad_(False)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    assert packed.pack_frozen_linears(layer, "bfloat16") == 1
    assert packed.model_kind(layer) == "bf16"
    x = torch.randn(5, 64, generator=gen, requires_grad=True)
    grad = torch.randn(5, 96, generator=gen)
    out = layer(x)
    (out * grad).sum().backward()
    # Sums in float32 may differ from the exact sum in the last bits before rounding to bfloat16: one bfloat16 step.
    expected = bf16_product(x.detach(), weight) + bias
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=2**-7)
    torch.testing.assert_close(x.grad, bf16_product(grad, weight.T), atol=1e-6, rtol=2**-7)
    assert (out - F.linear(x, weight, bias)).abs().max() > 1e-4  # not float32: the test above can tell


@needs_bf16
def test_the_sampler_multiplies_in_the_trainers_precision():
    # A host in bfloat16 packs its frozen linears in bfloat16, and the decoder it samples with follows: its
    # logits are the model's own forward's (bfloat16 too) to bfloat16 rounding, and far from float32's.
    from rlvr.engine.cpu.decode import LlamaDecoder
    from rlvr.engine.sample.sampler import prefill_each

    host = AdapterHost(load_base_model("tiny"), "bfloat16")
    reference = load_base_model("tiny").model
    decoder = LlamaDecoder.build(host.model)
    prompt = [5, 6, 7, 8]
    prompts, mask, _ = prefill_each(host.model, [prompt])
    decoder.start(prompts, mask, torch.tensor([0, 0]), capacity=8)
    assert decoder.head.pack_kind == "bf16"
    logits = decoder.step(torch.tensor([9, 9]), torch.tensor([4, 4]))
    with torch.inference_mode():
        own = host.model(input_ids=torch.tensor([[*prompt, 9]])).logits[0, -1]
        float32 = reference(input_ids=torch.tensor([[*prompt, 9]])).logits[0, -1]
    torch.testing.assert_close(logits[0], own, atol=0.02, rtol=0.02)
    assert (own - float32).abs().max() > 1e-4
