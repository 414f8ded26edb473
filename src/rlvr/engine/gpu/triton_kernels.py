"""The Triton kernels of the GPU decode step and the functions that launch them (``kernels.py`` holds the contract,
the plain-torch references and the lazy import of this module).

Each kernel computes in float32 and rounds to the tensors' dtype exactly where Hugging Face's bfloat16 modules round
(after the norm, before its weight; after SiLU; after each product of the rotary embedding), so in bfloat16 its
outputs equal theirs up to the last bit's rounding mode. Importing this module imports ``triton``; with
``TRITON_INTERPRET=1`` set before that import, the kernels run in Triton's interpreter, on CPU tensors too (how the CPU
suite tests them). Whether they compile or interpret is fixed when this module is first imported.

Not here: which kernels a decode step uses (``decode.py``), the references (``kernels.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The kernels run in Triton's interpreter (TRITON_INTERPRET=1). Its products of bfloat16 operands are wrong (it holds
# them as 16-bit integers) and it rounds to bfloat16 toward zero: interpreted, the attention kernel takes its products
# in float32 on the bfloat16 values (exact: their products fit float32), and bfloat16 results differ from torch's by a
# last bit.
INTERPRETED = bool(triton.knobs.runtime.interpret)
BLOCK_COLUMNS = 32  # cached columns an attention program reads at once
TARGET_PROGRAMS = 512  # attention programs worth launching (a few per multiprocessor): rows x kv heads x splits
MAX_SPLITS = 32  # most splits of one row's cache (the reduce reads them all at once)


@triton.jit
def _rms_norm_kernel(x, residual, weight, out, n, eps, x_stride, r_stride, o_stride, HAS_RESIDUAL: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    h = tl.load(x + row * x_stride + cols, mask=inside, other=0.0)
    if HAS_RESIDUAL:
        # the residual stream's add, rounded to its dtype as torch's add rounds, and stored back
        h = (h.to(tl.float32) + tl.load(residual + row * r_stride + cols, mask=inside, other=0.0).to(tl.float32)
             ).to(residual.dtype.element_ty)
        tl.store(residual + row * r_stride + cols, h, mask=inside)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n + eps)
    normed = (h * rstd).to(out.dtype.element_ty).to(tl.float32)  # HF rounds to the input dtype before the weight
    w = tl.load(weight + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + row * o_stride + cols, (normed * w).to(out.dtype.element_ty), mask=inside)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
             ) -> torch.Tensor:
    """See ``kernels.rms_norm_reference``."""
    _rows_of(x, "x")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None:
        _rows_of(residual, "residual")
    n = x.shape[-1]
    _rms_norm_kernel[(x.shape[0],)](x, residual if residual is not None else x, weight, out, n, eps, x.stride(0),
                                    residual.stride(0) if residual is not None else 0, out.stride(0),
                                    HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n))
    return out


@triton.jit
def _swiglu_kernel(gate, up, out, n, g_stride, u_stride, o_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n
    g = tl.load(gate + row * g_stride + cols, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(up + row * u_stride + cols, mask=inside, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(out.dtype.element_ty).to(tl.float32)  # F.silu rounds to the dtype
    tl.store(out + row * o_stride + cols, (silu * u).to(out.dtype.element_ty), mask=inside)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """See ``kernels.swiglu_reference``."""
    _rows_of(gate, "gate")
    _rows_of(up, "up")
    out = torch.empty_like(gate, memory_format=torch.contiguous_format)
    rows, n = gate.shape
    block = min(1024, triton.next_power_of_2(n))
    _swiglu_kernel[(rows, triton.cdiv(n, block))](gate, up, out, n, gate.stride(0), up.stride(0), out.stride(0),
                                                  BLOCK=block)
    return out


@triton.jit
def _rotary_kernel(x, cos, sin, x_row_stride, x_head_stride, c_stride, HALF: tl.constexpr):
    row = tl.program_id(0)
    base = x + row * x_row_stride + tl.program_id(1) * x_head_stride
    d = tl.arange(0, HALF)
    dtype = x.dtype.element_ty
    x1 = tl.load(base + d).to(tl.float32)
    x2 = tl.load(base + HALF + d).to(tl.float32)
    c1 = tl.load(cos + row * c_stride + d).to(tl.float32)
    c2 = tl.load(cos + row * c_stride + HALF + d).to(tl.float32)
    s1 = tl.load(sin + row * c_stride + d).to(tl.float32)
    s2 = tl.load(sin + row * c_stride + HALF + d).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1); each product rounded, then their sum, as in HF
    first = (x1 * c1).to(dtype).to(tl.float32) + (-x2 * s1).to(dtype).to(tl.float32)
    second = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    tl.store(base + d, first.to(dtype))
    tl.store(base + HALF + d, second.to(dtype))


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """See ``kernels.rotary_reference_``."""
    half = q.shape[-1] // 2
    if half * 2 != q.shape[-1] or half & (half - 1):
        raise ValueError(f"head_dim={q.shape[-1]}: the rotary kernel takes head sizes 2 x a power of two")
    cos, sin = cos.contiguous(), sin.contiguous()
    for x in (q, k):
        if x.stride(-1) != 1:
            raise ValueError("rotary_: q and k need unit stride along head_dim (a view of a projection's output)")
        _rotary_kernel[(x.shape[0], x.shape[1])](x, cos, sin, x.stride(0), x.stride(1), cos.stride(0), HALF=half)


@triton.jit
def _attention_split_kernel(q, keys, values, lengths, m_out, l_out, acc_out, scale, q_row, q_head, k_row, k_head,
                            k_col, v_row, v_head, v_col, HEADS: tl.constexpr, GROUP: tl.constexpr,
                            BLOCK_Q: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                            SPLITS: tl.constexpr, IEEE: tl.constexpr):
    # IEEE: float32 products (float32 inputs, or the interpreter); else the inputs' own (bfloat16) tensor-core
    # products with float32 sums
    """One (row, key/value head, split): the GROUP query heads sharing that head against the split's columns below the
    row's length; writes their running max, sum of exponentials and weighted sum of values (float32)."""
    row, head, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)  # 64-bit: caches over 2 GiB
    length = tl.load(lengths + row)
    qi = tl.arange(0, BLOCK_Q)
    d = tl.arange(0, D)
    heads = head * GROUP + qi
    live = qi < GROUP
    query = tl.load(q + row * q_row + heads[:, None] * q_head + d[None, :], mask=live[:, None], other=0.0)
    m = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, length)
    k_base = keys + row * k_row + head * k_head
    v_base = values + row * v_row + head * v_head
    for first in range(start, end, BLOCK_N):
        cols = first + tl.arange(0, BLOCK_N)
        seen = cols < end
        k = tl.load(k_base + cols[:, None] * k_col + d[None, :], mask=seen[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(query.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            scores = tl.dot(query, tl.trans(k))
        scores = tl.where(seen[None, :], scores * scale, float("-inf"))  # (BLOCK_Q, BLOCK_N)
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * v_col + d[None, :], mask=seen[:, None], other=0.0)
        if IEEE:  # the weights rounded to the values' dtype, as a bfloat16 product takes them
            p_v = p.to(values.dtype.element_ty).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p_v, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype.element_ty), v)
        m = m_new
    at = (row * HEADS + heads) * SPLITS + split  # (BLOCK_Q,): an empty split leaves -inf, 0 and zeros
    tl.store(m_out + at, m, mask=live)
    tl.store(l_out + at, total, mask=live)
    tl.store(acc_out + at[:, None] * D + d[None, :], acc, mask=live[:, None])


@triton.jit
def _attention_reduce_kernel(m_in, l_in, acc_in, out, o_row, o_head, HEADS: tl.constexpr, D: tl.constexpr,
                             SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """One (row, query head): the splits' partial softmaxes rescaled to their common max and summed."""
    row, head = tl.program_id(0), tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    at = (row * HEADS + head) * SPLITS + s
    valid = s < SPLITS
    m = tl.load(m_in + at, mask=valid, other=float("-inf"))
    top = tl.max(m, axis=0)  # finite: the first split holds the row's newest column
    weight = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
    total = tl.sum(weight * tl.load(l_in + at, mask=valid, other=0.0), axis=0)
    acc = tl.load(acc_in + at[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
    result = tl.sum(weight[:, None] * acc, axis=0) / total
    tl.store(out + row * o_row + head * o_head + d, result.to(out.dtype.element_ty))


def supports(head_dim: int) -> bool:
    """Whether the kernels take heads of ``head_dim``: a power of two, at least 16 (Triton's products and ranges)."""
    return head_dim >= 16 and not head_dim & (head_dim - 1)


def splits_for(rows: int, kv_heads: int, capacity: int) -> int:
    """Columns per split: enough splits that rows x kv heads x splits fills the GPU (``TARGET_PROGRAMS``), no more
    than ``MAX_SPLITS``, each a multiple of ``BLOCK_COLUMNS``. A function of the shapes only, so a step captured as
    a CUDA graph keeps its launch grid."""
    blocks = triton.cdiv(capacity, BLOCK_COLUMNS)
    wanted = max(1, min(MAX_SPLITS, blocks, triton.cdiv(TARGET_PROGRAMS, rows * kv_heads)))
    return triton.cdiv(blocks, wanted) * BLOCK_COLUMNS


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float,
                     split: int | None = None) -> torch.Tensor:
    """See ``kernels.decode_attention_reference``; ``split``: columns per split (a multiple of ``BLOCK_COLUMNS``;
    None: ``splits_for``)."""
    rows, heads, d = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    if heads % kv_heads:
        raise ValueError(f"q has {heads} heads, the cache {kv_heads}: query heads must be a multiple of kv heads")
    if not supports(d):
        raise ValueError(f"head_dim={d}: the attention kernel takes head sizes that are powers of two, at least 16")
    if q.stride(-1) != 1 or keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("decode_attention: q, keys and values need unit stride along head_dim")
    split = split or splits_for(rows, kv_heads, capacity)
    if split % BLOCK_COLUMNS:
        raise ValueError(f"split={split}: columns per split must be a multiple of {BLOCK_COLUMNS}")
    splits = triton.cdiv(capacity, split)
    group = heads // kv_heads
    m = torch.empty((rows, heads, splits), dtype=torch.float32, device=q.device)
    total = torch.empty_like(m)
    acc = torch.empty((rows, heads, splits, d), dtype=torch.float32, device=q.device)
    _attention_split_kernel[(rows, kv_heads, splits)](
        q, keys, values, lengths, m, total, acc, scale, q.stride(0), q.stride(1), keys.stride(0), keys.stride(1),
        keys.stride(2), values.stride(0), values.stride(1), values.stride(2), HEADS=heads, GROUP=group,
        BLOCK_Q=max(16, triton.next_power_of_2(group)), D=d, BLOCK_N=BLOCK_COLUMNS, SPLIT=split, SPLITS=splits,
        IEEE=q.dtype == torch.float32 or INTERPRETED)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _attention_reduce_kernel[(rows, heads)](m, total, acc, out, out.stride(0), out.stride(1), HEADS=heads, D=d,
                                            SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)))
    return out


def _rows_of(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"{name}: the kernels take 2-D tensors with unit stride along the last dimension, got shape "
                         f"{tuple(x.shape)}, strides {x.stride()}")
