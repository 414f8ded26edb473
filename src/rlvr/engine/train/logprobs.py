"""Logprobs of target tokens through the output layer, a chunk of rows at a time: no float32 rows x vocabulary tensor
for the whole batch, forward or backward. Both trainers use it: the GPU paths' always (``gpu/packing.py``), the CPU
one where a forward's logits would be large (``train/prefix.py``).

Two ways to the gradient:

- a **frozen output layer** on the CPU (``train_unembed=False``, as TRL must run): the hidden state's gradient is
  ``sum_k g_k W[t_k] - (sum_k g_k) E`` with ``E = softmax(logits) @ W``, one H-vector per row; the forward computes
  ``E`` from each chunk's logits while it has them and keeps it instead of them, so the backward needs no second
  pass of the output layer (two passes of its matmul where recomputing takes three);
- otherwise (a LoRA on the output layer, a GPU): each chunk's logits are recomputed in the backward pass.

Not here: which positions and targets (the trainers), the losses on the logprobs (``losses.py``).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


class _PickedLogSoftmax(torch.autograd.Function):
    """log_softmax(logits)[rows, targets], (n, K) from logits (n, V) and targets (n, K), with a backward that writes
    one logits-sized tensor in place: d logits = scatter(g) - softmax(logits) * sum_k g, instead of autograd's chain
    through logsumexp, gather and their sum (four logits-sized temporaries and as many passes over them)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lse = logits.logsumexp(-1, keepdim=True)  # (n, 1)
        ctx.save_for_backward(logits, lse, targets)
        return logits.gather(-1, targets) - lse

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse, targets = ctx.saved_tensors  # type: ignore[attr-defined]
        d_logits = torch.sub(logits, lse).exp_().mul_(-grad.sum(-1, keepdim=True))  # (n, V)
        return d_logits.scatter_add_(-1, targets, grad), None


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # (n, V)
    wanted = targets.reshape(len(targets), -1)  # (n, K): K = 1 for (n,) targets, K for top-K (n, K) targets
    return _PickedLogSoftmax.apply(logits, wanted).reshape(targets.shape)


class _FrozenHeadLogprobs(torch.autograd.Function):
    """log_softmax(head(hidden))[rows, targets], (N, K), for an ``nn.Linear`` head that does not train: the forward
    keeps ``E = softmax @ W`` (N, H) per row rather than the logits, and the backward is ``d hidden = sum_k g_k
    W[t_k] - (sum_k g_k) E`` (the chain rule through log-softmax, with no second pass of the output layer)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor, head: torch.nn.Linear,
                targets: torch.Tensor, chunk: int) -> torch.Tensor:
        from rlvr.engine.cpu.packed import transposed_product  # a CPU path: the GPU paths never load the kernels

        values, expected = [], []
        for start in range(0, hidden.shape[0], chunk):
            logits = head(hidden[start:start + chunk]).float()  # (n, V), worked on in place from here
            logits.sub_(logits.amax(-1, keepdim=True))
            picked = logits.gather(-1, targets[start:start + chunk])  # (n, K)
            total = logits.exp_().sum(-1, keepdim=True)  # (n, 1)
            values.append(picked - total.log())
            probs = logits.div_(total).to(head.weight.dtype)  # softmax (n, V)
            expected.append(transposed_product(head, probs))  # (n, H): E (in bfloat16 where the head runs so)
        ctx.save_for_backward(head.weight, targets, torch.cat(expected))
        return torch.cat(values)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        weight, targets, expected = ctx.saved_tensors  # type: ignore[attr-defined]
        n, k = targets.shape
        picked = weight.index_select(0, targets.reshape(-1)).float().view(n, k, -1)  # (N, K, H): W[t_k]
        d_hidden = torch.einsum("nk,nkh->nh", grad, picked) - grad.sum(-1, keepdim=True) * expected.float()
        return d_hidden.to(expected.dtype), None, None, None


def target_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """log softmax(head(hidden))[targets] per row of ``hidden`` (N, H), float32 shaped like ``targets`` ((N,) or
    (N, K)), ``chunk`` rows at a time; when gradients flow, a frozen ``nn.Linear`` head on the CPU keeps one H-vector
    per row for the backward pass, any other head recomputes each chunk's logits there."""
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    frozen = isinstance(head, torch.nn.Linear) and not any(p.requires_grad for p in head.parameters())
    if grad and frozen and hidden.device.type == "cpu":
        wanted = targets.reshape(len(targets), -1)  # (N, K)
        return _FrozenHeadLogprobs.apply(hidden, head, wanted, chunk).reshape(targets.shape)
    pieces = []
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        if grad:
            pieces.append(checkpoint(_chunk_logprobs, head, h, t, use_reentrant=False, preserve_rng_state=False))
        else:
            pieces.append(_chunk_logprobs(head, h, t))
    return torch.cat(pieces) if pieces else hidden.new_zeros(targets.shape, dtype=torch.float32)
