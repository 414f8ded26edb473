"""Autoregressive sampling with a KV cache, returning the logprob of every chosen token.

Requests that arrive together are decoded together. Each distinct prompt is prefilled once and its KV cache
repeated for its ``num_samples`` rows; then all live rows of all requests decode together, one token per step. Rows
that finish (a stop token, a stop string, ``max_tokens``) leave the batch. A request's ``watch`` (``watch.py``) is
handed each step's tokens as they are drawn, and a cancelled request's rows leave the batch at the next step.

Invariants:

- a seeded request gets the same tokens and logprobs, bit for bit, whatever else is batched with it and wherever it
  sits: it draws from its own generator, each prompt is prefilled on its own (``prefill_each``), and on the CPU path
  every number of a row is computed from that row alone (``decode.LlamaDecoder``'s row-independent kernels). Where one
  of those is missing (Hugging Face's forward for other architectures, PyTorch's attention ops, unpacked weights,
  ``RLVR_MATMUL=plain`` or ``mkl``, the GPU paths) a batch can move a row's logits in the last bits (~1e-6); requests
  sent as one unit (``sample_queue``) are decoded apart and repeat there too (``tests/engine/sample/test_sampler.py``);
- the logprobs are always under the model's own distribution at temperature 1, before temperature, top-k or top-p
  reshape it for the draw: what the trainer computes for the same tokens, so ``kl_sample_train`` is ~0 at equal
  weights whatever the sampling parameters.

``sample_batch`` is the CPU engine's sampler (Llama-family decode steps through ``cpu.decode``, imported on this path
only; other models through Hugging Face's forward). The jobs, the token choice, the draw and the prefill are shared
with the GPU paths' sampler (``gpu/device_sampler.py``); the engine picks one of the two.

Not here: which requests are batched together and which sampler runs (the engine), vLLM
(``rlvr.distributed.vllm_sampler``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tinker import types

from rlvr.engine import cores
from rlvr.engine.device import model_device
from rlvr.engine.sample.kv_cache import GrowingCache, cache_kwargs, returned_cache
from rlvr.engine.sample.watch import Watch
from rlvr.errors import ConfigurationError, ContextFullError


@dataclass
class Sequence_:
    """One sampled continuation."""

    tokens: list[int]
    """Generated token ids, the stop token included when one ended it."""
    logprobs: list[float]
    """log p(token) under the model at temperature 1, one per token."""
    stop_reason: str
    """``"stop"`` (stop token or string) or ``"length"`` (max_tokens or the context limit)."""


@dataclass
class DecodeSettings:
    """SamplingParams checked and resolved against one model and prompt."""

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...]


def resolve_params(
    params: types.SamplingParams, prompt_len: int, context_len: int, eos_token_ids: Sequence[int],
    vocab_size: int | None = None,
) -> DecodeSettings:
    """Check ``params`` and resolve stops: ``stop=None`` stops at EOS; ``stop=[]`` disables every stop, EOS included;
    stop strings or ids stop there and at EOS. With ``vocab_size``, a stop id the model cannot emit is an error."""
    if not params.temperature >= 0 or math.isinf(params.temperature):  # NaN fails the comparison
        raise ConfigurationError(f"SamplingParams.temperature must be a finite number >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ConfigurationError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k == 0 or params.top_k < -1:
        raise ConfigurationError(f"SamplingParams.top_k must be -1 (no limit) or >= 1, got {params.top_k}")
    room = context_len - prompt_len
    if room <= 0:
        raise ContextFullError(f"the prompt has {prompt_len} tokens, which fills the model's context of "
                                 f"{context_len}; shorten it")
    if params.max_tokens is not None and params.max_tokens < 1:
        raise ConfigurationError(f"SamplingParams.max_tokens must be >= 1, got {params.max_tokens}")
    max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
    stop = params.stop
    ids: set[int] = set()
    strings: tuple[str, ...] = ()
    if stop is None:
        ids = set(eos_token_ids)
    elif isinstance(stop, str):
        ids, strings = set(eos_token_ids), (stop,)
    elif len(stop) > 0:
        ids = set(eos_token_ids)
        if all(isinstance(s, str) for s in stop):
            strings = tuple(stop)  # type: ignore[arg-type]
        elif all(isinstance(s, int) for s in stop):
            ids |= set(stop)  # type: ignore[arg-type]
            if vocab_size is not None and (never := [i for i in stop if not 0 <= i < vocab_size]):  # type: ignore[operator]
                raise ConfigurationError(f"SamplingParams.stop has token id {never[0]}, outside the vocabulary "
                                         f"[0, {vocab_size}): the model can never emit it, so it would never stop")
        else:
            raise ConfigurationError(f"SamplingParams.stop must be all strings or all token ids, got {stop!r}")
    if any(s == "" for s in strings):
        raise ConfigurationError("SamplingParams.stop contains an empty string, which would stop at once")
    return DecodeSettings(max_tokens, float(params.temperature), int(params.top_k), float(params.top_p),
                          frozenset(ids), strings)


def choose_tokens(logits: torch.Tensor, settings: DecodeSettings, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row of ``logits`` (R, V): greedy at temperature 0, else temperature, top-k, top-p."""
    if settings.temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / settings.temperature
    if 0 < settings.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, settings.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if settings.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
        sorted_probs = sorted_probs.masked_fill(before >= settings.top_p, 0.0)  # the first token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return draw(probs, generator)


DRAW_BLOCK = 256  # vocabulary entries per block of the two-level inverse-CDF draw


def draw(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row of ``weights`` (R, V), drawn with probability proportional to its weight (>= 0).

    Inverse-CDF sampling with one uniform per row. (``torch.multinomial`` draws an exponential per vocabulary entry,
    which was a quarter of a CPU decode step; a cumulative sum over the whole vocabulary is a slow sequential scan.)
    So it runs in two levels: block sums of ``DRAW_BLOCK`` entries pick a block, a cumulative sum inside that block
    picks the entry. An entry of weight 0 is never drawn.
    """
    return draw_uniform(weights, torch.rand((weights.shape[0], 1), generator=generator, dtype=weights.dtype))


def draw_uniform(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``draw`` with the row's uniform in [0, 1) given, (R, 1), on ``weights``' device."""
    rows, size = weights.shape
    if size % DRAW_BLOCK:
        weights = torch.nn.functional.pad(weights, (0, DRAW_BLOCK - size % DRAW_BLOCK))
    blocks = weights.view(rows, -1, DRAW_BLOCK)  # (R, nb, bs)
    block_sums = blocks.sum(-1)  # (R, nb)
    block_cdf = block_sums.cumsum(-1)
    total = block_cdf[:, -1:]
    below = torch.nextafter(total, torch.zeros_like(total))  # u must stay < total, whatever rounding does
    u = torch.minimum(uniforms * total, below)
    block = torch.searchsorted(block_cdf, u, right=True)  # (R, 1): the first block whose cumulative sum exceeds u
    u = u - (block_cdf.gather(-1, block) - block_sums.gather(-1, block))  # what is left inside that block
    inside = blocks.gather(1, block[:, :, None].expand(-1, -1, DRAW_BLOCK)).squeeze(1)  # (R, bs)
    inside_cdf = inside.cumsum(-1)
    inside_total = inside_cdf[:, -1:]
    u = torch.minimum(u.clamp(min=0), torch.nextafter(inside_total, torch.zeros_like(inside_total)))
    entry = torch.searchsorted(inside_cdf, u, right=True)
    return (block * DRAW_BLOCK + entry).squeeze(-1)


@dataclass
class SampleJob:
    """One sampling request: a prompt, how many continuations, and how to draw them."""

    prompt: list[int]
    """Prompt token ids."""
    num_samples: int
    """Continuations to draw; they share the prompt's KV cache."""
    settings: DecodeSettings
    """Resolved sampling parameters."""
    generator: torch.Generator
    """This request's random stream, so its draws do not depend on what else is in the batch."""
    watch: Watch | None = None
    """Who is handed its tokens as they are drawn, and may cancel it (``watch.py``); None: nobody."""

    @property
    def cancelled(self) -> bool:
        return self.watch is not None and self.watch.cancelled


@torch.inference_mode()
def prefill(model: torch.nn.Module, prompts: list[list[int]], pad_id: int, capacity: int = 0
            ) -> tuple[GrowingCache, torch.Tensor, torch.Tensor]:
    """Run ``prompts`` left-padded through the model's forward at once: their cache (U rows, ``capacity`` columns
    reserved), the attention mask (U, P) marking the padding, and each prompt's next-token logits (U, V) float32,
    all on the model's device."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (U, P) left-padded
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (U, P)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt):] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    padded = bool((attention_mask == 0).any())
    device = model_device(model)
    input_ids, attention_mask, position_ids = input_ids.to(device), attention_mask.to(device), position_ids.to(device)
    out = model(input_ids=input_ids, attention_mask=attention_mask if padded else None, position_ids=position_ids,
                **cache_kwargs(GrowingCache(capacity)), logits_to_keep=1)
    return returned_cache(out), attention_mask, out.logits[:, -1, :].float()


@torch.inference_mode()
def prefill_each(model: torch.nn.Module, prompts: list[list[int]]
                 ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Run each of ``prompts`` through the model's forward on its own, unpadded, so that its keys, values and
    logits are the same whatever other prompts come with it (a padded batch changes the attention's shapes, and so
    its rounding). Returns each layer's keys and values of all prompts, (U, G, P, D) each, left-padded with zeros
    to the widest; the attention mask (U, P), 0 on the padding; and each prompt's next-token logits (U, V) float32.
    For ``LlamaDecoder``, which attends to padding with exactly zero weight."""
    width = max(len(p) for p in prompts)
    device = model_device(model)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (U, P)
    layers: list[tuple[torch.Tensor, torch.Tensor]] = []
    logits = []
    for u, prompt in enumerate(prompts):
        attention_mask[u, width - len(prompt):] = 1
        out = model(input_ids=torch.tensor([prompt], device=device), **cache_kwargs(GrowingCache(1)),
                    logits_to_keep=1)
        for i, layer in enumerate(returned_cache(out).layers):
            if u == 0:
                shape = (len(prompts), layer.keys.shape[1], width, layer.keys.shape[3])
                layers.append((layer.keys.new_zeros(shape), layer.values.new_zeros(shape)))
            layers[i][0][u, :, width - len(prompt):] = layer.keys[0]
            layers[i][1][u, :, width - len(prompt):] = layer.values[0]
        logits.append(out.logits[0, -1, :].float())
    return layers, attention_mask.to(device), torch.stack(logits)


@torch.inference_mode()
def sample_batch(
    model: torch.nn.Module, jobs: list[SampleJob], decode: Callable[[list[int]], str], pad_id: int,
    *, fast: bool = True,
) -> list[list[Sequence_]]:
    """Sample every job's continuations in one batched decode (see the module docstring).

    Distinct prompts are prefilled once each (for ``LlamaDecoder`` one at a time, else left-padded together); each
    prompt's cache rows are then repeated for its samples. Every step decodes all live rows at once, and finished
    rows leave the batch. Decode steps run through ``LlamaDecoder`` when the model is one it supports
    (``fast=False`` forces Hugging Face's forward).
    """
    from rlvr.engine.cpu.decode import LlamaDecoder  # the CPU kernels load on the CPU path only

    distinct = list(dict.fromkeys(tuple(job.prompt) for job in jobs))
    llama = LlamaDecoder.build(model) if fast else None
    if llama is not None:
        prompts, attention_mask, last_logits = prefill_each(model, [list(p) for p in distinct])
    else:
        cache, attention_mask, last_logits = prefill(model, [list(p) for p in distinct], pad_id)

    # One row per sample: (job, sample) pairs, rows of a job contiguous.
    row_job = [j for j, job in enumerate(jobs) for _ in range(job.num_samples)]
    row_sample = [s for job in jobs for s in range(job.num_samples)]
    prompt_row = torch.tensor([distinct.index(tuple(jobs[j].prompt)) for j in row_job])
    logits = last_logits[prompt_row]  # (R, V)
    positions = attention_mask.sum(-1)[prompt_row]  # (R,) position of each row's next token
    capacity = attention_mask.shape[1] + max(job.settings.max_tokens for job in jobs)
    decoder = llama or _HFDecoder(model)
    decoder.start(prompts if llama is not None else cache, attention_mask, prompt_row, capacity)

    results = [[Sequence_([], [], "length") for _ in range(job.num_samples)] for job in jobs]
    while row_job:
        cores.tick()  # a long decode gives up threads to another rlvr process that starts computing
        chosen, chosen_logprobs = _choose(logits, row_job, jobs)
        keep = []
        watched: dict[int, list[tuple[int, int, float]]] = {}  # job -> what its rows drew in this step
        for row, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs.tolist(), strict=True)):
            job = jobs[row_job[row]]
            seq = results[row_job[row]][row_sample[row]]
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            if job.watch is not None:
                watched.setdefault(row_job[row], []).append((row_sample[row], token, logprob))
            if token in job.settings.stop_token_ids or _ends_with_stop(decode, seq.tokens, job.settings.stop_strings):
                seq.stop_reason = "stop"
            elif len(seq.tokens) < job.settings.max_tokens:
                keep.append(row)
        for j, drawn in watched.items():
            jobs[j].watch.step(drawn)  # type: ignore[union-attr]
        keep = [row for row in keep if not jobs[row_job[row]].cancelled]  # a cancelled request's rows leave now
        if not keep:
            break
        if len(keep) < len(row_job):
            index = torch.tensor(keep)
            decoder.keep(index)
            chosen, positions = chosen[index], positions[index]
            row_job = [row_job[r] for r in keep]
            row_sample = [row_sample[r] for r in keep]
        logits = decoder.step(chosen, positions)
        positions = positions + 1
    return results


def _choose(logits: torch.Tensor, row_job: list[int], jobs: list[SampleJob]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token, drawn with its job's settings and generator, and its logprob at temperature 1.

    Greedy and plain temperature-1 rows (the usual RL case) draw from the temperature-1 softmax itself and take
    the chosen token's logprob as its log there: a drawn or greedy token's probability is far above float32's
    underflow, so this equals log_softmax's value to rounding, one pass over the vocabulary cheaper. Other rows
    take logit - logsumexp. Each job's logprobs are computed on its own rows (an elementwise log may round the
    tail of a vector otherwise than its body, and where a row falls must not depend on the other jobs).
    """
    probs = torch.softmax(logits, dim=-1)  # (R, V)
    chosen = torch.empty(len(row_job), dtype=torch.long)  # (R,)
    logprobs = torch.empty(len(row_job))  # (R,)
    start = 0
    while start < len(row_job):  # each job draws its contiguous rows with its own settings and generator
        end = start
        while end < len(row_job) and row_job[end] == row_job[start]:
            end += 1
        job = jobs[row_job[start]]
        settings = job.settings
        plain = settings.temperature == 1 and settings.top_k < 0 and settings.top_p == 1
        if plain:
            chosen[start:end] = draw(probs[start:end], job.generator)
        else:
            chosen[start:end] = choose_tokens(logits[start:end], settings, job.generator)
        picked = chosen[start:end, None]
        if plain or settings.temperature == 0:
            logprobs[start:end] = probs[start:end].gather(-1, picked).squeeze(-1).log()
        else:
            logprobs[start:end] = (logits[start:end].gather(-1, picked).squeeze(-1)
                                   - torch.logsumexp(logits[start:end], dim=-1))
        start = end
    return chosen, logprobs


class _HFDecoder:
    """Decode steps through the model's own forward and a ``GrowingCache``: any causal LM transformers loads."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache: GrowingCache | None = None
        self.attention_mask = torch.empty(0)
        self.padded = False  # whether any prompt is left-padded (else no mask is passed)

    def start(self, cache: GrowingCache, attention_mask: torch.Tensor, rows: torch.Tensor, capacity: int) -> None:
        self.cache = cache
        cache.batch_select_indices(rows)
        self.attention_mask = attention_mask[rows]  # (R, P)
        self.padded = bool((attention_mask == 0).any())

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention_mask = self.attention_mask[rows]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones((len(tokens), 1))], -1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.attention_mask if self.padded else None,
                         position_ids=positions[:, None], **cache_kwargs(self.cache))
        return out.logits[:, -1, :].float()


def _ends_with_stop(decode: Callable[[list[int]], str], tokens: list[int], stops: tuple[str, ...]) -> bool:
    """Whether the text decoded so far contains a stop string (it cannot have before: the row would have stopped)."""
    if not stops:
        return False
    text = decode(tokens)
    return any(stop in text for stop in stops)
