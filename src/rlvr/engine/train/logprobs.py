"""Logprobs of target tokens through the output layer, a chunk of rows at a time: no float32 rows x vocabulary tensor
for the whole batch, forward or backward (each chunk's logits are recomputed in the backward pass instead of kept).
Both trainers use it: the GPU paths' always (``gpu/packing.py``), the CPU one where a forward's logits would be
large (``train/prefix.py``).

Not here: which positions and targets (the trainers), the losses on the logprobs (``losses.py``).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # (n, V)
    wanted = targets.reshape(len(targets), -1)  # (n, K): K = 1 for (n,) targets, K for top-K (n, K) targets
    return (logits.gather(-1, wanted) - logits.logsumexp(-1, keepdim=True)).reshape(targets.shape)


def target_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """log softmax(head(hidden))[targets] per row of ``hidden`` (N, H), float32 shaped like ``targets`` ((N,) or
    (N, K)), ``chunk`` rows at a time; when gradients flow, each chunk's logits are recomputed in the backward pass
    instead of kept."""
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    pieces = []
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        if grad:
            pieces.append(checkpoint(_chunk_logprobs, head, h, t, use_reentrant=False, preserve_rng_state=False))
        else:
            pieces.append(_chunk_logprobs(head, h, t))
    return torch.cat(pieces) if pieces else hidden.new_zeros(targets.shape, dtype=torch.float32)
