"""The optional scores a sampling request can ask for besides its samples, from the model's next-token log-softmax.

What is covered (Tinker's ``SamplingClient.sample`` arguments and the ``SampleResponse`` fields they fill):

- ``prompt_logprobs_last_n``: only the last N prompt positions of ``prompt_logprobs`` (and of the top-k rows) are
  scored, earlier ones are NaN / None;
- ``topk_prompt_logprobs``: the k most likely tokens and their logprobs at every prompt position (row 0, which has
  no context, is the sentinel ``TopkLogprobs`` uses: token 0, logprob -99999);
- ``target_prompt_logprobs``: the logprobs of chosen token ids, a (len(prompt) - 1, K) int64 tensor, dense or
  sparse CSR, ``-1`` meaning "nothing here" (answered with 0.0), answered in the same layout;
- ``prompt_alt_tokens_k``: k draws with replacement at the request's temperature from the next-token distribution at
  every prompt position after the first, with their logprobs;
- ``topk_sample_logprobs``: the k most likely tokens at every sampled position;
- ``PromptTopk`` (rlvr's own, ``SamplingClient.compute_topk_logprobs``): every prompt token's logprob and the k most
  likely tokens at its position, all from the trainer's forward, so the two agree to the bit (an OpenAI ``echo``).

Every logprob is under the model at temperature 1, as the sampler's own logprobs are (``sampler.py``); the prompt
distribution comes from one plain forward over the prompt, the sampled positions' from one forward over prompt and
sample. Not here: the decode (``sampler.py``), batching requests (``sample_queue.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tinker import types
from tinker.types.prompt_alt_tokens import PromptAltTokens
from tinker.types.topk_logprobs import TopkLogprobs

from rlvr.errors import SamplingError

SENTINEL_LOGPROB = -99999.0  # tinker's TopkLogprobs marks an empty row with token 0 and this logprob


@dataclass(frozen=True)
class ScoreRequest:
    """What a sampling request asks for besides its samples (Tinker's ``sample`` keyword arguments)."""

    prompt_logprobs: bool = False
    """``include_prompt_logprobs``: log p(prompt_i | prompt_<i) for every prompt token, None at the first."""
    topk_prompt: int = 0
    """``topk_prompt_logprobs``: top-k tokens per prompt position (0 = none)."""
    topk_sample: int = 0
    """``topk_sample_logprobs``: top-k tokens per sampled position (0 = none)."""
    target_prompt: types.TensorData | None = None
    """``target_prompt_logprobs``: (len(prompt) - 1, K) int64 token ids to score, -1 for none."""
    alt_tokens_k: int = 0
    """``prompt_alt_tokens_k``: draws per prompt position after the first (0 = none)."""
    last_n: int | None = None
    """``prompt_logprobs_last_n``: score only the last N prompt positions (None = all)."""

    def check(self, prompt_len: int, vocab_size: int) -> None:
        """Raise SamplingError naming the argument, its value and the fix."""
        for name, value in (("topk_prompt_logprobs", self.topk_prompt), ("topk_sample_logprobs", self.topk_sample),
                            ("prompt_alt_tokens_k", self.alt_tokens_k)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= vocab_size:
                raise SamplingError(f"{name}={value!r} must be an integer in [0, {vocab_size}] (0 = off)")
        if self.last_n is not None:
            if not self.prompt_logprobs:
                raise SamplingError(f"prompt_logprobs_last_n={self.last_n} needs include_prompt_logprobs=True")
            if not isinstance(self.last_n, int) or not 1 <= self.last_n <= prompt_len - 1:
                raise SamplingError(f"prompt_logprobs_last_n={self.last_n!r} must be between 1 and len(prompt) - 1 = "
                                    f"{prompt_len - 1}, or None for the whole prompt")
        if self.target_prompt is not None:
            ids = target_ids(self.target_prompt)
            if ids.dim() != 2 or ids.shape[0] != prompt_len - 1:
                raise SamplingError(f"target_prompt_logprobs has shape {tuple(ids.shape)}; it must be "
                                    f"(len(prompt) - 1, K) = ({prompt_len - 1}, K)")
            bad = ids[(ids < -1) | (ids >= vocab_size)]
            if bad.numel():
                raise SamplingError(f"target_prompt_logprobs has token id {int(bad[0])} outside the vocabulary "
                                    f"[0, {vocab_size}); use -1 for cells that need nothing")
            if not (ids >= 0).any():
                raise SamplingError("target_prompt_logprobs names no token id (every cell is -1); name at least one")

    @property
    def needs_prompt_distribution(self) -> bool:
        return bool(self.topk_prompt or self.target_prompt is not None or self.alt_tokens_k)


def target_ids(tensor: types.TensorData) -> torch.Tensor:
    """The requested ids as a dense int64 tensor, -1 in unlisted sparse cells."""
    return tensor.to_torch(pad_value=-1).to(torch.int64)


@torch.inference_mode()
def next_token_log_softmax(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:  # (T - 1, V)
    """Row i: log p(. | tokens_<=i) over the whole vocabulary at temperature 1, float32 on the CPU."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([tokens[:-1]], device=device)).logits[0]  # (T - 1, V)
    return logits.float().log_softmax(-1).cpu()


@dataclass(frozen=True)
class PromptTopk:
    """A prompt's logprobs and each position's most likely tokens, from one forward (``compute_topk_logprobs``)."""

    logprobs: list[float | None]
    """log p(prompt_i | prompt_<i), None at position 0: the numbers ``compute_logprobs`` gives."""
    topk: list[list[tuple[int, float]] | None]
    """At each position i >= 1, the k most likely (token id, logprob) of p(. | prompt_<i), most likely first; None at
    position 0, empty rows when k = 0. A row's logprob of prompt_i, when it holds it, equals ``logprobs[i]``."""


CANDIDATE_ROWS = 256
"""Positions whose logits ``topk_candidates`` holds at once (256 rows of a 151,936-entry vocabulary: 156 MB)."""


@torch.inference_mode()
def topk_candidates(model: torch.nn.Module, tokens: list[int], k: int) -> torch.Tensor:  # (T - 1, k)
    """Row i: the ids of the k largest logits after ``tokens[:i + 1]``, by a plain forward through the decoder and
    output layer, ``CANDIDATE_ROWS`` positions' logits at a time. Which tokens are ranked, not their logprobs: the
    engine scores them with the trainer's forward."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    device = next(model.parameters()).device
    hidden = causal_lm.get_decoder()(input_ids=torch.tensor([tokens[:-1]], device=device)).last_hidden_state[0]
    head = causal_lm.get_output_embeddings()
    return torch.cat([head(rows).topk(k, dim=-1).indices.cpu() for rows in hidden.split(CANDIDATE_ROWS)])


def topk_rows(log_probs: torch.Tensor, k: int, skip: int) -> TopkLogprobs:
    """Top-k of every row of ``log_probs`` (n, V), preceded by ``skip`` sentinel rows."""
    values, ids = log_probs.topk(k, dim=-1)  # (n, k) each, most likely first
    token_ids = np.zeros((skip + len(ids), k), dtype=np.int32)
    logprobs = np.full((skip + len(ids), k), SENTINEL_LOGPROB, dtype=np.float32)
    token_ids[skip:], logprobs[skip:] = ids.numpy(), values.numpy()
    return TopkLogprobs(token_ids=token_ids, logprobs=logprobs)


def prompt_fields(model: torch.nn.Module, prompt: list[int], request: ScoreRequest, temperature: float,
                  generator: torch.Generator) -> dict:
    """``SampleResponse`` keyword arguments for the prompt-side scores ``request`` asks for (not prompt_logprobs)."""
    if not request.needs_prompt_distribution:
        return {}
    dist = next_token_log_softmax(model, prompt)  # (T - 1, V): row i scores prompt token i + 1
    fields: dict = {}
    if request.topk_prompt:
        first = len(prompt) - request.last_n if request.last_n else 1  # first scored prompt position
        fields["topk_prompt_logprobs_np"] = topk_rows(dist[first - 1:], request.topk_prompt, skip=first)
    if request.target_prompt is not None:
        fields["target_prompt_logprobs"] = _target_logprobs(dist, request.target_prompt)
    if request.alt_tokens_k:
        if temperature == 0:
            draws = dist.argmax(-1, keepdim=True).expand(-1, request.alt_tokens_k)  # (T - 1, k)
        else:
            probs = (dist / temperature).softmax(-1)
            draws = torch.multinomial(probs, request.alt_tokens_k, replacement=True, generator=generator)
        fields["prompt_alt_tokens"] = PromptAltTokens(
            tokens=types.TensorData.from_torch(draws.to(torch.int64)),
            logprobs=types.TensorData.from_torch(dist.gather(-1, draws)))
    return fields


def _target_logprobs(dist: torch.Tensor, request: types.TensorData) -> types.TensorData:
    ids = target_ids(request)  # (T - 1, K)
    values = torch.where(ids >= 0, dist.gather(-1, ids.clamp(min=0)), torch.zeros(()))  # (T - 1, K)
    if request.sparse_crow_indices is None:
        return types.TensorData.from_torch(values)
    rows = torch.repeat_interleave(torch.arange(len(ids)), torch.tensor(request.sparse_crow_indices).diff())
    listed = values[rows, torch.tensor(request.sparse_col_indices, dtype=torch.int64)]
    return types.TensorData(data=listed.numpy(), dtype="float32", shape=list(ids.shape),
                            sparse_crow_indices=list(request.sparse_crow_indices),
                            sparse_col_indices=list(request.sparse_col_indices))


def sample_topk(model: torch.nn.Module, prompt: list[int], tokens: list[int], k: int) -> TopkLogprobs:
    """Top-k logprobs at each of a sample's positions: row j is the distribution ``tokens[j]`` was drawn from."""
    if not tokens:
        return TopkLogprobs(token_ids=np.zeros((0, k), dtype=np.int32), logprobs=np.zeros((0, k), np.float32))
    dist = next_token_log_softmax(model, prompt + tokens)  # (P + n - 1, V)
    return topk_rows(dist[len(prompt) - 1:], k, skip=0)


def mask_before_last_n(prompt_logprobs: np.ndarray, last_n: int | None) -> np.ndarray:
    """``prompt_logprobs`` (T,) with NaN (not scored) before the last ``last_n`` positions."""
    if last_n is None:
        return prompt_logprobs
    out = prompt_logprobs.copy()
    out[:len(out) - last_n] = np.nan
    return out
