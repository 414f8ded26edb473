"""Autoregressive sampling with a KV cache, returning the logprob of every chosen token.

One request is one prompt times ``num_samples``: the prompt is prefilled once and its KV cache repeated for the
group (the samples share the prefix), then all live rows decode together, one token per step. Rows that finish
(a stop token, a stop string, ``max_tokens``) leave the batch, so no compute is spent on them.

Which distribution the logprobs are under: always the model's own next-token distribution at temperature 1,
before temperature, top-k or top-p reshape it for the draw. That is exactly what the trainer computes for the same
tokens, so at equal weights ``kl_sample_train`` is ~0 whatever the sampling parameters; the sampling distribution
itself differs from it whenever temperature != 1 or top-k/top-p truncate.

Not here: batching several prompts into one decode (the fast-sampling issue), vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tinker import types

from rlvr.errors import ConfigurationError


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
    params: types.SamplingParams, prompt_len: int, context_len: int, eos_token_ids: Sequence[int]
) -> DecodeSettings:
    """Check ``params`` and resolve stops: ``stop=None`` stops at EOS; ``stop=[]`` disables every stop, EOS included;
    stop strings or ids stop there and at EOS."""
    if params.temperature < 0:
        raise ConfigurationError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ConfigurationError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k == 0 or params.top_k < -1:
        raise ConfigurationError(f"SamplingParams.top_k must be -1 (no limit) or >= 1, got {params.top_k}")
    room = context_len - prompt_len
    if room <= 0:
        raise ConfigurationError(f"the prompt has {prompt_len} tokens, which fills the model's context of "
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
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def sample(
    model: torch.nn.Module,
    prompt: list[int],
    num_samples: int,
    settings: DecodeSettings,
    generator: torch.Generator,
    decode: Callable[[list[int]], str],
) -> list[Sequence_]:
    """Sample ``num_samples`` continuations of ``prompt`` from ``model`` (see the module docstring)."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(num_samples)
    logits = out.logits[:, -1, :].float().expand(num_samples, -1)  # (R, V)
    live = list(range(num_samples))  # row r of the batch is sample live[r]
    tokens: list[list[int]] = [[] for _ in range(num_samples)]
    logprobs: list[list[float]] = [[] for _ in range(num_samples)]
    reasons: list[str] = ["length"] * num_samples
    while live:
        chosen = choose_tokens(logits, settings, generator)  # (R,)
        chosen_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        keep = []
        for row, (s, token, logprob) in enumerate(zip(live, chosen.tolist(), chosen_logprobs.tolist(), strict=True)):
            tokens[s].append(token)
            logprobs[s].append(logprob)
            if token in settings.stop_token_ids or _ends_with_stop(decode, tokens[s], settings.stop_strings):
                reasons[s] = "stop"
            elif len(tokens[s]) < settings.max_tokens:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(live):
            index = torch.tensor(keep)
            cache.batch_select_indices(index)
            chosen = chosen[index]
            live = [live[r] for r in keep]
        out = model(input_ids=chosen[:, None], past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :].float()
    return [Sequence_(tokens[s], logprobs[s], reasons[s]) for s in range(num_samples)]


def _ends_with_stop(decode: Callable[[list[int]], str], tokens: list[int], stops: tuple[str, ...]) -> bool:
    """Whether the text decoded so far contains a stop string (it cannot have before: the row would have stopped)."""
    if not stops:
        return False
    text = decode(tokens)
    return any(stop in text for stop in stops)
