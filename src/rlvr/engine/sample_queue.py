"""The sampling request queue: SamplingClient requests wait here until the engine thread decodes them in batches.

Requests submitted back to back (a loop over problems, each ``sample`` returning a future) should decode as one
batch, but the engine thread wakes on the first: so ``drain`` first waits until no new request has arrived for
``SAMPLE_GATHER_S`` (at most ten times that), which costs a few milliseconds against decode steps of 0.1 s. It then
groups the waiting requests by the weights they sample from (base model and adapter) and decodes each group in
consecutive chunks of at most ``max_rows`` samples (the engine's ``SampleBatch``: the CPU sampler or the GPU one),
settling every request's future with
its SampleResponse, or with the error its chunk's decode raised. A watched request (``sample/watch.py``) cancelled
while it waited is dropped here, its future cancelled.

On the CPU sampler's own path a request's samples do not depend on which requests share its decode (see
``sample/sampler.py``), so a seeded request sent on its own gets the same tokens and logprobs whatever arrived with it.
Elsewhere (other architectures, PyTorch's attention, unpacked matmuls, the GPU paths) which requests share a decode
changes the rounding of each one's logprobs (~1e-6), so gathering by arrival time would make a loaded machine's
numbers depend on its timing there. Requests submitted together as a unit (``submit_unit``, the RL loop's way)
therefore decode as batches of their own, never joined by another request: the same requests give the same numbers
bit for bit on every path, however busy the machine is.

The Engine owns one queue and runs ``drain`` on its own thread, behind whatever jobs were queued before. What a
request samples from, a base model and an adapter, is its ``SamplerHandle`` (defined here: the queue groups requests
by it).

Not here: checking a request and drawing its seed (``Engine.submit_sample``), the decode itself
(``sample/sampler.py``, ``gpu/device_sampler.py``) and which of the two runs (the engine).
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from rlvr.engine.models.lora import AdapterHost
from rlvr.engine.sample.sampler import SampleJob, Sequence_
from rlvr.engine.sample.scores import ScoreRequest, mask_before_last_n, prompt_fields, sample_topk

SAMPLE_GATHER_S = 0.002  # a sampling batch waits until requests stop arriving for this long (see SampleQueue.drain)

PromptLogprobs = Callable[[torch.nn.Module, list[int], int], np.ndarray]
"""``(model, tokens, pad_id) -> (T,)`` log p(token_i | tokens_<i), NaN at 0: ``Engine._prompt_logprobs``."""


@dataclass
class SamplerHandle:
    """What a SamplingClient samples from: a base model and an adapter (None: the base model itself)."""

    host: AdapterHost
    adapter: str | None
    model_path: str | None
    rng: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(secrets.randbits(62)))
    """Draws the seed of each request that brings none."""


SampleBatch = Callable[[torch.nn.Module, list[SampleJob], Callable[[list[int]], str], int], list[list[Sequence_]]]
"""``(model, jobs, decode, pad_id) -> each job's sequences``: one batched decode (``Engine._sample_batch``)."""


@dataclass
class _PendingSample:
    """A sampling request waiting for the next batched decode."""

    handle: SamplerHandle
    job: SampleJob
    scores: ScoreRequest
    future: Future
    unit: int | None = None
    """Requests submitted together (``SampleQueue.submit_unit``) share a number and decode apart from others."""


def _chunks(requests: list[_PendingSample], max_rows: int) -> list[list[_PendingSample]]:
    """Consecutive runs of requests with at most ``max_rows`` samples in all (a bigger request runs alone)."""
    chunks: list[list[_PendingSample]] = [[]]
    rows = 0
    for request in requests:
        if chunks[-1] and rows + request.job.num_samples > max_rows:
            chunks.append([])
            rows = 0
        chunks[-1].append(request)
        rows += request.job.num_samples
    return chunks


class SampleQueue:
    """Sampling requests waiting for the engine thread (``executor``), decoded by ``sample_batch`` in batches of at
    most ``max_rows`` samples; ``prompt_logprobs`` computes a prompt's logprobs for requests that ask for them."""

    def __init__(self, executor: Executor, prompt_logprobs: PromptLogprobs, max_rows: int, sample_batch: SampleBatch
                 ) -> None:
        self.max_rows = max_rows
        self.sample_batch = sample_batch
        self._executor = executor
        self._prompt_logprobs = prompt_logprobs
        self._pending: list[_PendingSample] = []
        self._lock = threading.Lock()
        self._units = itertools.count()

    def submit(self, handle: SamplerHandle, job: SampleJob, scores: ScoreRequest) -> AwaitableConcurrentFuture:
        """Queue a checked request and wake the engine thread; a future of its SampleResponse."""
        return self.submit_unit([(handle, job, scores)], unit=False)[0]

    def submit_unit(self, requests: list[tuple[SamplerHandle, SampleJob, ScoreRequest]], unit: bool = True
                    ) -> list[AwaitableConcurrentFuture]:
        """Queue checked requests at once; with ``unit``, they decode together and with no other request (see the
        module docstring). Futures of their SampleResponses, in order."""
        number = next(self._units) if unit else None
        pending = [_PendingSample(handle, job, scores, Future(), number) for handle, job, scores in requests]
        with self._lock:
            self._pending.extend(pending)
        self._executor.submit(self.drain)
        return [AwaitableConcurrentFuture(p.future) for p in pending]

    def drain(self) -> None:
        """Run every waiting request, batched by the weights they sample from (see the module docstring)."""
        deadline = time.monotonic() + 10 * SAMPLE_GATHER_S
        seen = -1
        while True:
            with self._lock:
                waiting = len(self._pending)
                gathered = all(p.unit is not None for p in self._pending)  # nothing to wait for
            if waiting == 0:
                return
            if gathered or waiting == seen or time.monotonic() > deadline:
                break
            seen = waiting
            time.sleep(SAMPLE_GATHER_S)
        with self._lock:
            pending, self._pending = self._pending, []
        for request in [r for r in pending if r.job.cancelled]:  # watched, and cancelled before its decode
            request.future.cancel()
        pending = [r for r in pending if not r.job.cancelled]
        groups: dict[tuple[int, str | None, int | None], list[_PendingSample]] = {}
        for request in pending:
            groups.setdefault((id(request.handle.host), request.handle.adapter, request.unit), []).append(request)
        for requests in groups.values():
            for chunk in _chunks(requests, self.max_rows):
                self._run_chunk(chunk)

    def _run_chunk(self, requests: list[_PendingSample]) -> None:
        """One batched decode of ``requests`` (all on the same weights); settles each one's future."""
        handle = requests[0].handle
        base = handle.host.base
        try:
            with handle.host.active(handle.adapter) as model:
                sequences = self.sample_batch(model, [r.job for r in requests],
                                         lambda ids: base.tokenizer.decode(ids, skip_special_tokens=False),
                                         base.tokenizer.pad_token_id)
                prompt_lps = [mask_before_last_n(self._prompt_logprobs(model, r.job.prompt,
                                                                       base.tokenizer.pad_token_id), r.scores.last_n)
                              if r.scores.prompt_logprobs else None
                              for r in requests]
                extras = [prompt_fields(model, r.job.prompt, r.scores, r.job.settings.temperature, r.job.generator)
                          if r.scores.needs_prompt_distribution else {} for r in requests]
                topks = [[sample_topk(model, r.job.prompt, s.tokens, r.scores.topk_sample) if r.scores.topk_sample
                          else None for s in seqs] for r, seqs in zip(requests, sequences, strict=True)]
        except BaseException as exc:
            for request in requests:
                _settle(request.future, request.future.set_exception, exc)
            return
        for request, seqs, lps, extra, topk in zip(requests, sequences, prompt_lps, extras, topks, strict=True):
            _settle(request.future, request.future.set_result, types.SampleResponse(
                sequences=[
                    types.SampledSequence(
                        stop_reason=s.stop_reason,  # type: ignore[arg-type]
                        sequence_id=uuid.uuid4().hex,
                        tokens_np=np.asarray(s.tokens, dtype=np.int32),
                        logprobs_np=np.asarray(s.logprobs, dtype=np.float32),
                        topk_logprobs_np=top,
                    )
                    for s, top in zip(seqs, topk, strict=True)
                ],
                prompt_logprobs_np=lps,
                **extra,
            ))


def _settle(future: Future, settle: Callable, value: object) -> None:
    """``settle(value)`` unless ``future`` was cancelled meanwhile (its caller stopped waiting: nothing to tell)."""
    try:
        settle(value)
    except InvalidStateError:
        assert future.cancelled(), "a sampling request's future was settled twice"
