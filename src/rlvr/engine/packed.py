"""Matmuls on prepacked weights: the fastest float32 kernel this machine has, for weights that do not train.

A base model's weights never change while rlvr trains LoRA adapters on it, so they can be reordered once into the
layout a BLAS kernel reads fastest. torch offers two such kernels on CPU: oneDNN's (``mkldnn._linear_pointwise``,
any row count) and MKL's (``mkl._mkl_linear``, one row count fixed at packing). Which wins depends on the machine:
on 2 cores of a Xeon MKL's pack ran ~1.3x a plain ``F.linear`` at 64 rows; on an EPYC MKL's pack ran slower than
``F.linear`` while oneDNN's ran 1.4-2x (2.7x on SmolLM2's output layer) at 64 rows and 1.5x at 2000. So the kernel
is chosen by timing, once per process (every model of a process then rounds the same way), among a plain
``F.linear``, MKL's pack and oneDNN's. ``RLVR_MATMUL=plain`` (or ``mkl``, ``mkldnn``, ``bf16x3``) in the
environment fixes the choice, e.g. for runs that must round alike across processes or machines.

Where the CPU has AMX (a Xeon since Sapphire Rapids), the sampler's decode steps take rlvr's own kernel instead,
without timing (``amx_linear``, kind "bf16x3"): each float32 product as three bfloat16 products on AMX tiles, ~16
bits of the product where float32 keeps ~22, at 1.1-1.4x MKL's packed float32 rate on SmolLM2's MLP weights streamed
from memory at 8-64 rows (2.7x on a weight in cache; 0.74x at 1 row). Measured on SmolLM2 with a rank-16 adapter
over three training steps, 64 sequences each: the sampler's logprobs differ from the trainer's by 1.6e-5 per token
on average (largest 2.2e-4), against 6.6e-6 (3.3e-5) with MKL's float32 products; bfloat16 gives 0.03. The trainer
stays on float32 kernels. A fixed choice (not timed) also makes every process of a machine round alike: timing picks
among kernels whose speeds are close on small weights, and so differed between a Ray replica and the driver.

oneDNN's was opt-in for a while: on the EPYC, 8-step ``bench/rl_step.py`` runs with it ended below the same seed's
runs without it on five of six seeds. Its products match ``F.linear``'s to rounding (tested), and sampling with it
draws from the same distribution: 2048 samples (128 problems x 16, temperature 1) under each kernel gave accuracy
0.182 / 0.184 with the base weights and 0.276 / 0.282 with an adapter trained 8 steps (standard error 0.01), mean
length 48.5 / 48.7 and 49.5 / 49.4 tokens. What rounding does change is which tail token an inverse-CDF draw picks
(a 1e-5 shift of the mass before it), so the two kernels' runs leave one seed's trajectory within a few tokens and
are different trajectories, not a biased and an unbiased one.

``precision="bfloat16"`` (``Engine(precision=...)`` or ``RLVR_PRECISION``; float32 is the default) packs the frozen
weights in bfloat16 instead, for oneDNN's bfloat16 kernel (AMX on a recent Xeon: ~2 TFLOP/s on 2 cores at 64 rows,
against ~0.35 for float32), in the trainer and the sampler alike; see ``rlvr.precision.base_precision`` for what it
costs. (oneDNN's float32 kernel with bfloat16 inputs but float32 results,
``torch.backends.mkldnn.matmul.fp32_precision="bf16"``, was measured too: half the bfloat16 kernel's rate, and the
sampler and trainer still differ by 0.009 per token.)

Two users: the sampler's decode steps (``decode.py`` packs its fused projections) and the trainer's forward and
backward (``pack_frozen_linears`` gives every frozen ``nn.Linear`` of a model a packed weight and its packed
transpose, so both the forward product and the input gradient run on oneDNN).

Not here: which weights are fused (``decode.py``), LoRA (``lora.py``).
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from rlvr.engine import amx_linear
from rlvr.errors import ConfigurationError
from rlvr.precision import base_precision

PACK_MAX_BYTES = 2**30  # pack only models whose float32 linear weights fit in this (each pack is one more copy)
_CHOSEN: dict[str, str] = {}  # what each use picked, timed once per process


def supported_precision(precision: str | None = None) -> str:
    """``rlvr.precision.base_precision``'s choice, refused where this machine cannot multiply in it (bfloat16 needs
    oneDNN's bfloat16 matmul): what an engine is created with."""
    chosen = base_precision(precision)
    if chosen == "bfloat16" and not bfloat16_supported():
        raise ConfigurationError("precision bfloat16 needs oneDNN's bfloat16 matmul, which this torch or CPU lacks; "
                                 "use float32")
    return chosen


def bfloat16_supported() -> bool:
    """Whether this torch and CPU have oneDNN's bfloat16 matmul, which ``precision="bfloat16"`` runs on."""
    return "mkldnn" in pack_kinds() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_kinds() -> list[str]:
    """The prepacked matmuls this machine offers: oneDNN's (any row count) and MKL's (one row count) where torch has
    them, and rlvr's AMX kernel (``amx_linear``: three bfloat16 products, any row count) where it can be built.
    Nothing is built or run here (torch work on a thread other than the engine's slows the engine's down)."""
    kinds = []
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        kinds.append("mkldnn")
    if torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"):
        kinds.append("mkl")
    if amx_linear.buildable():
        kinds.append("bf16x3")
    return kinds


def pack(weight: torch.Tensor, kind: str, rows: int) -> torch.Tensor:
    """``weight`` (out, in) reordered for ``kind``'s kernel; ``rows``: the batch size it is tuned (MKL: fixed) for."""
    if kind == "mkldnn":
        return torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    if kind == "bf16":
        return torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), rows)
    if kind == "bf16x3":
        return amx_linear.pack(weight)
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, kind: str, shape: torch.Tensor | None,
                  bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x`` on ``pack(weight, kind, rows)``. MKL needs ``x`` to have exactly
    ``rows`` rows and ``shape``, a storage-less tensor of the weight's shape (so does "bf16x3", for the output
    size)."""
    if kind == "mkldnn":
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if kind == "bf16":
        out = torch.ops.mkldnn._linear_pointwise(x.bfloat16(), packed, None, "none", [], "").float()
        return out if bias is None else out.add_(bias)
    if kind == "bf16x3":
        out = amx_linear.linear(amx_linear.kernel(), x, packed, shape.shape[0])
        return out if bias is None else out.add_(bias)
    return torch.ops.mkl._mkl_linear(x, packed, shape, bias, rows)


def fastest_kind(use: str, weight: torch.Tensor, rows: int, kinds: list[str] | None = None) -> str:
    """The kernel that multiplies ``rows`` rows by ``weight`` fastest here among ``kinds`` (default: all this
    machine has), or "" when a plain ``F.linear`` is as fast; the AMX kernel wherever it runs and ``kinds`` has it,
    without timing; ``RLVR_MATMUL`` overrides (a kind this machine has but ``use`` does not take means a plain
    ``F.linear`` there). Timed on the first call for ``use``, then the same answer for the rest of the process."""
    machine = pack_kinds()
    available = [k for k in (machine if kinds is None else kinds) if k in machine
                 and (k != "bf16x3" or amx_linear.kernel() is not None)]  # built and checked now, on first use
    forced = os.environ.get("RLVR_MATMUL", "")
    if forced:
        if forced != "plain" and forced not in machine:
            raise ConfigurationError(f"RLVR_MATMUL={forced!r}: choose plain or one of {machine} (what this "
                                     "machine has), or unset it to choose by timing")
        if forced == "bf16x3" and "bf16x3" not in available and (kinds is None or "bf16x3" in kinds):
            raise ConfigurationError("RLVR_MATMUL=bf16x3, but the AMX kernel failed to build or to pass its check "
                                     "here (the log says why); unset RLVR_MATMUL to choose another kernel")
        return forced if forced in available else ""
    if use not in _CHOSEN and "bf16x3" in available:  # not timed: see the module docstring
        _CHOSEN[use] = "bf16x3"
    if use not in _CHOSEN and not available:  # this torch has no packed matmul to compare with F.linear
        _CHOSEN[use] = ""
    if use not in _CHOSEN:
        x = torch.randn(rows, weight.shape[1])
        shape = torch.zeros(1, 1).expand(weight.shape)
        candidates = {"": lambda: F.linear(x, weight)}
        for kind in available:
            packed = pack(weight, kind, rows)
            candidates[kind] = lambda kind=kind, packed=packed: packed_linear(x, packed, kind, shape, None, rows)
        best = {}
        with torch.no_grad():
            for kind, run in candidates.items():
                run()
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - start)
                best[kind] = min(times)
        _CHOSEN[use] = min(best, key=best.get)
    return _CHOSEN[use]


def chosen_kind(use: str) -> str | None:
    """What ``fastest_kind`` chose for ``use`` in this process ("" for a plain ``F.linear``), None before it has or
    where ``RLVR_MATMUL`` chose."""
    return _CHOSEN.get(use)


class _FrozenLinear(torch.autograd.Function):
    """x @ W.T + b on packed W, with the input gradient g @ W on packed W.T (W does not train); ``kind``: mkldnn
    (float32) or bf16."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, packed: torch.Tensor, packed_t: torch.Tensor, bias: torch.Tensor | None,
                kind: str) -> torch.Tensor:
        ctx.packed_t, ctx.kind = packed_t, kind
        rows = x.reshape(-1, x.shape[-1])
        return packed_linear(rows, packed, kind, None, bias, 0).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rows = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = packed_linear(rows, ctx.packed_t, ctx.kind, None, None, 0)
        return grad_x.view(*grad.shape[:-1], -1), None, None, None, None


def _frozen_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if module.weight.requires_grad or x.dtype != torch.float32:  # it trains after all, or another dtype: plain
        return F.linear(x, module.weight, module.bias)
    return _FrozenLinear.apply(x.contiguous(), module.packed_weight, module.packed_weight_t, module.bias,
                               module.packed_kind)


TRAIN_ROWS = 512  # the token count the trainer's kernel choice is timed at


def model_kind(model: torch.nn.Module) -> str:
    """The packed kernel ``pack_frozen_linears`` gave ``model``'s frozen linears: "mkldnn", "bf16", or "" (none)."""
    return getattr(model, "packed_kind", "")


def pack_frozen_linears(model: torch.nn.Module, precision: str = "float32") -> int:
    """Run every frozen float32 ``nn.Linear`` of ``model`` on packed weights (forward and input gradient): in
    bfloat16 when ``precision`` is (see ``base_precision``), else on oneDNN's float32 pack when that is faster here than
    ``F.linear`` (or ``RLVR_MATMUL=mkldnn`` asks for it); returns how many were packed. The packs are two more
    copies of the weights, so float32 models over ``PACK_MAX_BYTES`` are left alone."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad
               and m.weight.dtype == torch.float32]
    size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    bf16 = base_precision(precision) == "bfloat16"  # asked for: packed whatever the size (its packs are half-size)
    if not linears or (size > PACK_MAX_BYTES and not bf16):
        return 0
    if bf16:
        kind = "bf16"
    else:
        typical = sorted(linears, key=lambda m: m.weight.numel())[len(linears) // 2]
        kind = fastest_kind("train", typical.weight.detach(), TRAIN_ROWS, kinds=["mkldnn"])
        if kind != "mkldnn":
            return 0
    for module in linears:
        weight = module.weight.detach()
        module.packed_weight = pack(weight, kind, TRAIN_ROWS)
        module.packed_weight_t = pack(weight.t().contiguous(), kind, TRAIN_ROWS)
        module.packed_kind = kind
        module.forward = _frozen_forward.__get__(module)
    model.packed_kind = kind
    return len(linears)
