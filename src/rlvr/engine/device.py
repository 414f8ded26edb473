"""Where the engine computes: the device (CPU or one CUDA GPU), the precision of the base weights there, and which
trainer and sampler paths it takes; the machine's part of the numerics policy (``rlvr.numerics``).

- ``resolve_device``: ``"auto"`` (a CUDA GPU when torch sees one, else the CPU), ``"cpu"``, ``"cuda"`` (the current
  GPU) or ``"cuda:N"``; ``None`` takes the policy's (``RLVR_DEVICE``), else ``"auto"``.
- ``resolve_precision``: on the CPU, ``packed.base_precision`` (float32 by default, bfloat16 matmuls on oneDNN on
  request); on CUDA the base weights are *stored* in bfloat16 by default (``"float32"`` on request), while LoRA
  weights, AdamW state, logits and logprobs stay float32.
- ``resolve_numerics``: a policy resolved on this machine (device, precision, matmul kinds), what an engine reports.
- ``GpuPaths``: the trainer and sampler paths written for a GPU (packed sequences, chunked logprobs, a sampler whose
  state stays on the device) and their settings. The engine takes them on CUDA; a CPU engine takes them when given
  one (that is how the CPU tests check them). Without them, a CPU engine runs its own paths: the shared-prefix
  trainer (``prefix.py``) and the CPU decoder with its C kernels (``decode.py``).

The CPU kernels (``packed``, ``amx_linear``, ``fused_attention``, ``decode``) are imported only on the CPU paths, so
a CUDA engine never loads them.

Not here: moving models (``models.load_base_model``), the paths themselves (``packing.py``, ``device_sampler.py``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

from rlvr.errors import ConfigurationError
from rlvr.numerics import PRECISIONS, Numerics, active

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N (N: a GPU index)"
CUDA_DEFAULT_PRECISION = "bfloat16"


def resolve_device(device: str | torch.device | None = None, numerics: Numerics | None = None) -> torch.device:
    """The device ``device`` names (see the module docstring), checked against this machine; CUDA devices always
    carry their index (``cuda`` -> ``cuda:0`` on a one-GPU machine), so two names of one GPU compare equal. None: the
    policy's (``numerics``, default ``rlvr.numerics.active()``), else "auto"."""
    source = "device"
    if device is None:
        policy = numerics or active()
        device, source = policy.device or "auto", policy.source("device")
    text = str(device) if isinstance(device, torch.device) else device
    if not isinstance(text, str):
        raise ConfigurationError(f"{source}={device!r} is not a device name: choose {DEVICE_CHOICES}")
    if text == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise ConfigurationError(f"{source}={device!r} is not a device rlvr runs on: choose {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ConfigurationError(
            f"{source}={device!r}, but torch sees no CUDA GPU here (torch {torch.__version__}, {build}): use 'cpu' or "
            f"'auto' (which takes a GPU only when there is one), or run on a machine with an NVIDIA GPU and a CUDA "
            f"build of torch")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if match.group(1) is None else int(match.group(1))
    if index >= count:
        raise ConfigurationError(f"{source}={device!r}, but this machine has {count} CUDA GPU(s), cuda:0 to "
                                 f"cuda:{count - 1}: pick one of those")
    return torch.device("cuda", index)


def resolve_precision(precision: str | None, device: torch.device, paths: GpuPaths | None = None,
                      numerics: Numerics | None = None) -> str:
    """The base weights' precision on ``device``: ``precision``, else the policy's (``numerics``, default
    ``rlvr.numerics.active()``: ``RLVR_PRECISION``), else the device's default (CPU: float32, see
    ``packed.supported_precision``; CUDA: bfloat16). A CPU on the GPU ``paths`` runs float32 only (its bfloat16 is
    the CPU kernels')."""
    source = "precision"
    if not precision:
        policy = numerics or active()
        precision, source = policy.precision, policy.source("precision")
    chosen = precision
    if device.type == "cpu" and paths is None:
        from rlvr.engine.cpu.packed import supported_precision  # the CPU kernels load on the CPU paths only

        return supported_precision(chosen or "float32")
    if device.type == "cpu":
        if chosen not in (None, "float32"):
            raise ConfigurationError(f"{source}={chosen!r}, but GPU paths on the CPU run in float32 only: drop "
                                     "gpu_paths, or use precision='float32'")
        return "float32"
    chosen = chosen or CUDA_DEFAULT_PRECISION
    if chosen not in PRECISIONS:
        raise ConfigurationError(f"{source}={chosen!r}: choose one of {list(PRECISIONS)}")
    if chosen == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise ConfigurationError(f"precision bfloat16 on {device}: this GPU has no bfloat16 arithmetic (it needs "
                                 "compute capability 8.0, an A100 or later); use precision='float32'")
    return chosen


def resolve_numerics(numerics: Numerics, paths: GpuPaths | None = None) -> Numerics:
    """``numerics`` resolved on this machine (``Numerics.resolved``): the device (``resolve_device``), the precision
    there (``resolve_precision``) and the matmul kinds (``packed.policy_kinds`` on the CPU paths; "plain" on the GPU
    paths, whose products are the device library's). ``paths``: the GPU paths' settings where the engine takes them
    (on CUDA always). ConfigurationError where the machine cannot do what the policy asks, naming the setting."""
    device = resolve_device(None, numerics)
    if device.type == "cuda":
        paths = paths or GpuPaths()
    precision = resolve_precision(None, device, paths, numerics)
    if paths is None:
        from rlvr.engine.cpu.packed import policy_kinds  # the CPU kernels load on the CPU paths only

        sampler, trainer = policy_kinds(numerics, precision)
    else:
        sampler = trainer = "plain"
    return dataclasses.replace(numerics, precision=precision, device=str(device), sampler_kind=sampler,
                               trainer_kind=trainer)


def weight_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype base weights are stored in: bfloat16 on CUDA when ``precision`` is, else float32 (on the CPU the
    weights stay float32 and ``packed`` keeps bfloat16 copies for its matmuls)."""
    return torch.bfloat16 if device.type == "cuda" and precision == "bfloat16" else torch.float32


def attention_implementation(device: torch.device, dtype: torch.dtype) -> str:
    """The transformers attention a model runs: flash-attention 2 on CUDA in bfloat16 where ``flash_attn`` is
    installed (packed sequences then take its variable-length path), else PyTorch's SDPA (packed sequences under a
    block-diagonal causal mask)."""
    if device.type == "cuda" and dtype == torch.bfloat16:
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return "sdpa"
        return "flash_attention_2"
    return "sdpa"


@dataclass(frozen=True)
class GpuPaths:
    """The trainer and sampler paths written for a GPU, and their settings (``packing.py``, ``device_sampler.py``)."""

    row_tokens: int = 2048
    """Tokens per packed row: the trainer packs datums into rows of at most this many tokens (a longer datum has a
    row of its own); attention never crosses from one datum to another."""
    logit_chunk: int = 1024
    """Tokens whose output-layer logits exist at once in the trainer (a float32 chunk x vocabulary tensor), forward
    and backward; the whole batch's logits never do."""
    checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them: less memory for
    about a third more compute."""
    sync_every: int = 8
    """Sampler decode steps between two looks from the host: finished rows leave the batch and stop strings are
    matched there (stop token ids and lengths are checked on the device at every step)."""
    graphs: bool = True
    """Sampler decode steps over fixed buffers (the cache's reserved columns, a mask over all of them, the column
    written given as a tensor), so that every step runs the same kernels: on CUDA the step is captured once as a CUDA
    graph and replayed (again after finished rows leave the batch), which removes the host's per-kernel launch cost;
    on the CPU the same fixed step runs as it is (the tests check it there). False: each step is the model's eager
    forward over the columns written so far."""
    decode_step: str = "hf"
    """What runs the sampler's decode steps: "hf", the model's own forward (as ``graphs`` says); "triton", rlvr's
    decode step on Triton kernels (``gpu/decode.py``, captured as a CUDA graph as ``graphs`` says; not yet measured
    against "hf" on a GPU); "reference", that step on the kernels' plain-torch references (what the CPU tests run).
    A model the step does not support decodes through "hf", with a warning."""

    def __post_init__(self) -> None:
        for name in ("row_tokens", "logit_chunk", "sync_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"GpuPaths.{name} must be a positive integer, got {value!r}")
        if self.decode_step not in ("hf", "triton", "reference"):
            raise ConfigurationError(f"GpuPaths.decode_step={self.decode_step!r}: choose 'hf' (the model's forward), "
                                     "'triton' (rlvr's decode step on Triton kernels) or 'reference'")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device ``model``'s weights are on."""
    return next(model.parameters()).device
