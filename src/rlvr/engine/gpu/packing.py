"""The trainer's forward on a GPU: datums packed into rows, logprobs computed a chunk of tokens at a time.

- **Packing** (``plan``): datums are packed first-fit, longest first, into rows of at most ``row_tokens`` tokens (a
  longer datum has a row of its own), and rows into microbatches of at most ``max_tokens`` padded positions (one row
  at least). A row is one sequence to the model, but its position ids restart at 0 at every datum, and from those
  transformers builds a block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``: PyTorch's SDPA
  under that mask) or takes flash-attention's variable-length path when the model runs flash-attention 2. So each
  datum attends to its own tokens only, and its logprobs are those of a forward on it alone (tested). The padding at
  the end of a row is one more sequence of its own, whose outputs are dropped.
- **Chunked logprobs** (``train.logprobs.target_logprobs``): the output layer and the log-softmax run over
  ``logit_chunk`` tokens at a time, and each chunk is recomputed in the backward pass rather than kept, so no float32
  tokens x vocabulary tensor for the whole batch ever exists (Qwen3's 151,936 entries at 16k tokens would be 10 GB),
  forward or backward. The values and gradients are those of the full log-softmax (tested).
- **Activation checkpointing** (``checkpointed``, when ``GpuPaths.checkpointing``): each decoder layer's activations
  are recomputed in the backward pass instead of kept.

The CPU engine takes the shared-prefix forward (``prefix.py``) instead, which saves the prompt's compute on a
machine where compute is what is short; on a GPU, packing keeps the matmuls large and padding-free.

Not here: choosing the path (``engine.py``), the settings (``device.GpuPaths``), losses (``losses.py``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.engine.device import GpuPaths, model_device
from rlvr.engine.train.logprobs import target_logprobs


@dataclass(frozen=True)
class PackedRow:
    """Datums (by index) packed one after another into one row of a microbatch."""

    rows: tuple[int, ...]
    """The datums' indices, in the order they sit in the row (named as ``prefix.Cluster.rows``: the engine reads
    either)."""


def plan(lengths: Sequence[int], row_tokens: int, max_tokens: int) -> list[list[PackedRow]]:
    """Microbatches of packed rows for datums of ``lengths`` tokens (see the module docstring)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    used: list[int] = []
    for i in order:  # first fit, longest first
        for r, filled in enumerate(used):
            if filled + lengths[i] <= row_tokens:
                rows[r].append(i)
                used[r] += lengths[i]
                break
        else:
            rows.append([i])
            used.append(lengths[i])
    batches: list[list[PackedRow]] = []
    width = 0
    for r in sorted(range(len(rows)), key=lambda r: (-used[r], r)):
        if batches and (len(batches[-1]) + 1) * max(width, used[r]) <= max_tokens:
            batches[-1].append(PackedRow(tuple(rows[r])))
            width = max(width, used[r])
        else:
            batches.append([PackedRow(tuple(rows[r]))])
            width = used[r]
    return batches


@contextlib.contextmanager
def checkpointed(layers: Iterable[torch.nn.Module], on: bool = True) -> Iterator[None]:
    """Within this block (when ``on``), each of ``layers`` keeps only its inputs for the backward pass and recomputes
    the rest there. (transformers' own switch works only in training mode, and the engine keeps models in eval
    mode.)"""
    layers = list(layers) if on else []
    for layer in layers:
        layer.forward = functools.partial(checkpoint, type(layer).forward.__get__(layer), use_reentrant=False)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def packed_logprobs(
    model: torch.nn.Module, input_ids: Sequence[torch.Tensor], targets: Sequence[torch.Tensor],
    batch: Sequence[PackedRow], pad_id: int, paths: GpuPaths,
) -> dict[int, torch.Tensor]:
    """log p(targets[i][t] | input_ids[i][:t+1]) for every datum of ``batch``, float32 (T_i,) each on the model's
    device, by datum index; differentiable when grad is enabled."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = causal_lm.get_decoder()
    device = model_device(causal_lm)
    order = [i for row in batch for i in row.rows]
    lengths = [len(input_ids[i]) for i in order]
    width = max(sum(len(input_ids[i]) for i in row.rows) for row in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, W)
    positions = torch.empty((len(batch), width), dtype=torch.long)  # (B, W): restarting at every datum
    flat: list[torch.Tensor] = []  # where each datum's tokens sit in the flattened (B * W) batch
    for b, row in enumerate(batch):
        start = 0
        for i in row.rows:
            n = len(input_ids[i])
            ids[b, start:start + n] = input_ids[i]
            positions[b, start:start + n] = torch.arange(n)
            flat.append(torch.arange(b * width + start, b * width + start + n))
            start += n
        positions[b, start:] = torch.arange(width - start)  # the padding: a sequence of its own
    with checkpointed(decoder.layers, paths.checkpointing and torch.is_grad_enabled()):
        hidden = decoder(input_ids=ids.to(device), position_ids=positions.to(device), use_cache=False
                         ).last_hidden_state  # (B, W, H)
    hidden = hidden.reshape(-1, hidden.shape[-1])[torch.cat(flat).to(device)]  # (N, H)
    wanted = torch.cat([targets[i] for i in order]).to(device)
    values = target_logprobs(hidden, causal_lm.get_output_embeddings(), wanted, paths.logit_chunk)
    return dict(zip(order, values.split(lengths), strict=True))
