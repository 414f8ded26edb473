"""Float32 products on AMX (``amx_linear.c``), for the sampler's decode steps on CPUs that have it; and, with
``RLVR_MATMUL=bf16x1``, bfloat16 ones for a bfloat16 model's trainer forward and sampler.

At 64 rows a decode step is its products: 2 x 135M multiply-adds per row for SmolLM2, which float32 on 2 Xeon cores
(MKL, AVX-512) does at ~290 GFLOP/s on weights streamed from memory. A recent Xeon also has AMX, whose tiles
multiply bfloat16 at several times that rate. Bfloat16 alone keeps 8 of float32's 24 bits: the sampler would then
agree with a float32 trainer only to ~0.03 per token. Split into high and low bfloat16 parts, a = ah + al and
W = Wh + Wl, three products ah Wh + ah Wl + al Wh accumulated in float32 keep ~16 bits: products within ~2e-7 of
exact ones relative to the sum of |terms| (float32's own are within ~1.5e-8), at 1.4x MKL's packed float32 rate
on SmolLM2's MLP weights streamed from memory at 64 rows (2.7x on a weight in cache). The weights are packed once
(high and low parts: the size of the float32 weights).

The kernel also computes its input: the RMSNorm before attention and MLP, and the MLP's SiLU(gate) * up, in the
pass that splits the input into bfloat16, so these cost no PyTorch op; it writes that input out when LoRA adapters
need it.

``packed.py`` offers it as the matmul kind "bf16x3" where it runs here (x86-64 Linux, AMX-BF16 and AVX512-BF16, a
C compiler, and Linux granting the process AMX's tile state), and the decoder takes it wherever it runs. With packs
of the weights' bfloat16 rounding alone (``pack(weight, products=1)``, kind "bf16x1") it is one bfloat16 product with
float32 sums: what a bfloat16 model's frozen products run on with ``RLVR_MATMUL=bf16x1``, in the trainer's forward
and the sampler alike. A
freshly built library is checked against products by hand before any use.

Not here: choosing the kind (``packed.py``), the decode step (``decode.py``), building C (``native.py``).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging

import torch
import torch.nn.functional as F

from rlvr.engine.cpu import native

SOURCE = "amx_linear.c"
COLUMNS = 16  # output columns per block (blocks come in pairs)
STEP = 32  # inputs per step
NEEDS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux: ask for AMX's tile state

logger = logging.getLogger(__name__)


def _compiler() -> str:
    return native.compiler("AMX-BF16 with AVX512-BF16", set(NEEDS) <= native.cpu()[1])


@functools.cache
def _granted() -> bool:
    """Whether Linux grants this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM; Linux 5.16 and later):
    asked once, for the whole process, before the kernel's first use. A CPU's flags may show AMX where the kernel
    or a sandbox does not allow it."""
    try:
        return ctypes.CDLL(None).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def buildable() -> bool:
    """Whether this machine has what the kernel needs (x86-64 Linux, AMX-BF16, AVX512-BF16, a C compiler, and Linux
    granting AMX): where it does, a kernel that fails to build or to agree with products by hand is a defect."""
    try:
        _compiler()
    except RuntimeError:
        return False
    return _granted()


def bind():
    """The kernel's C function, built for this machine and typed, with AMX granted to this process; RuntimeError
    naming what failed."""
    if not _granted():
        raise RuntimeError("Linux refused this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    function = ctypes.CDLL(str(native.build(SOURCE, _compiler()))).rlvr_amx_linear
    function.restype = ctypes.c_int
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    function.argtypes = [pointer, i64, i32, i32, pointer, ctypes.c_float, i32, pointer, i64, pointer, i32, pointer,
                         i64, i32]
    return function


@functools.cache
def kernel():
    """The loaded and checked kernel, or None where it cannot run here (the reason is logged once)."""
    return native.checked(bind, self_check, logger, "float32 products on AMX")


def split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` (float32) as high and low bfloat16 parts, ``t ~ high + low``."""
    high = t.bfloat16()
    return high, (t - high.float()).bfloat16()


def pack(weight: torch.Tensor, products: int = 3) -> torch.Tensor:
    """``weight`` (out, in) float32 in the kernel's layout: int16 (pairs * 2, steps, 2, 16, 16, 2), per block of 16
    output columns and step of 32 inputs a tile of the high part then one of the low, each 16 input pairs x 16
    columns x 2, zero-padded to whole pairs of blocks and whole steps. With ``products`` 1, the high part alone
    (pairs * 2, steps, 1, 16, 16, 2): the kernel then multiplies in plain bfloat16."""
    out, inputs = weight.shape
    blocks = -(-out // (2 * COLUMNS)) * 2
    steps = -(-inputs // STEP)
    padded = F.pad(weight.float(), (0, steps * STEP - inputs, 0, blocks * COLUMNS - out))

    def tiles(part: torch.Tensor) -> torch.Tensor:  # (block, column, step, pair, 2) -> (block, step, pair, column, 2)
        return part.view(blocks, COLUMNS, steps, STEP // 2, 2).permute(0, 2, 3, 1, 4)

    if products == 1:
        return tiles(padded.bfloat16()).unsqueeze(2).contiguous().view(torch.int16)
    high, low = split(padded)
    return torch.stack([tiles(high), tiles(low)], dim=2).contiguous().view(torch.int16)


def linear(function, x: torch.Tensor, packed: torch.Tensor, out_features: int, norm: torch.Tensor | None = None,
           eps: float = 0.0, gated: bool = False, inputs: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ W.T`` (R, ``out_features``) for ``packed = pack(W)``, where the input a (R, in) is ``x`` (rows of unit
    stride, float32), or ``F.rms_norm(x, weight=norm, eps=eps)``, or with ``gated`` ``F.silu(g) * u`` for
    ``x = [g | u]`` (R, 2 in). ``inputs`` (R, in), when given, receives a; ``out``, when given, the result."""
    rows, columns = x.shape
    blocks, steps = packed.shape[0], packed.shape[1]
    width = columns // 2 if gated else columns
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"x: rows of unit stride in float32 expected, got {x.dtype} with strides {x.stride()}")
    if packed.dtype != torch.int16 or not packed.is_contiguous() or packed.shape[2:] not in ((2, 16, 16, 2),
                                                                                              (1, 16, 16, 2)):
        raise ValueError(f"packed: a contiguous int16 tensor from amx_linear.pack expected, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    if not (blocks * COLUMNS - 2 * COLUMNS < out_features <= blocks * COLUMNS and
            steps * STEP - STEP < width <= steps * STEP) or (gated and columns % 2):
        raise ValueError(f"x (R, {columns}){' gated' if gated else ''} against a pack of {blocks * COLUMNS} x "
                         f"{steps * STEP} for {out_features} outputs: the shapes disagree")
    if gated and norm is not None:
        raise ValueError("norm and gated: one input transform at a time")
    if norm is not None and (norm.shape != (width,) or norm.dtype != torch.float32 or not norm.is_contiguous()):
        raise ValueError(f"norm: a contiguous float32 ({width},) weight expected, got {tuple(norm.shape)}")
    if inputs is not None and (inputs.shape != (rows, width) or inputs.dtype != torch.float32 or
                               inputs.stride(1) != 1):
        raise ValueError(f"inputs: float32 ({rows}, {width}) rows of unit stride expected")
    if out is None:
        out = torch.empty(rows, out_features)
    elif out.shape != (rows, out_features) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out: float32 ({rows}, {out_features}) rows of unit stride expected")
    if rows == 0:
        return out
    failed = function(x.data_ptr(), x.stride(0), rows, width, 0 if norm is None else norm.data_ptr(), eps, int(gated),
                      0 if inputs is None else inputs.data_ptr(), 0 if inputs is None else inputs.stride(0),
                      packed.data_ptr(), out_features, out.data_ptr(), out.stride(0), 3 if packed.shape[2] == 2 else 1)
    if failed:
        raise MemoryError(f"the AMX product kernel could not allocate its scratch for {rows} x {width} inputs")
    return out


def reference(x: torch.Tensor, weight: torch.Tensor, products: int = 3) -> torch.Tensor:
    """What the kernel computes for input ``x`` (R, in) and ``weight`` (out, in), in float64: the three products of
    the bfloat16 parts (``products`` 1: the high parts' alone), exactly (the kernel's float32 sums round them)."""
    xh, xl = (p.double() for p in split(x))
    wh, wl = (p.double() for p in split(weight))
    return xh @ wh.T if products == 1 else xh @ wh.T + xh @ wl.T + xl @ wh.T


def self_check(function) -> None:
    """Run the kernel on small random cases (plain, RMSNorm and gated inputs, rows and columns not filling its
    tiles) and compare with ``reference``: a library that disagrees is not used."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(37, 2 * 72, generator=generator)
    weight = torch.randn(40, 72, generator=generator)
    norm = torch.rand(72, generator=generator) + 0.5
    cases = {"plain": (x[:, :72], {}), "norm": (F.rms_norm(x[:, :72], (72,), norm, 1e-5), {"norm": norm, "eps": 1e-5}),
             "gated": (F.silu(x[:, :72]) * x[:, 72:], {"gated": True})}
    for (name, (a, options)), products in itertools.product(cases.items(), (3, 1)):
        source = x if options.get("gated") else x[:, :72]
        inputs = torch.full((37, 72), float("nan"))  # not empty: freed memory may hold a right answer
        out = linear(function, source, pack(weight, products), 40, inputs=inputs,
                     out=torch.full((37, 40), float("nan")), **options)
        error = (out.double() - reference(a, weight, products)).abs().max().item()
        input_error = (inputs - a).abs().max().item()
        if not (error <= 1e-4 and input_error <= 1e-5):
            raise RuntimeError(f"the built AMX kernel disagrees with products by hand on a {name} case (by {error:.3g},"
                               f" its inputs by {input_error:.3g})")
