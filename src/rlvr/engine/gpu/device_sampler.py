"""The sampler of the GPU paths: batched decoding whose state stays on the device, looked at from the host every few
steps rather than at every token.

Contract: ``sampler.py``'s (the same ``SampleJob`` in, the same ``Sequence_`` out, one logprob per token under the
model at temperature 1, so at equal weights they equal the trainer's). Each distinct prompt is prefilled once, its
cache rows repeated for its samples, then all rows step together through the model's own forward, LoRA unmerged, keys
and values in a ``GrowingCache`` reserved for prompt + ``max_tokens`` columns up front. What differs from the CPU:

- tokens, logprobs, stop ids and ``max_tokens`` are checked on the device; the host looks every
  ``GpuPaths.sync_every`` steps (stop strings, finished rows leaving the batch, a watched request's tokens handed
  out, a cancelled one's rows ended);
- random numbers come from a counter: row r's uniform at step t hashes (its request's seed, r's sample index, t), so
  a seeded request draws the same numbers whatever is batched with it (other tokens than on the CPU sampler, whose
  draws come from ``torch.Generator``); the token is chosen by ``sampler.choose_tokens``'s rule, vectorised;
- with ``GpuPaths.graphs`` every step runs over fixed buffers (``_FixedStep``), captured once as a CUDA graph and
  replayed (captured again when finished rows leave; a failed capture runs eagerly, with a warning);
- with ``GpuPaths.decode_step`` ("triton" or "reference") rows decode through ``gpu/decode.py``'s step instead of
  the model's forward (``_GraphedDecoder``); not the default until it is measured on a GPU.

Why and how each part works: ``docs/performance.md`` ("The GPU sampler").

Not here: the CPU's sampler and decoder (``sampler.py``, ``decode.py``); which requests batch together (the engine).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from rlvr.engine.device import GpuPaths, model_device
from rlvr.engine.gpu import kernels
from rlvr.engine.gpu.decode import GpuDecoder
from rlvr.engine.sample.kv_cache import GrowingCache, cache_kwargs
from rlvr.engine.sample.sampler import SampleJob, Sequence_, draw_uniform, prefill
from rlvr.errors import ConfigurationError

COMPACT_FRACTION = 0.25  # finished rows leave the batch (at a look from the host) once this fraction of it has
_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 ``x`` in [0, 2**32) and a constant ``c`` < 2**32, without int64 overflow (the
    product is taken in 16-bit halves of ``c``)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser: a bijection of [0, 2**32) whose output bits each depend on every input bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniforms(seed: torch.Tensor, sample: torch.Tensor, step: int) -> torch.Tensor:
    """One uniform in [0, 1) per row, float32 (R,): a hash of the row's ``seed`` (int64, any value), ``sample``
    (its index in its request) and ``step``; the same arguments give the same number on every device."""
    low, high = seed & _MASK32, (seed >> 32) & _MASK32
    h = _mix32(torch.full_like(sample, step & _MASK32) ^ 0x9E3779B9)
    h = _mix32(h ^ (sample & _MASK32) ^ 0x85EBCA77)
    h = _mix32(h ^ high ^ 0xC2B2AE3D)
    h = _mix32(h ^ low ^ 0x27D4EB2F)
    return (h >> 8).to(torch.float32) * 2.0**-24  # 24 bits: every value exact in float32, and below 1


@dataclass
class _Rows:
    """The live rows' state, (L,) each (``stop_ids``: (L, S), padded with -1), on the device."""

    index: torch.Tensor  # the row's index into the batch's results
    seed: torch.Tensor
    sample: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor  # 0: no limit
    top_p: torch.Tensor  # inf: no limit
    max_tokens: torch.Tensor
    stop_ids: torch.Tensor
    done: torch.Tensor

    def select(self, keep: torch.Tensor) -> _Rows:
        return _Rows(*(getattr(self, f.name)[keep] for f in fields(self)))


def choose(logits: torch.Tensor, rows: _Rows, u: torch.Tensor, top_k_max: int, top_p_any: bool
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token from ``logits`` (L, V) float32 with its own settings and uniform ``u`` (L,), and its logprob
    at temperature 1: ``sampler.choose_tokens``'s rule for every row at once. ``top_k_max``: the largest top-k
    limit of any row (0: none has one); ``top_p_any``: whether any row has a top-p limit."""
    greedy = rows.temperature == 0
    scaled = logits / torch.where(greedy, 1.0, rows.temperature)[:, None]
    if top_k_max:
        kth = torch.topk(scaled, top_k_max, dim=-1).values.gather(-1, (rows.top_k - 1).clamp(min=0)[:, None])
        kth = torch.where(rows.top_k[:, None] > 0, kth, float("-inf"))
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p_any:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
        sorted_probs = sorted_probs.masked_fill(before >= rows.top_p[:, None], 0.0)  # the first token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    chosen = torch.where(greedy, logits.argmax(dim=-1), draw_uniform(probs, u[:, None]))
    logprobs = logits.gather(-1, chosen[:, None]).squeeze(-1) - logits.logsumexp(dim=-1)
    return chosen, logprobs


def _rows(jobs: list[SampleJob], row_job: list[int], row_sample: list[int], vocab: int, device: torch.device
          ) -> _Rows:
    settings = [jobs[j].settings for j in row_job]
    width = max(1, max(len(s.stop_token_ids) for s in settings))
    stop_ids = torch.full((len(row_job), width), -1, dtype=torch.long)
    for r, s in enumerate(settings):
        stop_ids[r, :len(s.stop_token_ids)] = torch.tensor(sorted(s.stop_token_ids), dtype=torch.long)
    state = _Rows(
        index=torch.arange(len(row_job)),
        seed=torch.tensor([_signed(jobs[j].generator.initial_seed()) for j in row_job], dtype=torch.long),
        sample=torch.tensor(row_sample, dtype=torch.long),
        temperature=torch.tensor([s.temperature for s in settings], dtype=torch.float32),
        top_k=torch.tensor([s.top_k if 0 < s.top_k < vocab else 0 for s in settings], dtype=torch.long),
        top_p=torch.tensor([s.top_p if s.top_p < 1 else float("inf") for s in settings], dtype=torch.float32),
        max_tokens=torch.tensor([s.max_tokens for s in settings], dtype=torch.long),
        stop_ids=stop_ids,
        done=torch.zeros(len(row_job), dtype=torch.bool),
    )
    return _Rows(*(getattr(state, f.name).to(device) for f in fields(state)))


def _signed(seed: int) -> int:
    """A generator's seed (0 to 2**64 - 1) as the int64 of the same bits."""
    return seed - 2**64 if seed >= 2**63 else seed


@torch.inference_mode()
def sample_batch(
    model: torch.nn.Module, jobs: list[SampleJob], decode: Callable[[list[int]], str], pad_id: int, paths: GpuPaths,
) -> list[list[Sequence_]]:
    """Sample every job's continuations in one batched decode on the model's device (see the module docstring)."""
    device = model_device(model)
    distinct = list(dict.fromkeys(tuple(job.prompt) for job in jobs))
    row_job = [j for j, job in enumerate(jobs) for _ in range(job.num_samples)]
    row_sample = [s for job in jobs for s in range(job.num_samples)]
    longest = max(job.settings.max_tokens for job in jobs)
    width = max(len(p) for p in distinct)
    decoder = _own_decoder(model, paths.decode_step, device)
    # the prompts' cache, reserved for the whole decode unless rlvr's decode step takes it over (into its own buffers)
    cache, prompt_mask, last_logits = prefill(model, [list(p) for p in distinct], pad_id,
                                              width + longest if decoder is None else 0)
    prompt_row = torch.tensor([distinct.index(tuple(jobs[j].prompt)) for j in row_job], device=device)
    cache.batch_select_indices(prompt_row)  # each prompt's keys and values, once per sample
    if decoder is not None:  # it holds the keys and values from here on
        decoder.start([(layer.keys, layer.values) for layer in cache.layers], prompt_mask[prompt_row], width + longest)
        cache = None
    logits = last_logits[prompt_row]  # (L, V)
    vocab = logits.shape[-1]
    padded = bool((prompt_mask == 0).any())
    mask = torch.zeros((len(row_job), width + longest), dtype=torch.long, device=device)  # (L, P + T)
    mask[:, :width] = prompt_mask[prompt_row]
    positions = prompt_mask.sum(-1)[prompt_row]  # (L,) each row's next position
    rows = _rows(jobs, row_job, row_sample, vocab, device)
    top_k_max = max((s.top_k for s in (job.settings for job in jobs) if 0 < s.top_k < vocab), default=0)
    top_p_any = any(job.settings.top_p < 1 for job in jobs)
    strings = [bool(jobs[j].settings.stop_strings) for j in row_job]
    watched = any(job.watch is not None for job in jobs)
    handed = [0] * len(row_job)  # by result row: tokens handed to its request's watch so far

    capture = device.type == "cuda" and paths.graphs
    own = _GraphedDecoder(decoder, len(row_job), device, capture) if decoder is not None else None
    fixed = _FixedStep(model, cache, mask.bool(), capture=capture) if paths.graphs and decoder is None else None
    tokens = torch.zeros((len(row_job), longest), dtype=torch.long, device=device)  # (R, T): by result row
    logprobs = torch.zeros((len(row_job), longest), dtype=torch.float32, device=device)
    lengths = torch.zeros(len(row_job), dtype=torch.long, device=device)
    stopped = torch.zeros(len(row_job), dtype=torch.bool, device=device)
    looked = 0  # steps whose tokens the host has matched against stop strings
    for step in range(longest):
        chosen, chosen_logprobs = choose(logits, rows, uniforms(rows.seed, rows.sample, step), top_k_max, top_p_any)
        tokens[rows.index, step] = chosen
        logprobs[rows.index, step] = chosen_logprobs
        hit = (chosen[:, None] == rows.stop_ids).any(-1)
        ending = ~rows.done & (hit | (step + 1 >= rows.max_tokens))
        lengths[rows.index] = torch.where(ending, step + 1, lengths[rows.index])
        stopped[rows.index] |= ending & hit
        rows.done |= ending
        if (step + 1) % paths.sync_every == 0 or step + 1 == longest:  # the host looks
            if any(strings):
                _match_stop_strings(rows, tokens, lengths, stopped, strings, decode, looked, step + 1, jobs, row_job)
            if watched:
                _hand_out(rows, tokens, logprobs, lengths, handed, step + 1, jobs, row_job, row_sample)
            looked = step + 1
            done = rows.done.cpu()
            if bool(done.all()):
                break
            if int(done.sum()) >= COMPACT_FRACTION * len(done):
                keep = (~done).nonzero().squeeze(-1).to(device)
                rows, chosen, positions, mask = rows.select(keep), chosen[keep], positions[keep], mask[keep]
                if own is not None:
                    own = own.for_rows(keep)
                else:
                    cache.batch_select_indices(keep)
                if fixed is not None:
                    fixed = fixed.for_rows(keep)
        if own is not None:
            logits = own(chosen, positions)
        elif fixed is not None:
            logits = fixed(chosen, positions, width + step)
        else:
            mask[:, width + step] = 1
            out = model(input_ids=chosen[:, None], attention_mask=mask[:, :width + step + 1] if padded else None,
                        position_ids=positions[:, None], **cache_kwargs(cache))
            logits = out.logits[:, -1, :].float()
        positions = positions + 1

    tokens, logprobs, lengths, stopped = tokens.cpu(), logprobs.cpu(), lengths.tolist(), stopped.tolist()
    results: list[list[Sequence_]] = [[] for _ in jobs]
    for r, j in enumerate(row_job):
        n = lengths[r]
        results[j].append(Sequence_(tokens[r, :n].tolist(), logprobs[r, :n].tolist(), "stop" if stopped[r] else
                                    "length"))
    return results


def _own_decoder(model: torch.nn.Module, decode_step: str, device: torch.device) -> GpuDecoder | None:
    """rlvr's decode step over ``model`` (on ``device``) on the kernels ``decode_step`` names
    (``GpuPaths.decode_step``), or None for the model's own forward ("hf", or a model that step does not support:
    with a warning)."""
    if decode_step == "hf":
        return None
    chosen = kernels.REFERENCE if decode_step == "reference" else kernels.triton_kernels()  # this imports triton
    if decode_step == "triton" and device.type != "cuda" and not kernels.triton_interpreted():
        raise ConfigurationError(f"GpuPaths.decode_step='triton' on {device.type}: Triton's kernels compile for CUDA;"
                                 " use decode_step='reference' here (or TRITON_INTERPRET=1, set before triton is "
                                 "imported, for its slow interpreter)")
    decoder = GpuDecoder.build(model, chosen)
    if decoder is None:
        warnings.warn(f"GpuPaths.decode_step={decode_step!r} does not support this model ({type(model).__name__}: "
                      "another architecture, a LoRA variant or head size); it decodes through the model's forward",
                      RuntimeWarning, stacklevel=3)
    return decoder


class _FixedStep:
    """One decode step of ``model`` over fixed buffers, so that every step runs the same kernels on the same memory:
    the rows' token ids and positions, a (L, 1, 1, C) mask over all C reserved columns of ``cache`` (True: attended;
    transformers takes a 4D mask as it is), and the column the step writes, as a tensor the cache's layers write at
    (``fix_columns``). With ``capture`` (CUDA), the step's first call runs it once on a side stream (which also
    gives that step's logits) and captures it as a CUDA graph, which the later calls replay."""

    def __init__(self, model: torch.nn.Module, cache: GrowingCache, mask: torch.Tensor, capture: bool) -> None:
        rows, columns = mask.shape
        device = mask.device
        self.model, self.cache, self.capture = model, cache, capture
        self.mask = mask  # (L, C) bool: the prompt's columns (not its padding) and those decoded so far
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        fix_columns(cache, self.column, columns)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def for_rows(self, keep: torch.Tensor) -> _FixedStep:
        """The step for rows ``keep`` only (the cache's rows were selected already): new buffers, a new capture."""
        self.graph = self.logits = None  # frees the old graph's memory before the new one takes its own
        return _FixedStep(self.model, self.cache, self.mask[keep], self.capture)

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.ids, attention_mask=self.mask[:, None, None, :], position_ids=self.positions,
                         **cache_kwargs(self.cache))
        return out.logits[:, -1, :].float()

    def __call__(self, chosen: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """The next logits (L, V) float32 of rows that drew ``chosen`` (L,) at ``positions`` (L,), written to
        ``column`` of the cache. On a replay the result is the graph's own buffer: read it before the next call."""
        self.ids.copy_(chosen[:, None])
        self.positions.copy_(positions[:, None])
        self.column.fill_(column)
        self.mask[:, column] = True
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if not self.capture:
            return self._forward()
        return self._capture()

    def _capture(self) -> torch.Tensor:
        logits, self.graph, self.logits = _capture_step(self._forward)
        self.capture = self.graph is not None
        return logits


class _GraphedDecoder:
    """rlvr's decode step (``decode.GpuDecoder``) over fixed token and position buffers for ``rows`` rows; with
    ``capture`` (CUDA), its first call runs the step once (which gives that step's logits) and captures it as a CUDA
    graph, which the later calls replay. The decoder's lengths and caches are its own fixed buffers, advanced in place
    by every step, until ``keep`` lays them out anew: then ``for_rows`` builds the next one."""

    def __init__(self, decoder: GpuDecoder, rows: int, device: torch.device, capture: bool) -> None:
        self.decoder, self.capture = decoder, capture
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def for_rows(self, keep: torch.Tensor) -> _GraphedDecoder:
        """The step for rows ``keep`` only (the decoder keeps them here): new buffers, a new capture."""
        self.graph = self.logits = None  # frees the old graph's memory before the new one takes its own
        self.decoder.keep(keep)
        return _GraphedDecoder(self.decoder, len(keep), self.tokens.device, self.capture)

    def _forward(self) -> torch.Tensor:
        return self.decoder.step(self.tokens, self.positions)

    def __call__(self, chosen: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The next logits (L, V) float32 of rows that drew ``chosen`` at ``positions``; on a replay the graph's own
        buffer: read it before the next call."""
        self.tokens.copy_(chosen)
        self.positions.copy_(positions)
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if not self.capture:
            return self._forward()
        logits, self.graph, self.logits = _capture_step(self._forward)
        self.capture = self.graph is not None
        return logits


def _capture_step(forward: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.cuda.CUDAGraph | None,
                                                                 torch.Tensor | None]:
    """Run ``forward`` (a decode step over fixed buffers) once, on a side stream, then capture it as a CUDA graph
    without running it again: this step's logits, the graph and the logits buffer its replays fill. A step that cannot
    be captured gives (logits, None, None), with a warning: it runs eagerly from then on."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up: lazy initialisations happen outside the capture
        logits = forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):  # recorded, not run: the cache already holds this step's column
            replayed = forward()
    except Exception as exc:  # an op that cannot be captured: the same fixed step, eagerly, from now on
        warnings.warn(f"rlvr's GPU sampler could not capture its decode step as a CUDA graph ({type(exc).__name__}:"
                      f" {str(exc)[:200]}); it decodes without graphs, more slowly", RuntimeWarning, stacklevel=3)
        torch.cuda.synchronize()
        return logits, None, None
    global captures
    captures += 1
    return logits, graph, replayed


captures = 0
"""CUDA graphs this process has captured for decode steps (the GPU tests read it)."""


def fix_columns(cache: GrowingCache, column: torch.Tensor, columns: int) -> None:
    """Make each layer of ``cache`` (reserved for at least ``columns`` columns) write a step's keys and values at
    ``column`` (a (1,) tensor) and hand attention all ``columns`` of its buffers, the unwritten ones masked out."""
    for layer in cache.layers:
        layer.fix(column, columns)


def _hand_out(rows: _Rows, tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, handed: list[int],
              steps: int, jobs: list[SampleJob], row_job: list[int], row_sample: list[int]) -> None:
    """At a look: hand each watched request the tokens its live rows drew since the last look (up to where a row
    ended), then end the rows of cancelled requests where they are."""
    index, done, ended_at = rows.index.tolist(), rows.done.tolist(), lengths[rows.index].tolist()
    ends = {r: ended_at[i] if done[i] else steps for i, r in enumerate(index) if jobs[row_job[r]].watch is not None}
    drawn: dict[int, list[tuple[int, int, float]]] = {}
    for r, end in ends.items():
        if end > handed[r]:
            row_tokens, row_logprobs = tokens[r, handed[r]:end].tolist(), logprobs[r, handed[r]:end].tolist()
            drawn.setdefault(row_job[r], []).extend((row_sample[r], t, lp)
                                                   for t, lp in zip(row_tokens, row_logprobs, strict=True))
            handed[r] = end
    for j, items in drawn.items():
        jobs[j].watch.step(items)  # type: ignore[union-attr]
    for i, r in enumerate(index):
        if not done[i] and jobs[row_job[r]].cancelled:
            lengths[r], rows.done[i] = steps, True


def _match_stop_strings(rows: _Rows, tokens: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor,
                        strings: list[bool], decode: Callable[[list[int]], str], looked: int, steps: int,
                        jobs: list[SampleJob], row_job: list[int]) -> None:
    """End each live row whose text contains one of its stop strings at the first token where it does, among the
    tokens drawn since the last look (``looked`` to ``steps``); a row that ended on the device later than that
    is cut back."""
    index = rows.index.tolist()
    done, ended_at = rows.done.tolist(), lengths[rows.index].tolist()
    watched = [i for i, r in enumerate(index) if strings[r]]
    if not watched:
        return
    drawn = tokens[rows.index[watched], :steps].tolist()
    for i, row_tokens in zip(watched, drawn, strict=True):
        r = index[i]
        last = ended_at[i] if done[i] else steps
        stops = jobs[row_job[r]].settings.stop_strings
        for n in range(looked + 1, last + 1):
            if any(stop in decode(row_tokens[:n]) for stop in stops):
                lengths[r], stopped[r], rows.done[i] = n, True, True
                break
