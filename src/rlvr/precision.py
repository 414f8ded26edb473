"""What a base model's frozen matmuls multiply in: the choices (``PRECISIONS``) and how one is picked
(``base_precision``). Torch-free, so the RL layer (its config, the loop) and the engine share this one definition.

Not here: the kernels (``rlvr.engine.cpu.packed``), nor whether this machine can multiply in bfloat16: the engine checks
that when it is created (``rlvr.engine.cpu.packed.supported_precision``).
"""

from __future__ import annotations

import os

from rlvr.errors import ConfigurationError

__all__ = ["AUTO_BFLOAT16_PARAMS", "PRECISIONS", "base_precision", "run_default_precision"]

PRECISIONS = ("float32", "bfloat16")
AUTO_BFLOAT16_PARAMS = 300_000_000
"""Linear-layer weights from which a training run picks bfloat16 on a CPU that multiplies it in hardware, when no
precision is set (``run_default_precision``): Qwen2.5-0.5B has 494M, SmolLM2-135M 135M."""


def run_default_precision(linear_params: int | None, native_bfloat16: bool) -> str:
    """The precision a training run takes when neither ``precision`` nor ``RLVR_PRECISION`` sets one: bfloat16 for a
    model of at least ``AUTO_BFLOAT16_PARAMS`` linear weights on a CPU that multiplies bfloat16 in hardware (AMX or
    AVX512-BF16), float32 otherwise (a small model, an unknown size, a CPU without it). Measured in
    docs/benchmarks.md ("Which precision a run takes"): on such a CPU bfloat16 samples the real shapes 1.6-2x faster
    than float32, and runs of SmolLM2 learned the same in either."""
    if native_bfloat16 and linear_params is not None and linear_params >= AUTO_BFLOAT16_PARAMS:
        return "bfloat16"
    return "float32"


def base_precision(precision: str | None = None) -> str:
    """What frozen base weights are multiplied in: ``precision`` if given, else ``RLVR_PRECISION``, else float32.

    - ``"float32"``: float32 throughout, except the sampler's decode products on a CPU with AMX (three bfloat16
      products each, ~16 bits: see ``rlvr.engine.cpu.packed``); the sampler's logprobs equal the trainer's to ~1e-5 per
      token (6.6e-6 with float32 products, 1.6e-5 with AMX's, on SmolLM2; tested within 1e-3).
    - ``"bfloat16"``: every frozen base matmul (trainer and sampler alike) takes bfloat16 inputs and weights on
      oneDNN (AMX where the CPU has it: ~6x float32's rate on a Xeon) and rounds its result to bfloat16; the residual
      stream, norms, attention, LoRA and logits stay float32. Faster, and the sampler and the trainer then agree only
      to bfloat16 rounding (tiny differences in the order of sums flip roundings, which grow through the layers):
      mean |sampler - trainer| logprob ~0.03 per token on SmolLM2, as with vLLM in bfloat16 beside a trainer.
    """
    chosen = precision or os.environ.get("RLVR_PRECISION") or "float32"
    if chosen not in PRECISIONS:
        source = "precision" if precision else "RLVR_PRECISION"
        raise ConfigurationError(f"{source}={chosen!r}: choose one of {list(PRECISIONS)}")
    return chosen
