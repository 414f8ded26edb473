"""Matmuls on prepacked weights, for base-model weights that do not train.

A base model's weights never change while rlvr trains LoRA adapters on it, so they can be reordered once into the
layout a kernel reads fastest. The kernels ("kinds") this module packs for and calls:

- ``mkldnn``: oneDNN's float32 kernel (``mkldnn._linear_pointwise``), any row count;
- ``mkl``: MKL's float32 kernel (``mkl._mkl_linear``), one row count, fixed at packing;
- ``bf16x3``: rlvr's AMX kernel (``amx_linear``), each float32 product as three bfloat16 products (where there is AMX);
- ``fma``: rlvr's float32 kernel for a few dozen rows (``fma_linear``), AVX2 and FMA, any row count;
- ``bf16``: oneDNN's bfloat16 kernel, only when ``precision="bfloat16"`` is asked for;
- ``bf16x1``: rlvr's AMX kernel as one bfloat16 product summed in float32, with bfloat16 and ``matmul=bf16x1``.

Invariants: the kind a use gets (``fastest_kind``) is a fixed preference, not a timing, so every process of a machine
(two runs of one seed, a resume, a Ray replica and the driver) rounds alike; the numerics policy's ``matmul``
(``rlvr.numerics``: the ``matmul`` key or ``RLVR_MATMUL``) fixes it or asks for ``timed``, and each kind gives a seed
its own trajectory (``policy_kinds`` names the pair a policy gives, which a run records). Two users: the sampler's
decode steps (``decode.py`` packs its fused projections) and the trainer (``pack_frozen_linears``: a packed weight and
its packed transpose for every frozen ``nn.Linear``; never MKL's, the FMA or the AMX kernel's float32 form). In bfloat16
both users multiply on one kernel (``bfloat16_kind``), so they compute a token's logprob alike. A model is packed only
where its copies fit in ``PACK_MEMORY_FRACTION`` of the machine's memory (``packs_fit``), the same answer in every
process of a machine.

Precision (``rlvr.numerics.base_precision``; ``supported_precision`` checks this CPU): float32 by default;
``precision="bfloat16"`` runs every frozen base matmul on ``bfloat16_kind``'s kernel, and the sampler and the trainer
then agree only to bfloat16 rounding. What each kind measured: ``docs/performance.md`` ("Prepacked matmuls"). Not
here: which weights are fused (``decode.py``), LoRA (``lora.py``), the AMX kernel itself (``amx_linear.py``).
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from rlvr.engine.cpu import amx_linear, fma_linear
from rlvr.errors import ConfigurationError
from rlvr.numerics import Numerics, active, base_precision

PACK_MEMORY_FRACTION = 0.25  # of the machine's memory, for the packs of one use (sampler or trainer) of one model
_CHOSEN: dict[str, str] = {}  # what each use picked, timed once per process


def machine_memory() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def packs_fit(nbytes: int) -> bool:
    """Whether packs of ``nbytes`` (more copies of frozen weights) fit in ``PACK_MEMORY_FRACTION`` of this machine's
    memory (at least 1 GiB, what a machine that does not say its memory gets)."""
    return nbytes <= max(2**30, PACK_MEMORY_FRACTION * machine_memory())


def supported_precision(precision: str | None = None) -> str:
    """``rlvr.numerics.base_precision``'s choice, refused where this machine cannot multiply in it (bfloat16 needs
    oneDNN's bfloat16 matmul): what an engine is created with."""
    chosen = base_precision(precision)
    if chosen == "bfloat16" and not bfloat16_supported():
        raise ConfigurationError("precision bfloat16 needs oneDNN's bfloat16 matmul, which this torch or CPU lacks; "
                                 "use float32")
    return chosen


def bfloat16_supported() -> bool:
    """Whether this torch and CPU have oneDNN's bfloat16 matmul, which ``precision="bfloat16"`` runs on."""
    return "mkldnn" in pack_kinds() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX-BF16 or AVX512-BF16) and oneDNN's bfloat16 matmul runs
    here: where ``precision="bfloat16"`` is several times float32's rate, not an emulation of it."""
    from rlvr.engine.cpu import native

    return bool({"amx_bf16", "avx512_bf16"} & native.cpu()[1]) and bfloat16_supported()


BFLOAT16_KINDS = ("bf16", "bf16x1")  # the kinds of a bfloat16 model's frozen products
AMX_KINDS = ("bf16x3", "bf16x1")  # the kinds multiplied by rlvr's AMX kernel (``amx_linear``)


def bfloat16_kind(numerics: Numerics | None = None) -> str:
    """The kernel a bfloat16 model's frozen products take, in the trainer's forward and the sampler alike: oneDNN's
    bfloat16 kernel ("bf16"), or where the policy (``numerics``, default ``rlvr.numerics.active()``) asks for
    ``matmul=bf16x1`` the AMX kernel's one-product form ("bf16x1": the sampler's logprobs ~3x nearer the trainer's
    and its decode ~1.25x faster, the trainer's forward slower and the heap's peak larger; docs/performance.md). The
    same answer in every process of a machine, so they round alike."""
    policy = numerics or active()
    if policy.matmul != "bf16x1":
        return "bf16"
    if "bf16x3" not in pack_kinds() or amx_linear.kernel() is None:
        source = policy.source("matmul")
        raise ConfigurationError(f"{source}=bf16x1 needs rlvr's AMX kernel, which this machine lacks or which failed "
                                 f"to build or to pass its check (the log says why); unset {source}")
    return "bf16x1"


def pack_kinds() -> list[str]:
    """The prepacked matmuls this machine offers: oneDNN's (any row count) and MKL's (one row count) where torch has
    them, rlvr's FMA kernel (``fma_linear``: float32, any row count) and its AMX kernel (``amx_linear``: three
    bfloat16 products, any row count) where they can be built.
    Nothing is built or run here (torch work on a thread other than the engine's slows the engine's down)."""
    kinds = []
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        kinds.append("mkldnn")
    if torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"):
        kinds.append("mkl")
    if fma_linear.buildable():
        kinds.append("fma")
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
    if kind == "bf16x1":
        return amx_linear.pack(weight, products=1)
    if kind == "fma":
        return fma_linear.pack(weight)
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, kind: str, shape: torch.Tensor | None,
                  bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x`` on ``pack(weight, kind, rows)``. MKL needs ``x`` to have exactly
    ``rows`` rows and ``shape``, a storage-less tensor of the weight's shape (so do "bf16x3" and "fma", for the
    output size)."""
    if kind == "mkldnn":
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if kind == "bf16":
        out = torch.ops.mkldnn._linear_pointwise(x.bfloat16(), packed, None, "none", [], "").float()
        return out if bias is None else out.add_(bias)
    if kind in AMX_KINDS:
        out = amx_linear.linear(amx_linear.kernel(), x, packed, shape.shape[0])
        return out if bias is None else out.add_(bias)
    if kind == "fma":
        return fma_linear.linear(fma_linear.kernel(), x, packed, shape.shape[0], bias)
    return torch.ops.mkl._mkl_linear(x, packed, shape, bias, rows)


def fastest_kind(use: str, weight: torch.Tensor, rows: int, kinds: list[str] | None = None,
                 numerics: Numerics | None = None) -> str:
    """The kernel ``use`` multiplies ``rows`` rows by ``weight`` with, among ``kinds`` (default: all this machine
    has), "" for a plain ``F.linear``: the fixed preference of the module docstring (the AMX kernel, else the FMA
    kernel, else oneDNN's, else plain); the policy's ``matmul`` (``numerics``, default ``rlvr.numerics.active()``)
    overrides (a kind this machine has but ``use`` does not take means a plain ``F.linear`` there; ``timed``: the
    fastest, timed on the first call for ``use``, the AMX kernel where it runs). The same answer for the rest of the
    process."""
    machine = pack_kinds()
    available = [k for k in (machine if kinds is None else kinds) if k in machine
                 and (k != "bf16x3" or amx_linear.kernel() is not None)  # built and checked now, on first use
                 and (k != "fma" or fma_linear.kernel() is not None)]
    policy = numerics or active()
    asked, source = policy.matmul or "", policy.source("matmul")
    forced = "bf16x3" if asked == "bf16x1" else asked  # float32 products on the AMX kernel; bfloat16_kind: the rest
    if forced and forced != "timed":
        if forced != "plain" and forced not in machine:
            raise ConfigurationError(f"{source}={asked!r}: choose plain or one of {machine} (what this "
                                     "machine has), or timed, or unset it for the fixed preference")
        if forced == "bf16x3" and "bf16x3" not in available and (kinds is None or "bf16x3" in kinds):
            raise ConfigurationError(f"{source}={asked}, but the AMX kernel failed to build or to pass its check "
                                     f"here (the log says why); unset {source} to choose another kernel")
        if forced == "fma" and "fma" not in available and (kinds is None or "fma" in kinds):
            raise ConfigurationError(f"{source}=fma, but the FMA kernel failed to build or to pass its check here "
                                     f"(the log says why); unset {source} to choose another kernel")
        return forced if forced in available else ""
    if use not in _CHOSEN and "bf16x3" in available:  # not timed: see the module docstring
        _CHOSEN[use] = "bf16x3"
    if use not in _CHOSEN and "fma" in available and forced != "timed":  # the fixed preference (timed: a candidate)
        _CHOSEN[use] = "fma"
    if use not in _CHOSEN and not available:  # this torch has no packed matmul to compare with F.linear
        _CHOSEN[use] = ""
    if use not in _CHOSEN and forced != "timed":  # the fixed preference: see the module docstring
        _CHOSEN[use] = "mkldnn" if "mkldnn" in available else ""
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
    where the policy's ``matmul`` chose."""
    return _CHOSEN.get(use)


def policy_kinds(numerics: Numerics, precision: str) -> tuple[str, str]:
    """The kernels ``numerics`` gives a model whose packs fit (``packs_fit``) in ``precision``: (the sampler's decode
    products, the trainer's forward products), each a kind or "plain" (a plain ``F.linear``), or "timed" for both
    where the policy times them (which kernel wins then varies with the process). Asks ``fastest_kind`` and
    ``bfloat16_kind`` themselves, so the names are the ones the engine runs; builds and checks the kernels the
    preference needs (once per process). ConfigurationError where the policy asks for a kernel this machine lacks."""
    if precision == "bfloat16":
        kind = bfloat16_kind(numerics)
        return kind, kind
    if numerics.matmul == "timed":
        return "timed", "timed"
    probe = torch.empty(1, 1)  # not read: only "timed" times on the weight
    sampler = fastest_kind("decode", probe, 1, numerics=numerics)
    trainer = fastest_kind("train", probe, TRAIN_ROWS, kinds=["mkldnn"], numerics=numerics)
    return sampler or "plain", trainer or "plain"


class _FrozenLinear(torch.autograd.Function):
    """x @ W.T + b on packed W, with the input gradient g @ W on packed W.T (W does not train); ``kind`` and
    ``kind_t``, the packs' kinds: mkldnn (float32), or bf16x1 or bf16 then bf16 (bfloat16)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, packed: torch.Tensor, packed_t: torch.Tensor, bias: torch.Tensor | None,
                kind: str, kind_t: str, shape: torch.Tensor) -> torch.Tensor:
        ctx.packed_t, ctx.kind_t = packed_t, kind_t
        rows = x.reshape(-1, x.shape[-1])
        return packed_linear(rows, packed, kind, shape, bias, 0).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rows = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = packed_linear(rows, ctx.packed_t, ctx.kind_t, None, None, 0)
        return grad_x.view(*grad.shape[:-1], -1), None, None, None, None, None, None


def _frozen_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if module.weight.requires_grad or x.dtype != torch.float32:  # it trains after all, or another dtype: plain
        return F.linear(x, module.weight, module.bias)
    return _FrozenLinear.apply(x.contiguous(), module.packed_weight, module.packed_weight_t, module.bias,
                               module.packed_kind, module.packed_kind_t, module.packed_shape)


def bfloat16_head(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a frozen ``nn.Linear`` that ``pack_frozen_linears`` runs in bfloat16."""
    return (isinstance(module, torch.nn.Linear) and getattr(module, "packed_kind", "") in BFLOAT16_KINDS
            and not module.weight.requires_grad)


def transposed_product(module: torch.nn.Linear, g: torch.Tensor) -> torch.Tensor:
    """``g @ module.weight`` for 2-D float32 ``g``: on the module's packed transpose where ``pack_frozen_linears``
    packed it (the product its input gradient takes: bfloat16 for ``bfloat16_head``), else a plain product."""
    kind = getattr(module, "packed_kind_t", "")
    if kind and not module.weight.requires_grad:
        return packed_linear(g.contiguous(), module.packed_weight_t, kind, None, None, 0)
    return g @ module.weight


TRAIN_ROWS = 512  # the token count the trainer's kernel choice is timed at


def model_kind(model: torch.nn.Module) -> str:
    """The packed kernel ``pack_frozen_linears`` gave ``model``'s frozen linears' forward products: "mkldnn",
    "bf16x1" or "bf16" (bfloat16, ``bfloat16_kind``), or "" (none)."""
    return getattr(model, "packed_kind", "")


def pack_frozen_linears(model: torch.nn.Module, precision: str = "float32") -> int:
    """Run every frozen float32 ``nn.Linear`` of ``model`` on packed weights (forward and input gradient): in
    bfloat16 when ``precision`` is (see ``base_precision``), else on oneDNN's float32 pack when that is faster here than
    ``F.linear`` (or ``matmul=mkldnn`` asks for it); returns how many were packed. The packs are two more
    copies of the weights, so float32 models whose copies do not fit (``packs_fit``) are left alone."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad
               and m.weight.dtype == torch.float32]
    size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    bf16 = base_precision(precision) == "bfloat16"  # asked for: packed whatever the size (its packs are half-size)
    if not linears or (not packs_fit(2 * size) and not bf16):
        return 0
    if bf16:
        kind = bfloat16_kind()
    else:
        typical = sorted(linears, key=lambda m: m.weight.numel())[len(linears) // 2]
        kind = fastest_kind("train", typical.weight.detach(), TRAIN_ROWS, kinds=["mkldnn"])
        if kind != "mkldnn":
            return 0
    for module in linears:
        weight = module.weight.detach()
        module.packed_kind, module.packed_kind_t = kind, "bf16" if bf16 else kind
        module.packed_weight = pack(weight, kind, TRAIN_ROWS)
        module.packed_weight_t = pack(weight.t().contiguous(), module.packed_kind_t, TRAIN_ROWS)
        module.packed_shape = torch.zeros(1, 1).expand(weight.shape)  # no storage: the output size, for the AMX kernel
        module.forward = _frozen_forward.__get__(module)
    model.packed_kind = kind
    return len(linears)
