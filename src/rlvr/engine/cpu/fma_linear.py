"""Float32 products for a few dozen rows on AVX2 and FMA (``fma_linear.c``), for the sampler's decode steps.

A decode step multiplies 1 to 64 rows by every weight matrix of the model. General matrix products are built for
many rows: at 8 rows oneDNN's float32 kernel reached about half of this machine's multiply rate on the weights of
a 0.5B model, and read from memory, the weights were not streamed at the memory's rate either. This kernel reads
each weight once per call whatever the row count, prefetches the next block of weights while one computes, and
keeps 8 to 12 sums in flight at any row count. Each output is one fused multiply-add chain over the inputs in
order, so a row's products are the same bit for bit whatever else is in the batch, and they are float32 products
(within float32 rounding of exact ones): the sampler's logprobs stay equal to the trainer's to ~1e-5.

``packed.py`` offers it as the matmul kind "fma" where it runs here (x86-64 Linux, AVX2 and FMA, a C compiler);
the decoder takes it where the AMX kernel does not run. A freshly built library is checked against float64
products before any use.

Not here: choosing the kind (``packed.py``), the decode step (``decode.py``), building C (``native.py``).
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch
import torch.nn.functional as F

from rlvr.engine.cpu import native

SOURCE = "fma_linear.c"
COLUMNS = 16  # output columns per packed block
NEEDS = ("avx2", "fma")

logger = logging.getLogger(__name__)


def _compiler() -> str:
    return native.compiler("AVX2 with FMA", set(NEEDS) <= native.cpu()[1])


def buildable() -> bool:
    """Whether this machine has what the kernel needs (x86-64 Linux, AVX2 and FMA, a C compiler): where it does, a
    kernel that fails to build or to agree with float64 products is a defect."""
    try:
        _compiler()
    except RuntimeError:
        return False
    return True


def bind():
    """The kernel's C function, built for this machine and typed; RuntimeError naming what failed."""
    function = ctypes.CDLL(str(native.build(SOURCE, _compiler()))).rlvr_fma_linear
    function.restype = None
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    function.argtypes = [pointer, i64, i32, i32, pointer, i32, pointer, pointer, i64]
    return function


@functools.cache
def kernel():
    """The loaded and checked kernel, or None where it cannot run here (the reason is logged once)."""
    return native.checked(bind, self_check, logger, "the float32 FMA product kernel")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) float32 in the kernel's layout: (blocks, in, 16), per block of 16 output columns its
    inputs in order, the block's 16 columns side by side for each, zero past the last column."""
    out, inputs = weight.shape
    blocks = -(-out // COLUMNS)
    padded = F.pad(weight.detach().float(), (0, 0, 0, blocks * COLUMNS - out))
    return padded.view(blocks, COLUMNS, inputs).transpose(1, 2).contiguous()


def linear(function, x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` (R, ``out_features``) for ``packed = pack(W)`` and ``x`` (R, in), float32 rows of unit
    stride; ``out``, when given, receives the result."""
    rows, inputs = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"x: rows of unit stride in float32 expected, got {x.dtype} with strides {x.stride()}")
    if (packed.dtype != torch.float32 or not packed.is_contiguous() or packed.dim() != 3
            or packed.shape[2] != COLUMNS or packed.data_ptr() % 32):
        raise ValueError(f"packed: a contiguous float32 tensor from fma_linear.pack expected, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    if packed.shape[1] != inputs or not (packed.shape[0] - 1) * COLUMNS < out_features <= packed.shape[0] * COLUMNS:
        raise ValueError(f"x (R, {inputs}) against a pack of {packed.shape[0] * COLUMNS} x {packed.shape[1]} for "
                         f"{out_features} outputs: the shapes disagree")
    if bias is not None and (bias.shape != (out_features,) or bias.dtype != torch.float32
                             or not bias.is_contiguous()):
        raise ValueError(f"bias: a contiguous float32 ({out_features},) tensor expected, got {tuple(bias.shape)}")
    if out is None:
        out = torch.empty(rows, out_features)
    elif out.shape != (rows, out_features) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError(f"out: float32 ({rows}, {out_features}) rows of unit stride expected")
    if rows:
        function(x.data_ptr(), x.stride(0), rows, inputs, packed.data_ptr(), out_features,
                 0 if bias is None else bias.data_ptr(), out.data_ptr(), out.stride(0))
    return out


def self_check(function) -> None:
    """Run the kernel on small random cases (rows and columns not filling its tiles and blocks, with and without a
    bias) and compare with float64 products: a library that disagrees is not used."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(13, 72, generator=generator)
    weight = torch.randn(40, 72, generator=generator)
    bias = torch.randn(40, generator=generator)
    exact = x.double() @ weight.double().T
    scale = x.double().abs() @ weight.double().abs().T
    packed = pack(weight)
    for rows in (1, 2, 5, 13):
        for b in (None, bias):
            got = linear(function, x[:rows], packed, 40, b, out=torch.full((rows, 40), float("nan")))
            want = exact[:rows] + (0 if b is None else b.double())
            error = ((got.double() - want).abs() / (scale[:rows] + 1)).max().item()
            if not error <= 1e-5:
                raise RuntimeError(f"the built FMA product kernel disagrees with float64 products on {rows} rows "
                                   f"(by {error:.3g})")
