"""The engine on CUDA against the engine on the CPU, on ``tiny`` in float32: the same logprobs, losses and steps for
every loss of the table; a resumed run equal to an uninterrupted one; a state moved GPU -> CPU -> GPU; bfloat16
base weights by default with float32 LoRA and AdamW state; no CPU kernel loaded.

Run on a machine with an NVIDIA GPU: ``pytest tests/gpu -m gpu``. (The CPU suite on such a machine needs
``RLVR_DEVICE=cpu``: its process engine would otherwise take the GPU.)"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rlvr
from datums import LOSS_CONFIGS, loss_batch
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.train.losses import LOSSES

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ADAM = types.AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=5.0)


def run(engine: Engine, loss_fn: str, steps: int = 2):
    tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model="tiny", rank=4, seed=8)
    outputs = []
    for _ in range(steps):
        out = tc.forward_backward(loss_batch(loss_fn), loss_fn, LOSS_CONFIGS.get(loss_fn)).result()
        norm = tc.optim_step(ADAM).result().metrics["grad_norm:mean"]
        outputs.append((out, norm))
    return outputs, tc.parameters()


@pytest.fixture(scope="module")
def engines():
    return Engine(device="cpu"), Engine(device="cuda", precision="float32")


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_cuda_trains_as_the_cpu_does_in_float32(engines, loss_fn):
    (cpu, cpu_weights), (gpu, gpu_weights) = (run(engine, loss_fn) for engine in engines)
    for (a, norm_a), (b, norm_b) in zip(cpu, gpu, strict=True):
        for key in a.metrics:
            assert b.metrics[key] == pytest.approx(a.metrics[key], rel=1e-4, abs=1e-4), key
        assert norm_b == pytest.approx(norm_a, rel=1e-4)
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs, strict=True):
            torch.testing.assert_close(y["logprobs"].to_torch(), x["logprobs"].to_torch(), atol=1e-4, rtol=0)
    for name, value in cpu_weights.items():
        assert gpu_weights[name].device.type == "cpu"  # parameters() hands back copies on the CPU
        torch.testing.assert_close(gpu_weights[name], value, atol=1e-4, rtol=1e-3, msg=name)


def steps(tc, n: int) -> dict[str, torch.Tensor]:
    for _ in range(n):
        tc.forward_backward(loss_batch("importance_sampling"), "importance_sampling")
        tc.optim_step(ADAM)
    return tc.parameters()


def test_a_resumed_run_equals_an_uninterrupted_one_on_cuda(engines):
    service = rlvr.ServiceClient(engines[1])
    original = service.create_lora_training_client(base_model="tiny", rank=8, seed=21)
    steps(original, 2)
    path = original.save_state("cuda-mid").result().path
    resumed = service.create_training_client_from_state_with_optimizer(path)
    a, b = steps(original, 3), steps(resumed, 3)
    for name in a:  # equal up to CUDA's atomic adds in the backward pass (an index_put's gradient)
        torch.testing.assert_close(b[name], a[name], atol=1e-6, rtol=1e-6, msg=name)


def test_a_state_moves_gpu_to_cpu_to_gpu(engines):
    cpu, gpu = (rlvr.ServiceClient(engine) for engine in engines)
    straight = gpu.create_lora_training_client(base_model="tiny", rank=8, seed=22)
    want = steps(straight, 6)

    on_gpu = gpu.create_lora_training_client(base_model="tiny", rank=8, seed=22)
    steps(on_gpu, 2)
    path = on_gpu.save_state("to-cpu").result().path
    on_cpu = cpu.create_training_client_from_state_with_optimizer(path)
    assert all(v.device.type == "cpu" for v in on_cpu.parameters().values())
    steps(on_cpu, 2)
    back = gpu.create_training_client_from_state_with_optimizer(on_cpu.save_state("to-gpu").result().path)
    assert back._trainer.optimizer.state  # the AdamW moments came along, onto the GPU
    assert all(s["exp_avg"].device.type == "cuda" for s in back._trainer.optimizer.state.values())
    got = steps(back, 2)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-4, rtol=1e-3, msg=name)


def test_cuda_defaults_to_bfloat16_base_weights_with_float32_adapters():
    engine = Engine(device="cuda")
    assert engine.precision == "bfloat16" and engine.gpu_paths is not None
    tc = rlvr.ServiceClient(engine).create_lora_training_client(base_model="tiny", rank=4, seed=1)
    host = tc._trainer.host
    base = host.base.model
    assert base.model.embed_tokens.weight.dtype == torch.bfloat16 and base.device.type == "cuda"
    assert base.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE's frequencies were not rounded
    assert all(p.dtype == torch.float32 and p.is_cuda for p in host.parameters(tc._trainer.adapter).values())
    steps(tc, 1)
    state = tc._trainer.optimizer.state
    assert state and all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_a_cuda_engine_loads_no_cpu_kernel():
    script = textwrap.dedent("""
        import sys
        import rlvr
        from rlvr import types
        from rlvr.engine import Engine
        tc = rlvr.ServiceClient(Engine(device="cuda")).create_lora_training_client(base_model="tiny", rank=2)
        datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                            loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})
        tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        sampler = tc.save_weights_and_get_sampling_client()
        sampler.sample(types.ModelInput.from_ints([1, 2]), 2, types.SamplingParams(max_tokens=3)).result()
        print(sorted(m for m in sys.modules if m.split(".")[-1] in
                     ("packed", "amx_linear", "fused_attention", "decode", "native") and m.startswith("rlvr")))
    """)
    src = str(Path(rlvr.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
