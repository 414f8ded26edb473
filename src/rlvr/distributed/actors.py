"""The model-holding Ray actors: one trainer, any number of samplers.

What it is: :class:`TrainerActor` wraps an in-process ``rlvr.ServiceClient`` on its own engine and runs the
training clients' calls in the order they were sent (a Ray actor with one thread runs one caller's calls in
submission order, which is the Tinker contract). Publishing writes the adapter with the engine's own sampler
checkpoint code and returns the folder's bytes and their content hash. :class:`SamplerActor` holds the base model
and the adapters published to it, each loaded through the engine's sampler-checkpoint loader and verified against
the trainer's hash before it serves; it runs several requests at once (a threaded actor), so the engine batches
them into one decode as it does in-process.

What it is not: fault tolerance (the driver re-sends the requests of a sampler that died, see ``cluster``), the
Tinker-shaped clients (``clients``), the vLLM sampler (``vllm_sampler``), or an FSDP2 trainer (not implemented;
see the package docstring). The trainer is not restarted when it dies: its optimizer state lives only in its memory.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from tinker import types

from rlvr.client import ServiceClient, TrainingClient
from rlvr.distributed.cluster import RestartableActor
from rlvr.distributed.weights import adapter_digest, files_digest, read_folder, received_files, write_folder
from rlvr.engine import checkpoint
from rlvr.engine.engine import Engine
from rlvr.engine.sample_queue import SamplerHandle
from rlvr.errors import SamplingError
from rlvr.home import resolve
from rlvr.numerics import Numerics

BASE_DIGEST = "base-model"
"""The 'hash' of the untrained base model (no adapter to verify)."""
KEEP_ADAPTERS = 3
"""Published adapters a sampler keeps loaded; an older one is reloaded from its files if asked for again."""


def _engine(share: int, precision: str | None, numerics: Numerics | None) -> Engine:
    """This actor's engine, by the driver's ``numerics`` (None: this process's environment's) in ``precision`` (None:
    the policy's) with this actor's share of the machine's cores (on a 2-core box: 1 thread), so actors do not
    fight; fixed for its engine (``threads``), which would otherwise divide it again by the other actors computing."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cpus // max(1, share))
    torch.set_num_threads(threads)
    return Engine(precision=precision, numerics=dataclasses.replace(numerics or Numerics.resolve(), threads=threads))


class TrainerActor:
    """The training side: training clients on an in-process engine, and adapter publication."""

    def __init__(self, thread_share: int = 1, precision: str | None = None, numerics: Numerics | None = None) -> None:
        self._service = ServiceClient(engine=_engine(thread_share, precision, numerics))
        self._clients: dict[str, TrainingClient] = {}
        self._ephemeral = 0

    def ready(self) -> int:
        """Answered once the actor has started: its process id."""
        return os.getpid()

    def create_lora_training_client(self, **kwargs: Any) -> str:
        return self._add(self._service.create_lora_training_client(**kwargs))

    def create_training_client_from_state(self, path: str, with_optimizer: bool, base_model: str | None = None) -> str:
        if with_optimizer:
            return self._add(self._service.create_training_client_from_state_with_optimizer(path, base_model))
        return self._add(self._service.create_training_client_from_state(path, base_model))

    def _add(self, client: TrainingClient) -> str:
        self._clients[client.model_id] = client
        return client.model_id

    def call(self, model_id: str, method: str, *args: Any) -> Any:
        """``training_client.<method>(*args).result()`` (forward_backward, optim_step, save_state ...)."""
        return getattr(self._clients[model_id], method)(*args).result()

    def get_info(self, model_id: str) -> types.GetInfoResponse:
        return self._clients[model_id].get_info()

    def get_tokenizer(self, model_id: str | None = None, base_model: str | None = None) -> Any:
        if model_id is not None:
            return self._clients[model_id].get_tokenizer()
        engine = self._service.engine
        return engine.run(engine.host, base_model).base.tokenizer

    def parameters(self, model_id: str) -> dict[str, torch.Tensor]:
        return self._clients[model_id].parameters()

    def publish(self, model_id: str, name: str | None) -> tuple[str, dict[str, bytes], str]:
        """Write the adapter as sampler weights and return ``(path, files, digest)``. Unnamed (ephemeral)
        snapshots exist only in the returned bytes: their folder is removed once read."""
        client = self._clients[model_id]
        engine = self._service.engine
        if name is None:
            self._ephemeral += 1
            written = f"ray-ephemeral-{self._ephemeral}-{uuid.uuid4().hex[:8]}"
        else:
            written = name
        path = client.save_weights_for_sampler(written).result().path
        engine.run(engine.release_sampler, path)  # the engine's in-memory snapshot: only the samplers need one
        folder = resolve(path)
        files = read_folder(folder)
        if name is None:
            shutil.rmtree(folder, ignore_errors=True)
        return path, files, files_digest(files)

    def read_sampler_weights(self, path: str) -> tuple[dict[str, bytes], str, str]:
        """Files, digest and base model of saved sampler weights (for create_sampling_client(model_path=...))."""
        folder, meta = checkpoint.read_meta(path)
        files = read_folder(folder)
        return files, files_digest(files), meta["base_model"]


class SamplerActor(RestartableActor):
    """One sampler replica: the base model plus the adapters published to it, each verified by its hash."""

    def __init__(self, index: int, thread_share: int = 1, precision: str | None = None,
                 numerics: Numerics | None = None) -> None:
        super().__init__()
        self.index = index
        self._engine = _engine(thread_share, precision, numerics)
        self._lock = threading.Lock()
        self._loaded: OrderedDict[str, tuple[SamplerHandle, str]] = OrderedDict()
        self._loads = 0

    def held(self) -> dict[str, str]:
        """The adapters loaded now, by key, with the hash of the weights actually in the model."""
        with self._lock:
            return {key: digest for key, (_, digest) in self._loaded.items()}

    def load(self, key: str, digest: str, files: dict[str, bytes] | None) -> str:
        """Load adapter ``key`` unless held; returns the hash of the weights now held (the publisher compares)."""
        return self._ensure(key, digest, [files])[1]

    def sample(self, key: str, digest: str, files_box: list[Any], tokens: list[int], num_samples: int,
               params: types.SamplingParams, include_prompt_logprobs: bool) -> types.SampleResponse:
        handle, _ = self._ensure(key, digest, files_box)
        return self._engine.submit_sample(handle, types.ModelInput.from_ints(tokens), num_samples, params,
                                          include_prompt_logprobs).result()

    def compute_logprobs(self, key: str, digest: str, files_box: list[Any], tokens: list[int]) -> list[float | None]:
        handle, _ = self._ensure(key, digest, files_box)
        return self._engine.run(self._engine.compute_logprobs, handle, types.ModelInput.from_ints(tokens))

    def compute_topk_logprobs(self, key: str, digest: str, files_box: list[Any], tokens: list[int], k: int) -> Any:
        handle, _ = self._ensure(key, digest, files_box)
        return self._engine.run(self._engine.compute_topk_logprobs, handle, types.ModelInput.from_ints(tokens), k)

    # -- adapters -------------------------------------------------------------------------------------------------

    def _ensure(self, key: str, digest: str, files_box: list[Any]) -> tuple[SamplerHandle, str]:
        """The handle for ``key`` and the hash of the weights it holds, loading it first if needed. ``files_box``
        holds the files (or a Ray reference to them: boxed, so Ray fetches them only when this replica lacks the
        adapter, e.g. after a restart)."""
        with self._lock:
            if key in self._loaded:
                handle, held = self._loaded[key]
                if held != digest:
                    raise SamplingError(f"sampler replica {self.index} holds adapter {key!r} with content hash "
                                        f"{held[:12]}, but this request expects {digest[:12]}: stale weights; "
                                        "publish again with save_weights_and_get_sampling_client")
                self._loaded.move_to_end(key)
                return handle, held
            handle, held = self._load(key, digest, files_box[0])
            self._loaded[key] = (handle, held)
            while len(self._loaded) > KEEP_ADAPTERS:
                _, (old, _) = self._loaded.popitem(last=False)
                if old.model_path is not None:
                    self._engine.run(self._engine.release_sampler, old.model_path)
            return handle, held

    def _load(self, key: str, digest: str, files: Any) -> tuple[SamplerHandle, str]:
        """Load adapter ``key`` from ``files`` through the engine's sampler-checkpoint loader, then hash the weights
        the model now holds; a hash other than ``digest`` is a SamplingError."""
        engine = self._engine
        if key.startswith("base:"):
            return engine.run(engine.sampler, None, key.removeprefix("base:")), BASE_DIGEST
        files = received_files(files, f"sampler replica {self.index}", key)
        self._loads += 1
        # the folder only carries the files into the engine, which holds the weights in memory from then on (an
        # evicted adapter comes back from the files a request carries): nothing stays on disk when Ray ends the actor
        with tempfile.TemporaryDirectory(prefix=f"rlvr-sampler-{self.index}-") as tmp:
            folder = write_folder(Path(tmp) / f"adapter-{self._loads}", files)
            handle = engine.run(engine.sampler, str(folder), None)
        held = engine.run(lambda: adapter_digest(handle.host.state_dict(handle.adapter)))
        if held != digest:
            engine.run(engine.release_sampler, str(folder))
            raise SamplingError(f"sampler replica {self.index} loaded adapter {key!r} and holds weights with content "
                                f"hash {held[:12]}, but the trainer published {digest[:12]}: the weights did not "
                                "arrive intact, so this replica will not sample from them")
        return handle, held
