"""Logprobs of target tokens through the output layer, a chunk of rows at a time: no float32 rows x vocabulary tensor
for the whole batch, forward or backward. Both trainers use it: the GPU paths' always (``gpu/packing.py``), the CPU
one where a forward's logits would be large or its head has a backward of its own here (``train/prefix.py``).

Three ways to the gradient, the first two on the CPU paths only (``cpu_paths``):

- a **frozen output layer** (``train_unembed=False``, as TRL must run): the hidden state's gradient is
  ``sum_k g_k W[t_k] - (sum_k g_k) E`` with ``E = softmax(logits) @ W``, one H-vector per row; the forward computes
  ``E`` from each chunk's logits while it has them and keeps it instead of them, so the backward needs no second
  pass of the output layer (two passes of its matmul where recomputing takes three);
- a **LoRA on a frozen output layer** (peft's ``lm_head`` with one plain adapter, as Tinker's
  ``train_unembed=True`` makes it): each chunk's logits are computed in place (the base product, then the adapter's
  ``addmm_`` into it, then the log-softmax's passes on that one buffer) and recomputed the same way in the backward
  pass, only for the rows whose gradient is not zero (a prompt's positions, which carry no advantage, have none);
- otherwise (the GPU paths, any other head): each chunk's logits are recomputed in the backward pass through
  autograd.

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


def lora_head(head: torch.nn.Module) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor, float] | None:
    """(base, A, B, scaling) of a peft LoRA layer over a frozen, bias-free float32 ``nn.Linear`` with one plain
    float32 adapter active (its output ``base(x) + scaling * x Aᵀ Bᵀ``); None for any other head."""
    from peft.tuners.lora import Linear as LoraLinear

    from rlvr.engine.models.lora import plain_adapters

    if type(head) is not LoraLinear:
        return None
    names, base = plain_adapters(head, torch.float32), head.base_layer
    if names is None or len(names) != 1 or type(base) is not torch.nn.Linear or base.bias is not None \
            or base.weight.requires_grad or base.weight.dtype != torch.float32:
        return None
    return base, head.lora_A[names[0]].weight, head.lora_B[names[0]].weight, head.scaling[names[0]]


def _lora_logits(base: torch.nn.Linear, hidden: torch.Tensor, down: torch.Tensor, up: torch.Tensor,
                 scaling: float) -> torch.Tensor:
    """``base(hidden) + scaling * down @ upᵀ``, (n, V) float32, the adapter's term added into the base product's
    own (fresh) output; ``down`` = hidden @ Aᵀ, (n, r)."""
    return base(hidden).float().addmm_(down, up.t(), alpha=scaling)


class _LoraHeadLogprobs(torch.autograd.Function):
    """log_softmax(base(h) + s h Aᵀ Bᵀ)[rows, targets], (N, K), for a LoRA on a frozen output layer: each chunk's
    logits worked on in place and dropped; the backward recomputes them for the rows with a gradient, and gives
    d h = d_logits W + d_z A, d z = s d_logits B, d A = d zᵀ h, d B = s d_logitsᵀ z, with z = h Aᵀ and
    d_logits = scatter(g) - softmax * sum_k g_k."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor, down_weight: torch.Tensor,
                up: torch.Tensor, base: torch.nn.Linear, scaling: float, targets: torch.Tensor, chunk: int
                ) -> torch.Tensor:
        down = hidden @ down_weight.t()  # (N, r)
        values, lse = [], []
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = _lora_logits(base, hidden[rows], down[rows], up, scaling)  # (n, V)
            top = logits.amax(-1, keepdim=True)  # (n, 1)
            picked = logits.gather(-1, targets[rows])  # (n, K)
            log_total = logits.sub_(top).exp_().sum(-1, keepdim=True).log_().add_(top)  # (n, 1): logsumexp
            values.append(picked - log_total)
            lse.append(log_total)
        ctx.save_for_backward(hidden, down_weight, up, down, targets, torch.cat(lse))
        ctx.base, ctx.scaling, ctx.chunk = base, scaling, chunk
        return torch.cat(values)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple:
        from rlvr.engine.cpu.packed import transposed_product  # a CPU path: the GPU paths never load the kernels

        hidden, down_weight, up, down, targets, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        base, scaling, chunk = ctx.base, ctx.scaling, ctx.chunk  # type: ignore[attr-defined]
        d_hidden = torch.zeros_like(hidden)  # (N, H)
        d_down = torch.zeros_like(down)  # (N, r)
        d_up = torch.zeros_like(up)  # (V, r)
        live = (grad != 0).any(-1).nonzero().squeeze(1)  # rows with a gradient, in order
        for start in range(0, len(live), chunk):
            rows = live[start:start + chunk]
            g, z = grad.index_select(0, rows), down.index_select(0, rows)  # (n, K), (n, r)
            d_logits = _lora_logits(base, hidden.index_select(0, rows), z, up, scaling)  # (n, V), in place from here
            d_logits.sub_(lse.index_select(0, rows)).exp_().mul_(-g.sum(-1, keepdim=True))
            d_logits.scatter_add_(-1, targets.index_select(0, rows), g)
            d_up.addmm_(d_logits.t(), z, alpha=scaling)
            d_down.index_copy_(0, rows, d_logits @ up * scaling)
            d_hidden.index_copy_(0, rows, transposed_product(base, d_logits))
        d_hidden.addmm_(d_down, down_weight)
        return d_hidden, d_down.t() @ hidden, d_up, None, None, None, None


def target_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, chunk: int,
                    cpu_paths: bool = False) -> torch.Tensor:
    """log softmax(head(hidden))[targets] per row of ``hidden`` (N, H), float32 shaped like ``targets`` ((N,) or
    (N, K)), ``chunk`` rows at a time. On the CPU paths (``cpu_paths``: the CPU trainer, whose products run on the
    CPU kernels; the GPU paths leave it False), when gradients flow, a frozen ``nn.Linear`` head keeps one H-vector
    per row for the backward pass, and a LoRA over one (``lora_head``) recomputes in place the logits of the rows
    with a gradient; any other head recomputes each chunk's logits through autograd."""
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    frozen = isinstance(head, torch.nn.Linear) and not any(p.requires_grad for p in head.parameters())
    lora = lora_head(head) if cpu_paths and hidden.dtype == torch.float32 else None
    wanted = targets.reshape(len(targets), -1)  # (N, K)
    if grad and frozen and cpu_paths:
        return _FrozenHeadLogprobs.apply(hidden, head, wanted, chunk).reshape(targets.shape)
    if lora is not None and len(hidden):
        base, down_weight, up, scaling = lora
        return _LoraHeadLogprobs.apply(hidden, down_weight, up, base, scaling, wanted, chunk).reshape(targets.shape)
    pieces = []
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        if grad:
            pieces.append(checkpoint(_chunk_logprobs, head, h, t, use_reentrant=False, preserve_rng_state=False))
        else:
            pieces.append(_chunk_logprobs(head, h, t))
    return torch.cat(pieces) if pieces else hidden.new_zeros(targets.shape, dtype=torch.float32)
