"""Llama 3, Qwen2 / Qwen2.5 and Qwen3 from local Hugging Face folders (random weights, written here, no download):
each loads through ``base_model=<folder>``, takes LoRA on the modules it should, trains a step, samples, and its
sampler's logprobs equal its trainer's, on the CPU paths and on the GPU paths (run on the CPU), there also through
rlvr's own decode step."""

import pytest
import torch
from peft.tuners.lora import LoraLayer

import rlvr
from datums import rl_datum
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.device import GpuPaths
from rlvr.engine.models.random_models import small_config, write_model_folder

# What LoRA attaches to on each: the attention and MLP projections and the output head, under the same names on all
# three. Qwen2's q/k/v carry a bias (LoRA adds to the biased product); Qwen3 has q_norm and k_norm, RMSNorms on
# each head's queries and keys, which take no adapter.
ADAPTED = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
MARKS = {"llama": ("LlamaForCausalLM", set()), "qwen2": ("Qwen2ForCausalLM", {"q_proj.base_layer.bias"}),
         "qwen3": ("Qwen3ForCausalLM", {"q_norm", "k_norm"})}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("architectures")
    return {arch: str(write_model_folder(small_config(arch), root / arch, seed=1)) for arch in MARKS}


@pytest.fixture(scope="module", params=["cpu paths", "gpu paths", "gpu paths, rlvr's decode step"])
def service(request):
    """An engine on the CPU paths, on the GPU paths, or on the GPU paths decoding through rlvr's own step (the
    reference kernels: ``gpu/decode.py``, ``GpuPaths.decode_step``)."""
    paths = None if request.param == "cpu paths" else GpuPaths(
        row_tokens=64, sync_every=4, decode_step="reference" if "decode step" in request.param else "hf")
    return rlvr.ServiceClient(Engine(device="cpu", gpu_paths=paths)), paths is not None


@pytest.mark.parametrize("arch", sorted(MARKS))
def test_loads_adapts_trains_and_samples_as_it_trains(folders, service, arch):
    service, gpu_paths = service
    tc = service.create_lora_training_client(base_model=folders[arch], rank=4, seed=2)
    model = tc._trainer.host.peft.get_base_model()
    kind, marks = MARKS[arch]
    assert type(model).__name__ == kind
    names = {name for name, _ in model.named_modules()} | {name for name, _ in model.named_parameters()}
    assert all(any(n.endswith(mark) for n in names) for mark in marks), marks  # the architecture is the real one
    adapted = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    assert adapted == ADAPTED

    tok = tc.get_tokenizer()
    tokens = tok.encode("a line for the adapter to learn")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    before = tc.parameters()
    first = tc.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    after = tc.parameters()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=2e-2))
    assert tc.forward([datum], "cross_entropy").result().metrics["loss:sum"] < first

    sampler = tc.save_weights_and_get_sampling_client()
    prompts = [tok.encode("a line"), tok.encode("for")]  # two lengths: left padding in the batch
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=3, stop=[])
    futures = [sampler.sample(types.ModelInput.from_ints(p), 2, params) for p in prompts]
    worst = 0.0
    for prompt, future in zip(prompts, futures, strict=True):
        for seq in future.result().sequences:
            assert len(seq.tokens) == len(seq.logprobs) == 10
            out = tc.forward([rl_datum(prompt, seq.tokens, seq.logprobs, 0.0)], "importance_sampling").result()
            trainer = out.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]
            worst = max(worst, float((trainer - torch.tensor(seq.logprobs)).abs().max()))
    # float32 on both sides; the CPU paths' decoder may multiply on AMX (three bfloat16 products, ~1e-4 on logits)
    assert worst < (1e-4 if gpu_paths else 1e-3), worst
