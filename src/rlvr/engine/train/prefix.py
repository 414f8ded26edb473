"""The trainer's forward pass with shared prefixes: datums that begin with the same tokens (a GRPO group: one prompt
and its sampled answers) compute those tokens once, and each datum's remaining tokens attend to their keys and
values.

A call's datums are planned as clusters: sorted by their tokens, neighbours joined while that saves work (a cluster
of n datums sharing L tokens skips (n - 1) x L token positions). One forward runs every cluster's shared prefix
(right-padded); the rest of every member then runs against its cluster's cached keys and values, right-padded, in a
few forwards of rows of similar length (so a short answer does not pad to the longest). Gradients flow back through
the shared keys and values into the prefix, so the logprobs and gradients equal those of one forward per datum up
to float rounding (tests compare them). A datum that shares nothing is a cluster of one whose prefix is the whole
datum: a batch with no sharing is one plain forward.

The output layer runs on the decoder's hidden states. Where a forward's float32 logits would pass
``LOGITS_MAX_BYTES`` (a 151,936-entry vocabulary at 4096 tokens is 2.5 GB, and its log-softmax's backward as much
again), only the positions that have a target go through it, each (position, target) once, a chunk of rows at a time,
and no chunk's logits are kept for the backward pass (``logprobs.target_logprobs``): a LoRA on the output layer
recomputes them there (one more pass of the output layer), a frozen output layer keeps one hidden-sized row per token
instead (no more passes). Memory no longer grows with the vocabulary. Below the limit the whole logits tensor is
taken.

Not here: datum checking (``batch.py``), losses (``losses.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from rlvr.engine.sample.kv_cache import cache_kwargs, returned_cache
from rlvr.engine.train.logprobs import lora_head, target_logprobs

MIN_SHARED = 4
"""Shortest common prefix worth a cluster (tokens)."""
MIN_BUCKET = 512
"""Token positions a suffix forward holds before rows of quite different length start another."""
BUCKET_FILL = 0.75
"""A row joins the current suffix forward when it is at least this fraction of the forward's width."""
LOGITS_MAX_BYTES = 2**30
"""A forward's float32 logits above this size are computed a chunk of target positions at a time."""
CHUNK_VALUES = 2**25
"""Logits in one chunk (rows x vocabulary; 128 MB of float32): 220 rows of a 151,936-entry vocabulary."""


@dataclass(frozen=True)
class Cluster:
    """Datums (by index) whose first ``shared`` tokens are equal and computed once."""

    rows: tuple[int, ...]
    shared: int
    """At most the length of every row; a row of exactly this length is all prefix."""


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def find_clusters(sequences: Sequence[Sequence[int]]) -> list[Cluster]:
    """Group sequences by shared prefix: sorted order, a neighbour joins while the saving does not shrink."""
    order = sorted(range(len(sequences)), key=lambda i: list(sequences[i]))
    clusters: list[Cluster] = []
    rows: list[int] = []
    shared = 0  # of `rows` when it has two or more members

    def close() -> None:
        if len(rows) == 1:
            clusters.append(Cluster((rows[0],), len(sequences[rows[0]])))
        elif rows:
            clusters.append(Cluster(tuple(rows), shared))

    for i in order:
        if rows:
            common = _common(sequences[rows[-1]], sequences[i])
            joined = min(common, len(sequences[i])) if len(rows) == 1 else min(shared, common)
            if joined >= MIN_SHARED and len(rows) * joined >= (len(rows) - 1) * shared:
                rows.append(i)
                shared = joined
                continue
            close()
        rows, shared = [i], 0
    close()
    return clusters


def _cost(clusters: Sequence[Cluster], lengths: Sequence[int]) -> int:
    """Padded token positions of the two forwards over ``clusters``."""
    prefix = max(c.shared for c in clusters)
    suffix = max(lengths[r] - c.shared for c in clusters for r in c.rows)
    rows = sum(len(c.rows) for c in clusters)
    return len(clusters) * prefix + (rows * suffix if suffix else 0)


def plan(sequences: Sequence[Sequence[int]], max_tokens: int) -> list[list[Cluster]]:
    """Microbatches of clusters, each padding to about ``max_tokens`` positions at most (one row at least).

    Clusters with members come first, then single datums by length; a cluster too big for one microbatch is split
    into several with the same prefix (recomputed for each).
    """
    lengths = [len(s) for s in sequences]
    pieces: list[Cluster] = []
    clusters = find_clusters(sequences)
    shared = [c for c in clusters if len(c.rows) > 1]
    single = sorted((c for c in clusters if len(c.rows) == 1), key=lambda c: c.shared)
    for cluster in shared:
        suffix = max(lengths[r] - cluster.shared for r in cluster.rows)
        per_piece = max(1, (max_tokens - cluster.shared) // max(suffix, 1))
        pieces += [Cluster(cluster.rows[k:k + per_piece], cluster.shared)
                   for k in range(0, len(cluster.rows), per_piece)]
    pieces += single
    batches: list[list[Cluster]] = []
    for piece in pieces:
        if batches and _cost([*batches[-1], piece], lengths) <= max_tokens:
            batches[-1].append(piece)
        else:
            batches.append([piece])
    return batches


def cluster_logprobs(
    model: torch.nn.Module, input_ids: Sequence[torch.Tensor], targets: Sequence[torch.Tensor],
    clusters: Sequence[Cluster], pad_id: int,
) -> dict[int, torch.Tensor]:
    """log p(targets[i][t] | input_ids[i][:t+1]) for every row of ``clusters``, (T_i,) each (or (T_i, K) for
    top-K targets (T_i, K)), by row index; differentiable when grad is enabled."""
    lengths = {r: len(input_ids[r]) for c in clusters for r in c.rows}
    width = max(c.shared for c in clusters)
    prefix_ids = torch.full((len(clusters), width), pad_id, dtype=torch.long)  # (U, W)
    prefix_mask = torch.zeros((len(clusters), width), dtype=torch.long)  # (U, W)
    for u, cluster in enumerate(clusters):
        prefix_ids[u, :cluster.shared] = input_ids[cluster.rows[0]][:cluster.shared]
        prefix_mask[u, :cluster.shared] = 1
    positions = torch.arange(width).expand(len(clusters), width)
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = causal_lm.get_decoder(), causal_lm.get_output_embeddings()
    vocab = causal_lm.config.get_text_config().vocab_size
    out = decoder(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=positions,
                  **cache_kwargs(DynamicCache()))
    prefix_hidden = out.last_hidden_state  # (U, W, H)

    members = [(u, r) for u, cluster in enumerate(clusters) for r in cluster.rows]
    rests = [lengths[r] - clusters[u].shared for u, r in members]
    kv = [(layer.keys, layer.values) for layer in returned_cache(out).layers]  # (U, H, W, D) each
    tails = {j: prefix_hidden.new_zeros((0, *targets[r].shape[1:]), dtype=torch.float32)
             for j, (_, r) in enumerate(members) if rests[j] == 0}
    for bucket in _buckets([j for j, rest in enumerate(rests) if rest], rests):
        width = rests[bucket[0]]
        suffix_ids = torch.full((len(bucket), width), pad_id, dtype=torch.long)  # (B, S)
        suffix_mask = torch.zeros((len(bucket), width), dtype=torch.long)  # (B, S)
        for b, j in enumerate(bucket):
            u, r = members[j]
            suffix_ids[b, :rests[j]] = input_ids[r][clusters[u].shared:]
            suffix_mask[b, :rests[j]] = 1
        cluster_of = torch.tensor([members[j][0] for j in bucket])  # (B,)
        starts = torch.tensor([clusters[members[j][0]].shared for j in bucket])  # (B,)
        cache = DynamicCache(ddp_cache_data=[(k.index_select(0, cluster_of), v.index_select(0, cluster_of))
                                             for k, v in kv])  # each row's cluster's prefix
        hidden = decoder(input_ids=suffix_ids, attention_mask=torch.cat([prefix_mask[cluster_of], suffix_mask], -1),
                         position_ids=starts[:, None] + torch.arange(width), **cache_kwargs(cache)
                         ).last_hidden_state  # (B, S, H)
        rows = [b for b, j in enumerate(bucket) for _ in range(rests[j])]
        steps = [t for j in bucket for t in range(rests[j])]
        tokens = torch.cat([targets[members[j][1]][-rests[j]:] for j in bucket])
        values = _target_logprobs(head, hidden, vocab, rows, steps, tokens)  # one gather per forward
        tails.update(zip(bucket, values.split([rests[j] for j in bucket]), strict=True))

    # One gather over the prefix logits (a gather per row would make its backward fill a logits-sized tensor each).
    rows = [u for u, r in members for _ in range(clusters[u].shared)]
    steps = [t for u, _ in members for t in range(clusters[u].shared)]
    tokens = torch.cat([targets[r][:clusters[u].shared] for u, r in members])
    heads = _target_logprobs(head, prefix_hidden, vocab, rows, steps, tokens).split(
        [clusters[u].shared for u, _ in members])
    return {r: torch.cat([h, tails[j]]) for j, ((_, r), h) in enumerate(zip(members, heads, strict=True))}


def _target_logprobs(head: torch.nn.Module, hidden: torch.Tensor, vocab: int, rows: list[int], steps: list[int],
                     tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(head(hidden[rows, steps]))[tokens], (M,) for targets (M,) or (M, K) for top-K targets (M, K):
    through the whole logits tensor, or, where that would pass ``LOGITS_MAX_BYTES`` or the head is a frozen
    bfloat16 one (whose chunked path keeps one H-vector a row, ``logprobs.target_logprobs``, and saves the logits'
    backward) or a LoRA over a frozen one (whose chunked path works on each chunk's logits in place and skips the
    rows with no gradient in its backward), only at the (position, target) pairs asked for, each once (a cluster's
    members ask for its shared positions alike), in chunks.

    Taken with ``index_select`` on flattened tensors, not advanced indexing: the same (row, step) recurs for every
    datum of a cluster, and advanced indexing's backward adds such repeats with parallel atomic adds once the
    gradient it scatters has 32k elements (torch's grain size), in an order that differs from run to run;
    ``index_select``'s backward adds them in index order, so a seed gives the same gradients bit for bit."""
    from rlvr.engine.cpu.packed import bfloat16_head  # the CPU trainer's: a CUDA engine never loads the kernels

    batch, width, size = hidden.shape
    at = torch.tensor(rows, dtype=torch.long) * width + torch.tensor(steps, dtype=torch.long)  # (M,)
    if batch * width * vocab * 4 <= LOGITS_MAX_BYTES and not bfloat16_head(head) and lora_head(head) is None:
        logits = head(hidden).float()  # (B, W, V)
        lse = logits.logsumexp(-1)
        if tokens.dim() == 2:
            at = at[:, None].expand_as(tokens)
        picked = logits.reshape(-1).index_select(0, (at * vocab + tokens.long()).reshape(-1)).view(at.shape)
        return picked - lse.reshape(-1).index_select(0, at.reshape(-1)).view(at.shape)
    pairs = torch.cat([at[:, None], tokens.long().reshape(len(at), -1)], dim=1)  # (M, 1 + K)
    unique, inverse = torch.unique(pairs, dim=0, return_inverse=True)  # sorted: the same order on every run
    wanted = unique[:, 1:] if tokens.dim() == 2 else unique[:, 1]
    values = target_logprobs(hidden.reshape(-1, size).index_select(0, unique[:, 0]), head, wanted,
                             max(1, CHUNK_VALUES // vocab), cpu_paths=True)
    return values.index_select(0, inverse)


def _buckets(rows: list[int], lengths: Sequence[int]) -> list[list[int]]:
    """``rows`` grouped for the suffix forwards, longest first: a bucket pads to its first row's length, and a new
    one starts once the current has ``MIN_BUCKET`` positions and the next row is under ``BUCKET_FILL`` of its width
    (so padding stays small without many tiny forwards)."""
    buckets: list[list[int]] = []
    for j in sorted(rows, key=lambda j: -lengths[j]):
        if buckets:
            width = lengths[buckets[-1][0]]
            if len(buckets[-1]) * width < MIN_BUCKET or lengths[j] >= BUCKET_FILL * width:
                buckets[-1].append(j)
                continue
        buckets.append([j])
    return buckets
