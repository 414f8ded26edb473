"""Device selection: names resolve or fail naming the value and the fix, the default precision follows the device, the
process engine keeps its device, and an engine on the GPU paths never loads the CPU kernels.

No GPU here: "a machine with two GPUs" is torch.cuda's answers replaced (``fake_gpus``); nothing runs on it."""

import importlib
import sys

import pytest
import torch

import rlvr
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.device import GpuPaths, resolve_device, resolve_precision, weight_dtype
from rlvr.errors import ConfigurationError


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("RLVR_DEVICE", raising=False)
    monkeypatch.delenv("RLVR_PRECISION", raising=False)


@pytest.fixture
def fake_gpus(monkeypatch, no_env):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


@pytest.fixture
def no_gpu(monkeypatch, no_env):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_takes_the_gpu_only_when_there_is_one(no_gpu, monkeypatch):
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == resolve_device(None) == torch.device("cuda", 0)


def test_cuda_names_carry_their_index(fake_gpus):
    assert resolve_device("cuda") == resolve_device("cuda:0") == resolve_device(torch.device("cuda")) == \
        torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_names_the_value_and_the_fix(no_gpu):
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ConfigurationError, match=rf"device='{name}', but torch sees no CUDA GPU.*use 'cpu' or "
                                                     r"'auto'"):
            resolve_device(name)


def test_a_bad_index_names_the_gpus_there_are(fake_gpus):
    with pytest.raises(ConfigurationError, match=r"device='cuda:2', but this machine has 2 CUDA GPU\(s\), cuda:0 to "
                                                 r"cuda:1"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "mps", "", 3])
def test_a_bad_name_lists_the_choices(fake_gpus, name):
    with pytest.raises(ConfigurationError, match=r"choose auto, cpu, cuda or cuda:N"):
        resolve_device(name)


def test_rlvr_device_is_the_default_and_named_when_wrong(no_gpu, monkeypatch):
    monkeypatch.setenv("RLVR_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setenv("RLVR_DEVICE", "cuda")
    with pytest.raises(ConfigurationError, match="RLVR_DEVICE='cuda', but torch sees no CUDA GPU"):
        resolve_device(None)
    assert resolve_device("cpu") == torch.device("cpu")  # an explicit device wins over the variable


def test_precision_defaults_follow_the_device(fake_gpus, monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_precision(None, cpu) == "float32"
    assert resolve_precision(None, gpu) == "bfloat16"
    assert resolve_precision("float32", gpu) == "float32"
    assert weight_dtype("bfloat16", gpu) == torch.bfloat16
    assert weight_dtype("float32", gpu) == weight_dtype("bfloat16", cpu) == torch.float32  # CPU: packed copies
    monkeypatch.setenv("RLVR_PRECISION", "float32")
    assert resolve_precision(None, gpu) == "float32"
    with pytest.raises(ConfigurationError, match=r"precision='float16': choose one of \['float32', 'bfloat16'\]"):
        resolve_precision("float16", gpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(ConfigurationError, match="no bfloat16 arithmetic.*use precision='float32'"):
        resolve_precision("bfloat16", gpu)


def test_gpu_paths_settings_are_checked():
    with pytest.raises(ConfigurationError, match="GpuPaths.row_tokens must be a positive integer, got 0"):
        GpuPaths(row_tokens=0)
    with pytest.raises(ConfigurationError, match="GpuPaths.sync_every"):
        GpuPaths(sync_every=True)
    with pytest.raises(ConfigurationError, match="GpuPaths.decode_step='fast': choose 'hf'.*'triton'.*'reference'"):
        GpuPaths(decode_step="fast")


def test_the_process_engine_keeps_its_device(no_gpu, monkeypatch):
    monkeypatch.setattr(Engine, "_default", None)
    engine = Engine.default(device="cpu")
    assert engine.device == torch.device("cpu") and engine.gpu_paths is None
    assert Engine.default() is engine and Engine.default(device="auto") is engine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ConfigurationError, match=r"device='cuda', but this process's engine already runs on cpu.*"
                                                 r"RLVR_DEVICE=cuda"):
        Engine.default(device="cuda")


def test_service_client_passes_its_device_on(no_gpu, monkeypatch):
    monkeypatch.setattr(Engine, "_default", None)
    service = rlvr.ServiceClient(device="cpu", api_key="ignored")
    assert service.engine is Engine._default and service.engine.device == torch.device("cpu")
    with pytest.raises(ConfigurationError, match="device='cuda'"):
        rlvr.ServiceClient(device="cuda")
    own = Engine(device="cpu")
    assert rlvr.ServiceClient(own, device="cpu").engine is own


def test_a_gpu_paths_engine_on_the_cpu_runs_float32_only():
    with pytest.raises(ConfigurationError, match="precision='bfloat16', but GPU paths on the CPU run in float32"):
        Engine(device="cpu", precision="bfloat16", gpu_paths=GpuPaths())


CPU_KERNELS = ("rlvr.engine.cpu.packed", "rlvr.engine.cpu.amx_linear", "rlvr.engine.cpu.fused_attention",
               "rlvr.engine.cpu.decode", "rlvr.engine.cpu.native")


class _Forbidden:
    """An import finder that refuses the CPU kernels' modules."""

    def find_spec(self, name, path=None, target=None):
        if name in CPU_KERNELS:
            raise ImportError(f"{name} imported")
        return None


def _train_and_sample(service) -> None:
    tc = service.create_lora_training_client(base_model="tiny", rank=2, seed=0)
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sampler = tc.save_weights_and_get_sampling_client()
    sampler.sample(types.ModelInput.from_ints([1, 2]), 2, types.SamplingParams(max_tokens=3)).result()
    sampler.compute_logprobs(types.ModelInput.from_ints([1, 2, 3])).result()


def test_the_gpu_paths_never_import_the_cpu_kernels(monkeypatch):
    # What a CUDA engine runs, run on the CPU with rlvr's engine and client imported afresh while the CPU kernels'
    # modules are unloaded and their import refused: importing, creating the engine, training, sampling and prompt
    # logprobs all work. The CPU paths do import them (the control: the refusal is seen).
    for name in ("client", "engine"):  # put back afterwards: a fresh import rebinds the package's attributes
        monkeypatch.setattr(rlvr, name, importlib.import_module(f"rlvr.{name}"))
    for name in [m for m in sys.modules if m in ("rlvr.client", "rlvr.engine") or m.startswith("rlvr.engine.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Forbidden(), *sys.meta_path])
    client = importlib.import_module("rlvr.client")
    engine, device = importlib.import_module("rlvr.engine.engine"), importlib.import_module("rlvr.engine.device")
    _train_and_sample(client.ServiceClient(engine.Engine(device="cpu", gpu_paths=device.GpuPaths())))
    with pytest.raises(ImportError, match="rlvr.engine.cpu.packed imported"):
        _train_and_sample(client.ServiceClient(engine.Engine(device="cpu")))


def test_models_load_in_the_weight_dtype_with_float32_rope(tmp_path):
    # What a CUDA engine asks for (bfloat16 weights), asked on the CPU: every parameter in bfloat16, RoPE's inverse
    # frequencies (a buffer) still float32, frozen; the same for a Hugging Face folder.
    from rlvr.engine.models.load import load_base_model
    from rlvr.engine.models.random_models import small_config, write_model_folder

    folder = write_model_folder(small_config("qwen3"), tmp_path / "qwen3")
    for name in ("tiny", str(folder)):
        model = load_base_model(name, "cpu", torch.bfloat16, "sdpa").model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert model.model.rotary_emb.inv_freq.dtype == torch.float32
        assert not any(p.requires_grad for p in model.parameters()) and not model.training
        assert model.config._attn_implementation == "sdpa"
