"""GpuDecoder: its decode steps give the logits of the model's own forward with a cache (``sampler.prefill``, then one
token per row through Hugging Face's forward), for Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms), with and without
LoRA, on the reference kernels and on Triton's (interpreted on the CPU, compiled on CUDA: ``gpu``); rows leave;
unsupported models are refused."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from rlvr.engine.gpu.decode import GpuDecoder
from rlvr.engine.gpu.kernels import REFERENCE
from rlvr.engine.models.random_models import small_config
from rlvr.engine.sample.kv_cache import cache_kwargs
from rlvr.engine.sample.sampler import prefill
from triton_devices import DEVICES, triton_kernels_on

PROMPTS = [[5, 6, 7, 8, 9], [20, 21], [30, 31, 32]]  # of three lengths: the prefill left-pads two of them
STEPS = 3
# float32: rounding (seen: ~1e-6); bfloat16: a few last bits of logits near 2.5 (seen: up to 0.06, 4 bits)
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 0.0}, torch.bfloat16: {"atol": 0.1, "rtol": 0.0}}


def small(architecture: str, adapter: bool, dtype: torch.dtype, device: str, layers: int = 2) -> torch.nn.Module:
    """A random model of ``layers`` layers (heads of 16, two query heads per key/value head); with ``adapter``,
    wrapped by peft with a LoRA adapter on every projection whose B matrices are not zero."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = small_config(architecture, num_hidden_layers=layers)
        model = AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    if adapter:
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        model.eval()
    return model.to(dtype=dtype, device=device)


def decode_both(model, kernels, steps: int = STEPS, keep: list[int] | None = None):
    """Prefill ``PROMPTS``, then ``steps`` random tokens per row through the model's forward with its cache and
    through a ``GpuDecoder`` started on the same prefilled cache: both logits (rows, V) per step. With ``keep``,
    only those rows go on after the first step."""
    device = next(model.parameters()).device
    capacity = max(len(p) for p in PROMPTS) + steps
    cache, mask, _ = prefill(model, PROMPTS, pad_id=0, capacity=capacity)
    decoder = GpuDecoder.build(model, kernels)
    assert decoder is not None
    decoder.start([(layer.keys, layer.values) for layer in cache.layers], mask, capacity)
    mask = torch.cat([mask, mask.new_zeros(len(PROMPTS), steps)], dim=1)  # (R, P + steps)
    positions = mask.sum(-1)  # each row's next position
    gen = torch.Generator().manual_seed(0)
    pairs = []
    for step in range(steps):
        tokens = torch.randint(1, 200, (len(positions),), generator=gen).to(device)
        width = len(PROMPTS[0]) + step
        mask[:, width] = 1
        with torch.inference_mode():
            out = model(input_ids=tokens[:, None], attention_mask=mask[:, : width + 1], position_ids=positions[:, None],
                        **cache_kwargs(cache))
        pairs.append((decoder.step(tokens, positions), out.logits[:, -1].float()))
        positions = positions + 1
        if keep is not None and step == 0:
            rows = torch.tensor(keep, device=device)
            decoder.keep(rows)
            cache.batch_select_indices(rows)
            mask, positions = mask[rows], positions[rows]
    return pairs


@pytest.mark.parametrize("adapter", [False, True])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_steps_give_the_models_logits(architecture, adapter, dtype):
    model = small(architecture, adapter, dtype, "cpu")
    for ours, theirs in decode_both(model, REFERENCE):
        torch.testing.assert_close(ours, theirs, **TOLERANCE[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("architecture", "dtype"), [("llama", torch.float32), ("qwen2", torch.float32),
                                                     ("qwen3", torch.float32), ("qwen3", torch.bfloat16)])
def test_triton_steps_give_the_models_logits(device, architecture, dtype):
    # Interpreted, each kernel launch costs ~0.1 s: one layer and two steps (the second reads the first's column).
    kernels = triton_kernels_on(device)
    model = small(architecture, True, dtype, device, layers=1 if device == "cpu" else 2)
    for ours, theirs in decode_both(model, kernels, steps=2 if device == "cpu" else STEPS):
        torch.testing.assert_close(ours, theirs, **TOLERANCE[dtype])


def test_rows_that_leave_keep_their_own_logits():
    model = small("llama", True, torch.float32, "cpu")
    for ours, theirs in decode_both(model, REFERENCE, keep=[2, 0]):
        torch.testing.assert_close(ours, theirs, **TOLERANCE[torch.float32])


def test_the_adapter_changes_the_logits():
    # Guards the tests above: an adapter the decoder ignored would pass them only if it changed nothing.
    plain, tuned = (decode_both(small("qwen3", adapter, torch.float32, "cpu"), REFERENCE, steps=1)[0][0]
                    for adapter in (False, True))
    assert (plain - tuned).abs().max() > 1e-2


def test_unsupported_models_are_refused():
    model = small("llama", False, torch.float32, "cpu")
    model.config.hidden_act = "gelu"
    assert GpuDecoder.build(model, REFERENCE) is None
    dora = get_peft_model(small("llama", False, torch.float32, "cpu"),
                          LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert GpuDecoder.build(dora, REFERENCE) is None
