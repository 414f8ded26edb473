"""Decode attention as one fused CPU kernel (``decode_attention.c``), compiled for this machine on first use.

At 64 rows a decode step's attention is ~12 PyTorch ops per layer: products over the prompt's and each row's own keys, a
concatenation, a scale, a softmax, products over the values, cache writes. Each reads or writes its operands once more
from memory, and the batched products over each row's own keys are small (3 query heads x 64), where a BLAS call's fixed
cost dominates. The kernel does it all in one pass per row and key/value head: it reads each key and value once, from a
cache laid out for that read (keys in blocks of 16 positions, ``(blocks, D, 16)``).
``tests/engine/cpu/test_fused_attention.py`` checks it against attention by hand; its speed: ``docs/performance.md``
("Decode attention").

A row's output does not depend on the other rows, the chunk size or its prompt's left padding (the kernel's
docstring says why); the sampler's guarantee that a seeded request samples the same whatever is batched beside it
rests on that. Heads of any multiple of 8 floats, with up to ``MAX_QUERY_HEADS`` query heads per key/value head.

It needs an x86-64 CPU with AVX-512, or AVX2 with FMA (the same kernel at half the vector width), and a C compiler
(``$CC``, else ``cc``): ``native`` builds it for this CPU into ``$RLVR_HOME/kernels/`` (a fraction of a second,
once per machine and source); it runs on torch's own OpenMP threads. Without them, or where the numerics policy says
``attention=torch`` (``rlvr.numerics``: the ``attention`` config key or ``RLVR_ATTENTION``), the decoder uses the
PyTorch ops; ``attention=fused`` makes an unavailable kernel an error instead. A freshly loaded library is checked
against PyTorch on a small case before any use, so a miscompiled kernel is never used silently.

Not here: the decode step around it (``decode.py``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from rlvr.engine.cpu import native
from rlvr.errors import ConfigurationError
from rlvr.numerics import active

SOURCE = "decode_attention.c"
BLOCK = 16  # key positions per block of the key cache
MAX_QUERY_HEADS = 16  # query heads per key/value head the kernel handles (four at a time)

logger = logging.getLogger(__name__)


def key_blocks(columns: int) -> int:
    """Blocks of ``BLOCK`` positions that hold ``columns`` key columns."""
    return -(-columns // BLOCK)


def to_blocks(keys: torch.Tensor) -> torch.Tensor:
    """Keys (..., L, D) in the kernel's layout (..., ceil(L / 16), D, 16), zero-padded to whole blocks."""
    length, dim = keys.shape[-2:]
    padded = torch.nn.functional.pad(keys, (0, 0, 0, key_blocks(length) * BLOCK - length))
    return padded.view(*keys.shape[:-2], -1, BLOCK, dim).transpose(-1, -2).contiguous()


def supports(query_heads_per_kv: int, head_dim: int) -> bool:
    """Whether the kernel handles this attention shape (else the decoder keeps the PyTorch ops)."""
    return 1 <= query_heads_per_kv <= MAX_QUERY_HEADS and head_dim % 8 == 0


def _compiler() -> str:
    """The C compiler to build with; RuntimeError naming what this machine lacks for the kernel."""
    flags = native.cpu()[1]
    return native.compiler("AVX-512 and AVX2 with FMA", "avx512f" in flags or {"avx2", "fma"} <= flags)


def buildable() -> bool:
    """Whether this machine has what the kernel needs (x86-64 Linux, AVX-512 or AVX2 with FMA, a C compiler):
    where it does, a kernel that fails to build or to agree with PyTorch is a defect, not a missing feature."""
    try:
        _compiler()
    except RuntimeError:
        return False
    return True


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """The compiled kernel library (``native.build``); RuntimeError naming what is missing or what the compiler
    said. ``extra_flags``: ``("-mno-avx512f",)`` builds the AVX2 code on an AVX-512 machine, as the tests do."""
    return native.build(SOURCE, _compiler(), extra_flags)


def bind(library: Path):
    """The kernel's C function from ``library``, typed (see ``attend`` for the arguments)."""
    function = ctypes.CDLL(str(library)).rlvr_decode_attention
    function.restype = ctypes.c_int
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    function.argtypes = [pointer, i64, pointer, i64, pointer, i64, *[pointer] * 7, *[i32] * 8, ctypes.c_float]
    return function


@functools.cache
def kernel(choice: str | None = None, source: str = "attention"):
    """The loaded kernel, or None where it cannot run here (the reason is logged once). ``choice``, the policy's
    ``attention`` (None: ``rlvr.numerics.active()``'s), set by ``source`` (a config key or variable, for errors):
    ``auto`` uses it when it builds, ``torch`` never, ``fused`` always (an error when it cannot). Cached per choice."""
    if choice is None:
        choice, source = active().attention, active().source("attention")
    if choice == "torch":
        return None
    try:
        function = bind(build())
        self_check(function)
    except (RuntimeError, OSError) as error:
        if choice == "fused":
            raise ConfigurationError(f"{source}=fused, but the fused attention kernel cannot run here: {error}; "
                                     f"unset {source} to use the PyTorch ops") from error
        logger.info("fused decode attention unavailable (%s); the sampler uses PyTorch's ops", error)
        return None
    return function


def attend(function, q: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, prompt_keys: torch.Tensor,
           prompt_values: torch.Tensor, bias: torch.Tensor | None, keys: torch.Tensor, values: torch.Tensor,
           out: torch.Tensor, scratch: torch.Tensor, chunk: int, generated: int, scale: float) -> None:
    """One layer's decode attention into ``out`` (S, H * D), the new keys and values written to column
    ``generated - 1`` of ``keys`` and ``values`` first.

    ``q`` (S, H * D), ``new_k`` and ``new_v`` (S, G * D): row views (unit stride along the row) of the step's
    projections. ``prompt_keys`` (C, G, ceil(P / 16), D, 16) (``to_blocks``) and ``prompt_values`` (C, G, P, D):
    each chunk's prompt; ``bias`` (C, P): 0 where the prompt attends, -inf on left padding, or None. ``keys``
    (S, G, ceil(capacity / 16), D, 16) and ``values`` (S, G, capacity, D): each row's generated columns. Row s is in
    chunk ``s // chunk``. ``scratch``: at least S * H * (P + generated) floats. All float32.
    """
    slots, heads_dim = q.shape
    kv_heads, prompt_width, head_dim = prompt_values.shape[1:]
    query_heads = heads_dim // head_dim // kv_heads
    capacity = values.shape[2]
    for name, tensor in (("q", q), ("new_k", new_k), ("new_v", new_v)):
        if tensor.stride(1) != 1 or tensor.dtype != torch.float32:
            raise ValueError(f"{name}: rows of unit stride in float32 expected, got strides {tensor.stride()}")
    whole = {"prompt_keys": prompt_keys, "prompt_values": prompt_values, "keys": keys, "values": values, "out": out,
             "scratch": scratch}
    if bias is not None:
        whole["bias"] = bias
    for name, tensor in whole.items():
        if not tensor.is_contiguous() or tensor.dtype != torch.float32:
            raise ValueError(f"{name}: a contiguous float32 tensor expected")
    chunks = prompt_values.shape[0]
    row = (slots, kv_heads * head_dim)
    shapes = {"new_k": (new_k.shape, row), "new_v": (new_v.shape, row),
              "prompt_keys": (prompt_keys.shape, (chunks, kv_heads, key_blocks(prompt_width), head_dim, BLOCK)),
              "keys": (keys.shape, (slots, kv_heads, key_blocks(capacity), head_dim, BLOCK)),
              "values": (values.shape, (slots, kv_heads, capacity, head_dim)), "out": (out.shape, (slots, heads_dim)),
              "bias": (bias.shape if bias is not None else (chunks, prompt_width), (chunks, prompt_width)),
              "rows per chunk": ((slots,), (chunks * chunk,))}
    for name, (got, expected) in shapes.items():
        if tuple(got) != expected:
            raise ValueError(f"{name}: shape {tuple(got)}, expected {expected}")
    if scratch.numel() < slots * kv_heads * query_heads * (prompt_width + generated):
        raise ValueError(f"scratch: {scratch.numel()} floats, too few for this step")
    failed = function(q.data_ptr(), q.stride(0), new_k.data_ptr(), new_k.stride(0), new_v.data_ptr(), new_v.stride(0),
                      prompt_keys.data_ptr(), prompt_values.data_ptr(), 0 if bias is None else bias.data_ptr(),
                      keys.data_ptr(), values.data_ptr(), scratch.data_ptr(), out.data_ptr(), slots, kv_heads,
                      query_heads, head_dim, prompt_width, chunk, capacity, generated, scale)
    if failed:
        raise ValueError(f"fused attention: {query_heads} query heads per key/value head, head size {head_dim}, "
                         f"{generated} of {capacity} columns: outside what the kernel handles")


def reference(q: torch.Tensor, prompt_keys: torch.Tensor, prompt_values: torch.Tensor, bias: torch.Tensor | None,
              keys: torch.Tensor, values: torch.Tensor, chunk: int, scale: float) -> torch.Tensor:
    """What ``attend`` computes, in plain PyTorch, with keys in the usual layout: ``prompt_keys`` (C, G, P, D),
    ``keys`` and ``values`` (S, G, n, D) holding exactly the columns attended to. Returns (S, H * D)."""
    slots = q.shape[0]
    kv_heads, prompt_width, head_dim = prompt_values.shape[1:]
    q = q.reshape(slots, kv_heads, -1, head_dim)  # (S, G, Q, D)
    chunk_of = torch.arange(slots) // chunk
    prompt_scores = q @ prompt_keys[chunk_of].transpose(-1, -2)  # (S, G, Q, P)
    if bias is not None:
        prompt_scores = prompt_scores + bias[chunk_of][:, None, None, :]
    weights = (torch.cat((prompt_scores, q @ keys.transpose(-1, -2)), dim=-1) * scale).softmax(dim=-1)
    out = weights[..., :prompt_width] @ prompt_values[chunk_of] + weights[..., prompt_width:] @ values
    return out.reshape(slots, -1)


def self_check(function) -> None:
    """Run the kernel on a small random case (2 chunks, padding, 3 query heads per key/value head) and compare it
    with ``reference``: a library that disagrees is not used."""
    generator = torch.Generator().manual_seed(0)
    slots, kv_heads, query_heads, head_dim, width, chunk, capacity, generated = 4, 2, 3, 32, 21, 2, 40, 19
    heads = kv_heads * query_heads

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    q = randn(slots, heads * head_dim)
    new_k, new_v = randn(slots, kv_heads * head_dim), randn(slots, kv_heads * head_dim)
    prompt_keys, prompt_values = randn(2, kv_heads, width, head_dim), randn(2, kv_heads, width, head_dim)
    bias = torch.zeros(2, width)
    bias[1, :5] = float("-inf")
    own_keys, own_values = randn(slots, kv_heads, capacity, head_dim), randn(slots, kv_heads, capacity, head_dim)
    blocked, values = to_blocks(own_keys), own_values.clone()
    out = torch.full((slots, heads * head_dim), float("nan"))  # not empty: freed memory may hold a right answer
    scratch = torch.empty(slots * heads * (width + generated))
    attend(function, q, new_k, new_v, to_blocks(prompt_keys), prompt_values, bias, blocked, values, out, scratch,
           chunk, generated, head_dim**-0.5)
    own_keys[:, :, generated - 1] = new_k.view(slots, kv_heads, head_dim)
    own_values[:, :, generated - 1] = new_v.view(slots, kv_heads, head_dim)
    expected = reference(q, prompt_keys, prompt_values, bias, own_keys[:, :, :generated],
                         own_values[:, :, :generated], chunk, head_dim**-0.5)
    error = (out - expected).abs().max().item()
    if not error <= 1e-5:
        raise RuntimeError(f"the built kernel disagrees with PyTorch by {error:.3g} on a test case")
    if not (torch.equal(values, own_values) and torch.equal(blocked, to_blocks(own_keys))):
        raise RuntimeError("the built kernel did not write the new key and value into the cache as laid out")
