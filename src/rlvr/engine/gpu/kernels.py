"""The kernels of the GPU decode step, as a set of functions with one contract and two implementations: Triton
kernels (``triton_kernels.py``, imported only when asked for: this module imports without triton) and plain-torch
references that compute the same thing the way Hugging Face's modules do.

- ``rms_norm(x, weight, eps, residual=None)``: RMSNorm of each row of ``x`` (R, N); with ``residual`` (R, N), first
  ``residual += x`` in place (the residual stream's add) and the norm is of that sum. Replaces ``LlamaRMSNorm`` (and
  Qwen2's and Qwen3's, the same formula; Qwen3's q/k norms are calls on (R * heads, head_dim)).
- ``swiglu(gate, up)``: ``silu(gate) * up``, (R, I) each; the MLP's activation.
- ``rotary_(q, k, cos, sin)``: the rotary embedding applied in place to q (R, H, D) and k (R, G, D) (each a view
  with unit stride along D) with each row's ``cos`` and ``sin`` (R, D): ``x * cos + rotate_half(x) * sin``, the
  "rotate_half" layout of Llama, Qwen2 and Qwen3 (``apply_rotary_pos_emb``).
- ``decode_attention(q, keys, values, lengths, scale)``: one query token per row, q (R, H, D), over each row's
  first ``lengths[r]`` columns (at least 1) of its cache ``keys`` and ``values`` (R, G, C, D), H a multiple of G
  (grouped-query attention: query head h reads key/value head h // (H / G)); returns (R, H, D). Causal by
  construction: the cache holds the row's past and its newest column, nothing after. The Triton kernel splits each
  row's columns (flash-decoding: a partial softmax per split, then a reduce), so long caches fill the GPU.

Every function computes in float32 and rounds to the inputs' dtype where the modules it replaces round, so in
float32 they agree with Hugging Face's to float32 rounding, in bfloat16 to a bfloat16 rounding step.

Not here: composing them into a decode step (``decode.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Kernels:
    """One implementation of each kernel a decode step calls (see the module docstring for their contracts)."""

    name: str  # "reference" or "triton"
    rms_norm: Callable[..., torch.Tensor]
    swiglu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rotary_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    decode_attention: Callable[..., torch.Tensor]
    supports: Callable[[int], bool] = lambda head_dim: True  # whether the kernels take heads of this size


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """``LlamaRMSNorm``'s arithmetic on each row of ``x`` (or of ``residual += x``, in place)."""
    if residual is not None:
        x = residual.add_(x)
    h = x.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(``gate``) * ``up``, rounded as the MLP rounds."""
    return F.silu(gate) * up


def rotary_reference_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """``apply_rotary_pos_emb``'s arithmetic on q (R, H, D) and k (R, G, D), written back into them."""
    half = q.shape[-1] // 2
    cos, sin = cos[:, None], sin[:, None]  # (R, 1, D): one position per row, for every head
    for x in (q, k):
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        x.copy_(x * cos + rotated * sin)


def decode_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                               scale: float, split: int | None = None) -> torch.Tensor:
    """Softmax attention of each row's query heads over its first ``lengths[r]`` cached columns, one softmax over
    all of them (``split`` is ignored: the reference does not split)."""
    rows, heads, d = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    grouped = q.view(rows, kv_heads, heads // kv_heads, d).float()  # query heads by the key/value head they read
    scores = torch.matmul(grouped, keys.float().transpose(-1, -2)) * scale  # (R, G, H / G, C)
    beyond = torch.arange(capacity, device=q.device) >= lengths[:, None]  # (R, C)
    scores.masked_fill_(beyond[:, None, None, :], float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1), values.float())  # (R, G, H / G, D)
    return out.view(rows, heads, d).to(q.dtype)


REFERENCE = Kernels("reference", rms_norm_reference, swiglu_reference, rotary_reference_, decode_attention_reference)


def triton_available() -> bool:
    """Whether triton imports here (it need not: the references serve the CPU)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreted() -> bool:
    """Whether ``triton_kernels()`` runs in Triton's interpreter (which takes CPU tensors) rather than compiled."""
    from rlvr.engine.gpu import triton_kernels as compiled

    return compiled.INTERPRETED


@functools.cache
def triton_kernels() -> Kernels:
    """The Triton kernels, compiled for the GPU, or interpreted where ``TRITON_INTERPRET=1`` was set before this first
    call (the mode holds for the whole process). Raises ``ImportError`` naming the fix where triton is missing."""
    try:
        from rlvr.engine.gpu import triton_kernels as compiled
    except ImportError as exc:
        raise ImportError(f"the GPU decode kernels need triton ({exc}); install it (`pip install triton`, which "
                          "CUDA builds of torch bring along) or use the reference kernels") from exc
    return Kernels("triton", compiled.rms_norm, compiled.swiglu, compiled.rotary_, compiled.decode_attention,
                   compiled.supports)
