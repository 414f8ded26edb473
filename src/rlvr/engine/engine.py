"""The engine: one worker thread that owns every loaded model and runs every request in submission order.

Clients (``rlvr.client``) turn each Tinker call into a job on this thread and hand back a future. Because all jobs
run one after another, a ``forward_backward`` followed by an ``optim_step`` always happens in that order, even when
both were submitted before either was awaited, and an adapter switch can never race a running request.

Each base model is loaded once per process and shared: every training client is one LoRA adapter on it, and every
sampler snapshot is one more frozen adapter (see ``lora.py``).

An engine computes as its numerics policy says (``rlvr.numerics``: precision, matmul kind, attention, heap,
threads, device), resolved once when it is created and reported as ``Engine.numerics``; while its worker runs a job,
that policy is the thread's ``rlvr.numerics.active()``, which the kernels below read.

An engine runs on one device (``device.py``: the CPU or one CUDA GPU, ``RLVR_DEVICE``): its models, adapters,
optimizer state and every tensor of a request live there, and results come back as CPU tensors. This is the one place
that picks the paths: on CUDA (or on a CPU given ``GpuPaths``) training packs datums into rows (``gpu/packing.py``)
and sampling keeps its state on the device (``gpu/device_sampler.py``); a CPU engine otherwise shares prompts'
compute (``train/prefix.py``) and decodes on its own kernels (``sample/sampler.py`` with ``cpu/decode.py``).

The engine's parts: this worker with its sampling queue (``sample_queue.py``), share of the cores (``cores.py``),
device (``device.py``) and checkpoints (``checkpoint.py``); ``models/`` (loading, LoRA, test models); ``train/``
(datum checking, the loss table, AdamW, the trainer's forward); ``sample/`` (the sampler, its KV cache and scores);
``cpu/`` (the C kernels and what runs on them); ``gpu/`` (the GPU paths).

Not here: the Tinker-shaped client classes (``rlvr.client``), loss formulas (``train/losses.py``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import logging
import queue
import secrets
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from rlvr.engine import checkpoint
from rlvr.engine.cores import CoreShare
from rlvr.engine.device import (
    GpuPaths,
    attention_implementation,
    resolve_device,
    resolve_numerics,
    resolve_precision,
    weight_dtype,
)
from rlvr.engine.gpu import device_sampler, packing
from rlvr.engine.gpu.packing import PackedRow
from rlvr.engine.models.load import canonical_name, load_base_model, rlvr_home
from rlvr.engine.models.lora import AdapterHost, LoraSpec
from rlvr.engine.sample import sampler
from rlvr.engine.sample.sampler import SampleJob, Sequence_, resolve_params
from rlvr.engine.sample.scores import PromptTopk, ScoreRequest, topk_candidates
from rlvr.engine.sample.watch import Watch
from rlvr.engine.sample_queue import SampleQueue, SamplerHandle
from rlvr.engine.train import optim
from rlvr.engine.train.batch import CheckedDatum, check_data, model_input_tokens
from rlvr.engine.train.losses import resolve_loss
from rlvr.engine.train.optim import Optimizer, config_of, kind_of, make_optimizer
from rlvr.engine.train.prefix import Cluster, cluster_logprobs, plan
from rlvr.errors import CheckpointError, ConfigurationError, ContextFullError, InvalidDatumError, SamplingError
from rlvr.home import make_path
from rlvr.metrics import reduce_metrics
from rlvr.numerics import Numerics, activated

logger = logging.getLogger(__name__)

UNUSED_SNAPSHOTS = 4
"""Sampler snapshots saved to disk and used by no SamplingClient that stay in memory (``_drop_unused_snapshots``)."""

CustomLossFn = Callable[[list[types.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class Trainer:
    """The state behind one TrainingClient."""

    run_id: str
    """Names this run's checkpoints: rlvr://<run_id>/..."""
    host: AdapterHost
    """The base model the adapter sits on."""
    adapter: str
    """The adapter's name in ``host``."""
    spec: LoraSpec
    """What the adapter adapts."""
    seed: int
    """The seed its LoRA weights were drawn from."""
    optimizer: Optimizer
    """AdamW or Dimuon over the adapter's parameters, in ``host.parameters(adapter)`` order; fixed at creation."""
    step: int = 0
    """Optimizer steps taken."""


@functools.cache
def fix_thread_counts() -> None:
    """Make MKL use the thread count it is given on every call: by default (``MKL_DYNAMIC``) it may take fewer
    threads when the machine is busy, which splits a product's sums differently, so two runs of one seed would round
    apart (measured: tiny's trainer logprobs and grad norm differed at step 0 between two processes on a loaded
    machine). The count itself, torch's intra-op threads, is fixed per process. A torch without MKL is left alone.
    Once per process (every Engine calls it)."""
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        library.MKL_Set_Dynamic(ctypes.c_int(0))  # the C interface (mkl_set_dynamic is Fortran's)
    except (OSError, AttributeError):  # no such library or no MKL in it: nothing varies the thread count
        pass


class _EngineThread(ThreadPoolExecutor):
    """The engine's one worker thread; on a CPU engine every job runs on its share of the cores (``cores.py``).

    ``later`` queues a call from where no lock may be taken: a garbage collector's finalizer can run inside any
    ``ThreadPoolExecutor.submit`` of its thread (transformers loads weights through one), which holds
    ``concurrent.futures``' module-wide lock, so a finalizer that submitted would wait on that lock forever. What
    ``later`` queues runs on this thread after every job submitted before it and before the first job submitted
    after it, as if it had been submitted then: each job and each queued call draws a ticket, and a job first runs
    the queued calls whose tickets are lower than its own. (A client dropped right after it submitted a job, as in
    ``create_sampling_client(...).compute_logprobs(...)``, releases its snapshot only once that job has run.)"""

    def __init__(self, share: CoreShare | None, numerics: Numerics) -> None:
        super().__init__(max_workers=1, thread_name_prefix="rlvr-engine")
        self.share = share
        self.numerics = numerics  # active on this thread while a job runs
        self._tickets = itertools.count()  # next() is one C call: atomic, and takes no lock
        self._later: queue.SimpleQueue = queue.SimpleQueue()  # put() takes no lock a finalizer could hold
        self._waiting: list[tuple[int, Callable, tuple]] = []  # queued calls not yet due (this thread only)
        self._submitting = threading.Lock()  # a ticket and its job enter the queue together, in ticket order

    def later(self, fn: Callable, /, *args) -> None:
        self._later.put((next(self._tickets), fn, args))

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        with self._submitting:
            return super().submit(self._job, next(self._tickets), fn, *args, **kwargs)

    def _job(self, ticket: int, fn: Callable, /, *args, **kwargs):
        with activated(self.numerics):
            self._run_queued(before=ticket)
            if self.share is None:
                return fn(*args, **kwargs)
            return self.share.run(fn, *args, **kwargs)

    def _run_queued(self, before: int) -> None:
        while True:
            try:
                self._waiting.append(self._later.get_nowait())
            except queue.Empty:
                break
        due = sorted(w for w in self._waiting if w[0] < before)
        self._waiting = [w for w in self._waiting if w[0] >= before]
        for _, queued, queued_args in due:
            try:
                queued(*queued_args)
            except Exception:  # a queued clean-up must not fail the unrelated job behind it
                logger.exception("rlvr: a queued engine clean-up (%s) failed", getattr(queued, "__name__", queued))


class Engine:
    """Loads models and runs training and sampling requests, one at a time, on its own thread."""

    _default: Engine | None = None
    _default_lock = threading.Lock()

    def __init__(self, max_tokens_per_microbatch: int = 4096, max_sample_rows: int = 128,
                 precision: str | None = None, device: str | torch.device | None = None,
                 gpu_paths: GpuPaths | None = None, numerics: Numerics | None = None) -> None:
        """``numerics``: the policy to compute by (``rlvr.numerics``; None: ``Numerics.resolve()``, the
        environment's), resolved here on this machine (``device.resolve_numerics``) and kept as ``self.numerics``;
        ``precision`` and ``device``, when given, replace its own: ``device.resolve_device`` (None: a GPU when there
        is one), ``device.resolve_precision`` (CPU: float32 or bfloat16 base matmuls; CUDA: bfloat16 base weights by
        default); ``gpu_paths``: the GPU paths' settings (on CUDA, None means the defaults; on a CPU, giving them
        makes it take those paths)."""
        fix_thread_counts()
        requested = _requested(numerics, precision, device)
        self.device = resolve_device(None, requested)
        self.gpu_paths = (gpu_paths or GpuPaths()) if self.device.type == "cuda" else gpu_paths
        self.max_tokens_per_microbatch = max_tokens_per_microbatch
        share = (CoreShare(rlvr_home() / "busy", torch.get_num_threads(), requested.threads)
                 if self.device.type == "cpu" else None)
        self._release_free_pages: Callable[[], None] = lambda: None
        if self.gpu_paths is None:  # the CPU paths
            from rlvr.engine.cpu import heap  # their package: the GPU paths never load it

            heap.keep_freed_blocks(requested.heap)  # before the worker thread's first allocation: it then shares
            self._release_free_pages = heap.release_free_pages  # the main heap
        self._executor = _EngineThread(share, requested)
        try:  # on the worker: the kernels it builds and checks run torch work there, not on the caller's thread
            self.numerics = self._executor.submit(resolve_numerics, requested, self.gpu_paths).result()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise
        self._executor.numerics = self.numerics
        self.precision = self.numerics.precision
        self._samples = SampleQueue(self._executor, self._prompt_logprobs, max_sample_rows, self._sample_batch)
        self._rng_lock = threading.Lock()  # guards each SamplerHandle's rng (callers' threads draw request seeds)
        self._hosts: dict[str, AdapterHost] = {}
        self._names = itertools.count()
        self._snapshots: dict[str, tuple[AdapterHost, str]] = {}  # sampler path -> the adapter it names now
        self._snapshot_refs: dict[str, tuple[AdapterHost, int]] = {}  # snapshot adapter -> its SamplingClients
        self._written: set[str] = set()  # sampler paths saved to disk by this engine (a retired snapshot reloads)

    @classmethod
    def default(cls, precision: str | None = None, device: str | torch.device | None = None,
                numerics: Numerics | None = None) -> Engine:
        """The process-wide engine that ServiceClients share, so each base model is loaded once. ``numerics`` (None:
        the environment's), with ``precision`` and ``device`` in place of its own when given, is the policy it is
        created with; asked for again once it exists, what is set must be what it has (a process holds one engine:
        torch work on two threads of one process runs a third slower)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls(precision=precision, device=device, numerics=numerics)
                return cls._default
            cls._default.check_policy(_requested(numerics, precision, device, environment=False),
                                      settings=numerics is not None)
            return cls._default

    def check_policy(self, asked: Numerics, settings: bool = True) -> None:
        """ConfigurationError unless what ``asked`` sets is this engine's: its device and precision where set (not
        None), and with ``settings`` its matmul, attention, heap and threads (a process's engine computes one way,
        fixed when it was created)."""
        where = "(earlier work in this process created it): run in a fresh process, or set"
        if asked.device is not None and resolve_device(asked.device) != self.device:
            raise ConfigurationError(
                f"device={asked.device!r}, but this process's engine already runs on {self.device} {where} "
                f"RLVR_DEVICE={asked.device} before anything uses rlvr")
        if asked.precision is not None and \
                resolve_precision(asked.precision, self.device, self.gpu_paths) != self.precision:
            raise ConfigurationError(
                f"precision={asked.precision!r}, but this process's engine already multiplies in {self.precision} "
                f"{where} RLVR_PRECISION={asked.precision} before anything uses rlvr")
        for name in ("matmul", "attention", "heap", "threads") if settings else ():
            value, own = getattr(asked, name), getattr(self.numerics, name)
            if value != own:
                raise ConfigurationError(
                    f"{asked.source(name)}={value!r}, but this process's engine already computes with {name}={own!r} "
                    f"{where} the same {name} for both")

    @classmethod
    def current(cls) -> Engine | None:
        """The process-wide engine (``default``) if something in this process has created it, else None."""
        return cls._default

    @property
    def max_sample_rows(self) -> int:
        """The most samples one batched decode holds (a bigger request runs alone)."""
        return self._samples.max_rows

    # -- running jobs ---------------------------------------------------------------------------------------------

    def submit(self, fn: Callable, *args, **kwargs) -> AwaitableConcurrentFuture:
        """Queue ``fn(*args, **kwargs)`` behind every earlier job; a future of its result."""
        return AwaitableConcurrentFuture(self._executor.submit(fn, *args, **kwargs))

    def run(self, fn: Callable, *args, **kwargs):
        """Queue a job and wait for it."""
        return self._executor.submit(fn, *args, **kwargs).result()

    # -- models ---------------------------------------------------------------------------------------------------

    def host(self, base_model: str) -> AdapterHost:
        name = canonical_name(base_model)
        if name not in self._hosts:
            dtype = weight_dtype(self.precision, self.device)
            attention = attention_implementation(self.device, dtype) if self.device.type == "cuda" else None
            base = load_base_model(name, self.device, dtype, attention)
            with activated(self.numerics):  # its packing follows this engine's policy, whichever thread loads it
                self._hosts[name] = AdapterHost(base, self.precision, self.gpu_paths)
            self._release_free_pages()  # loading's temporaries (a float32 copy, the packing) go back
        return self._hosts[name]

    def _new_adapter_name(self, kind: str) -> str:
        return f"{kind}_{next(self._names)}"

    def create_trainer(self, base_model: str, spec: LoraSpec, seed: int | None, optimizer: str = "adamw") -> Trainer:
        """A new adapter on ``base_model`` trained by ``optimizer`` (``"adamw"`` or ``"dimuon"``, see ``optim.py``)."""
        host = self.host(base_model)
        seed = secrets.randbelow(2**31) if seed is None else int(seed)
        adapter = self._new_adapter_name("train")
        host.add(adapter, spec, seed)
        trained_by = make_optimizer(list(host.parameters(adapter).values()), optimizer, spec.rank)
        return Trainer(f"run-{uuid.uuid4().hex[:12]}", host, adapter, spec, seed, trained_by)

    def release_trainer(self, trainer: Trainer) -> None:
        """Delete ``trainer``'s adapter and its optimizer state: no TrainingClient uses it any more (snapshots taken
        from it are copies and stay). A host's last adapter stays (peft cannot delete it); a new one replaces it."""
        trainer.optimizer = None
        trainer.host.delete(trainer.adapter)

    def release_trainer_later(self, trainer: Trainer) -> None:
        """Queue ``release_trainer`` behind the jobs submitted so far (called when a TrainingClient is
        garbage-collected; see ``release_sampler_later``)."""
        self._executor.later(self.release_trainer, trainer)

    # -- forward / backward ---------------------------------------------------------------------------------------

    def _logprobs(self, trainer: Trainer, data: list[CheckedDatum], batch: list[Cluster] | list[PackedRow]
                  ) -> dict[int, torch.Tensor]:
        """log p(target_t | input_<=t) of the datums in ``batch`` by index, (T_i,) each on the engine's device,
        differentiable when grad is enabled."""
        with trainer.host.active(trainer.adapter) as model:
            return self._batch_logprobs(model, [d.input_ids for d in data], [d.targets for d in data], batch,
                                        trainer.host.base.tokenizer.pad_token_id)

    def _plan(self, data: list[CheckedDatum]) -> list[list[Cluster]] | list[list[PackedRow]]:
        return self._plan_tokens([d.input_ids.tolist() for d in data])

    def _plan_tokens(self, sequences: list[list[int]]) -> list[list[Cluster]] | list[list[PackedRow]]:
        """Microbatches: clusters sharing prefixes on the CPU path (``prefix.py``), packed rows on the GPU path
        (``packing.py``); either way each item's ``rows`` are datum indices."""
        if self.gpu_paths is None:
            return plan(sequences, self.max_tokens_per_microbatch)
        return packing.plan([len(s) for s in sequences], self.gpu_paths.row_tokens, self.max_tokens_per_microbatch)

    def _batch_logprobs(self, model: torch.nn.Module, input_ids: list[torch.Tensor], targets: list[torch.Tensor],
                        batch: list[Cluster] | list[PackedRow], pad_id: int) -> dict[int, torch.Tensor]:
        if self.gpu_paths is None:
            return cluster_logprobs(model, input_ids, targets, batch, pad_id)  # type: ignore[arg-type]
        return packing.packed_logprobs(model, input_ids, targets, batch, pad_id, self.gpu_paths)  # type: ignore[arg-type]

    def _sample_batch(self, model: torch.nn.Module, jobs: list[SampleJob], decode: Callable[[list[int]], str],
                      pad_id: int) -> list[list[Sequence_]]:
        """One batched decode of ``jobs`` on ``model``: the GPU paths' sampler or the CPU one (``SampleQueue``)."""
        if self.gpu_paths is None:
            return sampler.sample_batch(model, jobs, decode, pad_id)
        return device_sampler.sample_batch(model, jobs, decode, pad_id, self.gpu_paths)

    def forward(
        self, trainer: Trainer, data: Sequence[types.Datum], loss_fn: str, loss_fn_config: dict | None, backward: bool
    ) -> types.ForwardBackwardOutput:
        spec, config = resolve_loss(loss_fn, loss_fn_config)
        checked = check_data(data, spec.inputs, self._vocab_size(trainer.host), provenance=spec.provenance,
                             topk=spec.topk)
        outputs: list[torch.Tensor] = [torch.empty(0)] * len(checked)
        metrics: list[tuple[dict[str, float], int]] = []
        params = list(trainer.host.parameters(trainer.adapter).values())
        saved_grads = [None if p.grad is None else p.grad.clone() for p in params]
        try:
            for clusters in self._plan(checked):
                group = [r for cluster in clusters for r in cluster.rows]
                with torch.set_grad_enabled(backward):
                    by_row = self._logprobs(trainer, checked, clusters)
                    logprobs = [by_row[i] for i in group]
                    flat = torch.cat(logprobs)
                    inputs = [torch.cat([checked[i].inputs[k] for i in group]).to(flat.device)
                              for k in spec.arguments]
                    extra = {"lengths": [len(lp) for lp in logprobs]} if spec.per_datum else {}
                    loss, group_metrics = spec.fn(flat, *inputs, **extra, **config)
                if not torch.isfinite(loss):
                    raise InvalidDatumError(f"loss_fn={loss_fn!r} gave a non-finite loss ({loss.item()}); no "
                                            "gradient was applied. Check the advantages and logprobs for extremes")
                if backward:
                    loss.backward()
                metrics.append((group_metrics, len(flat)))
                for i, lp in zip(group, logprobs, strict=True):
                    outputs[i] = lp.detach()
        except BaseException:
            for p, grad in zip(params, saved_grads, strict=True):  # A failed call leaves the gradients as they were.
                p.grad = grad
            raise
        finally:
            self._release_free_pages()  # what the call freed goes back to the system (a CPU engine's ``heap``)
        return _output(outputs, reduce_metrics(metrics))

    def forward_backward_custom(
        self, trainer: Trainer, data: Sequence[types.Datum], loss_fn: CustomLossFn
    ) -> types.ForwardBackwardOutput:
        checked = check_data(data, (), self._vocab_size(trainer.host), allow_extra=True)
        by_row: dict[int, torch.Tensor] = {}
        for clusters in self._plan(checked):
            by_row.update(self._logprobs(trainer, checked, clusters))
        logprobs = [by_row[i].cpu() for i in range(len(checked))]  # differentiable: the gradient flows to the device
        result = loss_fn(list(data), logprobs)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor)):
            raise InvalidDatumError("a custom loss_fn must return (loss: torch.Tensor scalar, metrics: dict)")
        loss, user_metrics = result
        if loss.dim() != 0 or not torch.isfinite(loss):
            raise InvalidDatumError(f"a custom loss_fn must return a finite scalar, got shape {tuple(loss.shape)} "
                                    f"value {loss.detach().flatten()[:3].tolist()}")
        loss.backward()
        return _output([lp.detach() for lp in logprobs], {"loss:sum": loss.item(), **dict(user_metrics)})

    def optim_step(self, trainer: Trainer, params: types.OptimParams) -> types.OptimStepResponse:
        metrics = optim.step(trainer.optimizer, params)
        trainer.step += 1
        return types.OptimStepResponse(metrics=metrics)

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def _adapter_files(self, trainer: Trainer) -> dict[str, object]:
        host, adapter = trainer.host, trainer.adapter
        peft_config = host.peft_config(adapter).to_dict()
        peft_config = {k: sorted(v) if isinstance(v, set) else v for k, v in peft_config.items()}
        peft_config["base_model_name_or_path"] = host.base.name
        meta = {
            "format_version": checkpoint.FORMAT_VERSION,
            "base_model": host.base.name,
            "lora": trainer.spec.to_dict(),
            "seed": trainer.seed,
            "step": trainer.step,
            "run_id": trainer.run_id,
            "param_names": [n.replace(f".{adapter}.", ".") for n in host.parameters(adapter)],
        }
        return {"adapter_model.safetensors": host.state_dict(adapter), "adapter_config.json": peft_config,
                "rlvr.json": meta}

    def save_state(self, trainer: Trainer, name: str) -> types.SaveWeightsResponse:
        path = make_path(trainer.run_id, "weights", name)
        files = self._adapter_files(trainer)
        files["rlvr.json"]["optimizer"] = config_of(trainer.optimizer).model_dump()  # type: ignore[index]
        files["optimizer.pt"] = trainer.optimizer.state_dict()
        files["rng.pt"] = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            files["rng.pt"]["cuda"] = torch.cuda.get_rng_state(self.device)  # type: ignore[index]
        checkpoint.write(path, files)
        return types.SaveWeightsResponse(path=path)

    def load_state(self, trainer: Trainer, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        folder, meta = checkpoint.read_meta(path)
        if canonical_name(meta["base_model"]) != trainer.host.base.name:
            raise CheckpointError(f"checkpoint {path!r} was trained on {meta['base_model']!r}, this client is on "
                                  f"{trainer.host.base.name!r}")
        if LoraSpec(**meta["lora"]) != trainer.spec:
            raise CheckpointError(f"checkpoint {path!r} has LoRA {meta['lora']}, this client {trainer.spec.to_dict()}; "
                                  "use ServiceClient.create_training_client_from_state to get a matching client")
        kind = kind_of(trainer.optimizer)
        saved_kind = checkpoint.saved_optimizer(meta)
        if with_optimizer and saved_kind != kind:
            raise CheckpointError(f"checkpoint {path!r} holds {saved_kind} optimizer state and this client trains with "
                                  f"{kind}; load its weights only (load_state), or create a client that takes its "
                                  "optimizer along (create_training_client_from_state_with_optimizer)")
        optimizer_state = checkpoint.read_torch(folder, "optimizer.pt", path) if with_optimizer else None
        rng = checkpoint.read_torch(folder, "rng.pt", path) if with_optimizer else None
        trainer.host.load_state_dict(trainer.adapter, checkpoint.read_adapter(folder))
        trainer.optimizer = make_optimizer(list(trainer.host.parameters(trainer.adapter).values()), kind,
                                           trainer.spec.rank)
        trainer.step = 0
        if with_optimizer:
            trainer.optimizer.load_state_dict(optimizer_state)  # type: ignore[arg-type]
            torch.set_rng_state(rng["torch"])  # type: ignore[index]
            if self.device.type == "cuda" and "cuda" in rng:  # type: ignore[operator]
                torch.cuda.set_rng_state(rng["cuda"], self.device)  # type: ignore[index]
            trainer.step = int(meta["step"])
        return types.LoadWeightsResponse(path=path)

    def trainer_from_state(self, path: str, with_optimizer: bool, optimizer: str = "adamw") -> Trainer:
        """A trainer with the weights at ``path``; with its optimizer state (and so its optimizer, which a resume
        keeps), else with a fresh ``optimizer``."""
        _, meta = checkpoint.read_meta(path)
        kind = checkpoint.saved_optimizer(meta) if with_optimizer else optimizer
        trainer = self.create_trainer(meta["base_model"], LoraSpec(**meta["lora"]), meta["seed"], kind)
        self.load_state(trainer, path, with_optimizer)
        return trainer

    # -- samplers -------------------------------------------------------------------------------------------------

    def save_for_sampler(self, trainer: Trainer, name: str | None) -> str:
        """Snapshot the adapter for sampling (in memory; also on disk when named) and return its path."""
        path = make_path(trainer.run_id, "sampler_weights", name or f"ephemeral-{next(self._names)}")
        if name is not None:
            checkpoint.write(path, self._adapter_files(trainer))
            self._written.add(path)
        snapshot = trainer.host.copy(trainer.adapter, self._new_adapter_name("sampler"))
        if path in self._snapshots:  # saved again under one name: the older snapshot goes once no client uses it
            _, older = self._snapshots[path]
            if self._snapshot_refs[older][1] <= 0:
                self._retire_snapshot(older)
        self._snapshots.pop(path, None)  # the newest last (``_drop_unused_snapshots``)
        self._snapshots[path] = (trainer.host, snapshot)
        self._snapshot_refs[snapshot] = (trainer.host, 0)
        self._drop_unused_snapshots()
        return path

    def _drop_unused_snapshots(self) -> None:
        """Keep in memory the ``UNUSED_SNAPSHOTS`` newest snapshots that were saved to disk and that no
        SamplingClient uses (yet: saving and then creating a client is the usual order); retire older ones. A client
        created from a retired one's path later loads it from disk again."""
        unused = [(path, snapshot) for path, (_, snapshot) in self._snapshots.items()
                  if self._snapshot_refs[snapshot][1] <= 0 and path in self._written]
        for _, snapshot in unused[:max(0, len(unused) - UNUSED_SNAPSHOTS)]:
            self._retire_snapshot(snapshot)

    def sampler(self, model_path: str | None, base_model: str | None) -> SamplerHandle:
        """Resolve what a new SamplingClient samples from, loading a saved adapter when needed."""
        if model_path is None:
            if base_model is None:
                raise SamplingError("create_sampling_client needs model_path (a saved sampler checkpoint) or "
                                    "base_model (to sample the untrained model)")
            return SamplerHandle(self.host(base_model), None, None)
        if model_path not in self._snapshots:
            folder, meta = checkpoint.read_meta(model_path)
            host = self.host(meta["base_model"])
            snapshot = self._new_adapter_name("sampler")
            host.add(snapshot, LoraSpec(**meta["lora"]), seed=0)
            host.load_state_dict(snapshot, checkpoint.read_adapter(folder))
            self._snapshots[model_path] = (host, snapshot)
            self._snapshot_refs[snapshot] = (host, 0)
        host, snapshot = self._snapshots[model_path]
        self._snapshot_refs[snapshot] = (host, self._snapshot_refs[snapshot][1] + 1)
        return SamplerHandle(host, snapshot, model_path)

    def release_sampler(self, model_path: str, adapter: str | None = None) -> None:
        """Drop a snapshot's adapter when no SamplingClient uses it any more (it reloads from disk if named).
        ``adapter``: the snapshot a client held (None: the one ``model_path`` names now)."""
        if adapter is None:
            adapter = self._snapshots.get(model_path, (None, None))[1]
        if adapter not in self._snapshot_refs:
            return
        host, refs = self._snapshot_refs[adapter]
        self._snapshot_refs[adapter] = (host, refs - 1)
        if refs - 1 <= 0:
            self._retire_snapshot(adapter)

    def _retire_snapshot(self, adapter: str) -> None:
        host, _ = self._snapshot_refs.pop(adapter)
        for path, (_, current) in list(self._snapshots.items()):
            if current == adapter:
                del self._snapshots[path]
        host.retire(adapter)

    def release_sampler_later(self, model_path: str, adapter: str | None = None) -> None:
        """Queue ``release_sampler`` behind the jobs submitted so far (called when a SamplingClient is
        garbage-collected, from any thread and inside any code: it takes no lock, see ``_EngineThread``); it runs
        before the next job submitted after it."""
        self._executor.later(self.release_sampler, model_path, adapter)

    def submit_sample(
        self,
        handle: SamplerHandle,
        prompt: types.ModelInput,
        num_samples: int,
        params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        scores: ScoreRequest | None = None,
        watch: Watch | None = None,
    ) -> AwaitableConcurrentFuture:
        """Queue a sampling request. Requests waiting together for the same weights are decoded as one batch.
        ``scores`` asks for prompt and sample scores besides the samples (``scores.py``); ``include_prompt_logprobs``
        is its ``prompt_logprobs`` alone. ``watch`` is handed the tokens as they are drawn and may cancel the request
        (``sample/watch.py``)."""
        scores = scores or ScoreRequest(prompt_logprobs=include_prompt_logprobs)
        try:
            job = self._sample_job(handle, prompt, num_samples, params, watch)
            scores.check(len(job.prompt), self._vocab_size(handle.host))
        except Exception as exc:  # Bad requests fail on their own future, before joining any batch.
            return _failed(exc)
        return self._samples.submit(handle, job, scores)

    def submit_samples(self, handle: SamplerHandle, requests: Sequence[tuple[types.ModelInput, int,
                                                                                 types.SamplingParams]]
                       ) -> list[AwaitableConcurrentFuture]:
        """Queue ``(prompt, num_samples, params)`` requests as one unit: they decode together and with no other
        request, so their logprobs do not depend on what else arrived meanwhile (``sample_queue.py``). A bad request
        fails on its own future; the others still go."""
        futures: list[AwaitableConcurrentFuture | None] = []
        unit = []
        for prompt, num_samples, params in requests:
            try:
                unit.append((handle, self._sample_job(handle, prompt, num_samples, params), ScoreRequest()))
                futures.append(None)
            except Exception as exc:
                futures.append(_failed(exc))
        queued = iter(self._samples.submit_unit(unit) if unit else [])
        return [future if future is not None else next(queued) for future in futures]

    def _sample_job(self, handle: SamplerHandle, prompt: types.ModelInput, num_samples: int,
                    params: types.SamplingParams, watch: Watch | None = None) -> SampleJob:
        if not isinstance(num_samples, int) or num_samples < 1:
            raise SamplingError(f"num_samples must be a positive integer, got {num_samples!r}")
        if not isinstance(params, types.SamplingParams):
            raise SamplingError(f"sampling_params must be a tinker SamplingParams, got {type(params).__name__}")
        vocab_size = self._vocab_size(handle.host)
        tokens = model_input_tokens(prompt, vocab_size, "prompt")
        if not tokens:
            raise SamplingError("prompt is empty; give at least one token")
        base = handle.host.base
        settings = resolve_params(params, len(tokens), _context_len(base.model), _eos_ids(base), vocab_size)
        with self._rng_lock:  # handle.rng is shared by every request of one client
            seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=handle.rng))
        return SampleJob(tokens, num_samples, settings, torch.Generator().manual_seed(seed), watch)

    def compute_logprobs(self, handle: SamplerHandle, prompt: types.ModelInput) -> list[float | None]:
        tokens = model_input_tokens(prompt, self._vocab_size(handle.host), "prompt")
        with handle.host.active(handle.adapter) as model:
            values = self._prompt_logprobs(model, tokens, handle.host.base.tokenizer.pad_token_id)
        return [None, *values[1:].tolist()]

    def compute_topk_logprobs(self, handle: SamplerHandle, prompt: types.ModelInput, k: int) -> PromptTopk:
        """``compute_logprobs`` and the ``k`` most likely tokens at each position after the first. A plain forward
        picks each position's k candidates (``scores.topk_candidates``); the trainer's forward then scores them and
        the prompt's own tokens together, so a candidate that is the prompt's token carries exactly its logprob (an
        OpenAI client's "is the prompt the greedy continuation" check compares the two)."""
        vocab_size = self._vocab_size(handle.host)
        tokens = model_input_tokens(prompt, vocab_size, "prompt")
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= vocab_size:
            raise SamplingError(f"k={k!r} must be an integer in [0, {vocab_size}] (0 = the logprobs alone)")
        if len(tokens) > (context := _context_len(handle.host.base.model)):
            raise ContextFullError(f"the prompt has {len(tokens)} tokens, more than the model's context of {context}; "
                                   "shorten it")
        if len(tokens) < 2:
            return PromptTopk([None] * len(tokens), [None] * len(tokens))
        with handle.host.active(handle.adapter) as model:
            candidates = topk_candidates(model, tokens, k) if k else torch.empty((len(tokens) - 1, 0), dtype=torch.long)
            targets = torch.cat([torch.tensor(tokens[1:])[:, None], candidates], dim=1)  # (T - 1, 1 + k)
            values = self._target_logprobs(model, tokens, targets, handle.host.base.tokenizer.pad_token_id)
        rows = [sorted(zip(ids.tolist(), lps.tolist(), strict=True), key=lambda pair: -pair[1])
                for ids, lps in zip(candidates, values[:, 1:], strict=True)]
        return PromptTopk([None, *values[:, 0].tolist()], [None, *rows])

    def _prompt_logprobs(self, model: torch.nn.Module, tokens: list[int], pad_id: int) -> np.ndarray:  # (T,)
        """log p(token_i | tokens_<i) for i >= 1, NaN at position 0. Computed exactly as ``forward`` computes a
        datum of these tokens (same function, same shapes), so the two agree to the bit at equal weights, in either
        precision; the loop's sampler-freshness probe relies on that."""
        if len(tokens) < 2:
            return np.full(len(tokens), np.nan, dtype=np.float32)
        values = self._target_logprobs(model, tokens, torch.tensor(tokens[1:]), pad_id)
        return np.concatenate([[np.nan], values.numpy()]).astype(np.float32)

    @torch.inference_mode()
    def _target_logprobs(self, model: torch.nn.Module, tokens: list[int], targets: torch.Tensor,
                         pad_id: int) -> torch.Tensor:  # (T - 1,) or (T - 1, K), float32 on the CPU
        """log p(targets[i] | tokens_<=i) for a target (T - 1,) or K targets (T - 1, K) a position, by the
        trainer's forward over ``tokens[:-1]`` as one datum."""
        values: list[torch.Tensor] = []
        for batch in self._plan_tokens([tokens[:-1]]):
            values += self._batch_logprobs(model, [torch.tensor(tokens[:-1])], [targets], batch, pad_id).values()
        return torch.cat(values).float().cpu()

    @staticmethod
    def _vocab_size(host: AdapterHost) -> int:
        return host.base.model.get_input_embeddings().num_embeddings


def _requested(numerics: Numerics | None, precision: str | None, device: str | torch.device | None,
               environment: bool = True) -> Numerics:
    """The policy an engine is asked for: ``numerics`` (None: the environment's, ``Numerics.resolve()``, or with
    ``environment`` False nothing set), with ``precision`` and ``device`` in its place where given."""
    device = str(device) if isinstance(device, torch.device) else device
    if numerics is None:
        return Numerics.resolve(precision=precision, device=device) if environment else \
            Numerics(precision=precision, device=device)
    changes = {k: v for k, v in (("precision", precision), ("device", device)) if v is not None}
    return dataclasses.replace(numerics, **changes) if changes else numerics


def _context_len(model: torch.nn.Module) -> int:
    return int(getattr(model.config, "max_position_embeddings", 2048))


def _eos_ids(base) -> list[int]:
    ids = set()
    if base.tokenizer.eos_token_id is not None:
        ids.add(base.tokenizer.eos_token_id)
    generation_eos = getattr(getattr(base.model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return sorted(ids)



def _failed(exc: Exception) -> AwaitableConcurrentFuture:
    """A future that already holds ``exc``."""
    future: Future = Future()
    future.set_exception(exc)
    return AwaitableConcurrentFuture(future)


def _output(logprobs: list[torch.Tensor], metrics: dict[str, float]) -> types.ForwardBackwardOutput:
    return types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord",
        loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(lp.cpu())} for lp in logprobs],
        metrics=metrics,
    )

