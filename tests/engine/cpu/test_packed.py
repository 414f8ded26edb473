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


def test_a_bfloat16_frozen_linear_is_the_bfloat16_product(bfloat16_kind):
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(64, 96).requires_grad_(False)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    assert packed.pack_frozen_linears(layer, "bfloat16") == 1
    assert packed.model_kind(layer) == bfloat16_kind and packed.bfloat16_head(layer)
    x = torch.randn(300, 64, generator=gen, requires_grad=True)  # a trainer's rows: past the AMX kernel's band
    grad = torch.randn(300, 96, generator=gen)
    out = layer(x)
    (out * grad).sum().backward()
    exact = (x.detach().bfloat16().double() @ weight.bfloat16().double().T).float() + bias  # of the rounded operands
    if bfloat16_kind == "bf16":  # oneDNN's: rounded to bfloat16; float32 sums may round it one bfloat16 step apart
        torch.testing.assert_close(out, bf16_product(x.detach(), weight) + bias, atol=1e-6, rtol=2**-7)
        assert (out - exact).abs().max() > 1e-4  # the rounded output: the test can tell the kinds apart
    else:  # the AMX kernel's one-product form: the same products, the sum kept in float32
        torch.testing.assert_close(out, exact, atol=1e-5, rtol=1e-5)
    # the input gradient on oneDNN's bfloat16 kernel in either case
    torch.testing.assert_close(x.grad, bf16_product(grad, weight.T), atol=1e-6, rtol=2**-7)
    assert (out - F.linear(x, weight, bias)).abs().max() > 1e-4  # not float32: the test above can tell


def test_the_sampler_multiplies_in_the_trainers_precision(bfloat16_kind):
    # A host in bfloat16 packs its frozen linears in bfloat16, and the decoder it samples with follows: its
    # logits are the model's own forward's (bfloat16 too) to bfloat16 rounding, and farther from float32's.
    from rlvr.engine.cpu.decode import LlamaDecoder
    from rlvr.engine.sample.sampler import prefill_each

    host = AdapterHost(load_base_model("tiny"), "bfloat16")
    reference = load_base_model("tiny").model
    decoder = LlamaDecoder.build(host.model)
    prompt = [5, 6, 7, 8]
    prompts, mask, _ = prefill_each(host.model, [prompt])
    decoder.start(prompts, mask, torch.tensor([0, 0]), capacity=8)
    assert decoder.head.pack_kind == bfloat16_kind  # the trainer's kernel
    logits = decoder.step(torch.tensor([9, 9]), torch.tensor([4, 4]))
    with torch.inference_mode():
        own = host.model(input_ids=torch.tensor([[*prompt, 9]])).logits[0, -1]
        float32 = reference(input_ids=torch.tensor([[*prompt, 9]])).logits[0, -1]
    # the AMX kernel's one-product form: a row's products whatever the rows beside it, so the decoder's one row and
    # the forward's five agree but for the order of float32 sums outside the products (0 here); oneDNN's kernel may
    # take another path for one row than for five, and a flipped bfloat16 rounding grows through the layers
    close = {"atol": 1e-5, "rtol": 0} if bfloat16_kind == "bf16x1" else {"atol": 0.02, "rtol": 0.02}
    torch.testing.assert_close(logits[0], own, **close)
    assert (own - float32).abs().max() > 1e-4
    # nearer the bfloat16 forward than the float32 one (the AMX kernel's float32 form here: 0.032 against 0.031)
    assert (logits[0] - own).abs().max() < 0.75 * (logits[0] - float32).abs().max()
