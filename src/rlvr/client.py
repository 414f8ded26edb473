"""ServiceClient, TrainingClient and SamplingClient: Tinker's client API, running on the in-process engine.

Names and signatures follow the ``tinker`` SDK, so swapping ``tinker.ServiceClient()`` for
``rlvr.ServiceClient()`` is the only change a Tinker loop needs. Every call on a training or sampling client
returns a future (``.result()``, or ``await`` it); calls run in the order they were submitted, so::

    fwd = training_client.forward_backward(data, "importance_sampling")
    opt = training_client.optim_step(types.AdamParams(learning_rate=1e-4))
    fwd.result(); opt.result()

is safe. ``*_async`` variants are coroutines returning the same futures. Client creation is synchronous here (a
model loads in well under a second once cached); the returned client also answers ``.result()`` and ``await`` with
itself, as code written for SDK >= 0.38 (where creation returns a future) expects.

``LORA_ALPHA`` is every adapter's LoRA alpha (an update is scaled by alpha / rank), exported here so that the RL
layer, which drives only this API, need not import the engine.

Not here: model math (``rlvr.engine``).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from transformers import PreTrainedTokenizerBase

from rlvr.engine import checkpoint
from rlvr.engine.device import resolve_device
from rlvr.engine.engine import CustomLossFn, Engine, Trainer
from rlvr.engine.models.load import canonical_name
from rlvr.engine.models.lora import LORA_ALPHA, LoraSpec
from rlvr.engine.sample.scores import PromptTopk, ScoreRequest
from rlvr.engine.sample.watch import Watch
from rlvr.engine.sample_queue import SamplerHandle
from rlvr.engine.train.optim import check_params_for, config_of, kind_of, kind_of_config
from rlvr.errors import ConfigurationError
from rlvr.numerics import Numerics, base_precision, run_default_precision

__all__ = ["LORA_ALPHA", "SamplingClient", "ServiceClient", "TrainingClient", "check_base_model", "check_loss",
           "resolve_numerics", "run_precision"]


def _async_of(method: Callable[..., Any], awaited: bool = False) -> Callable[..., Any]:
    """The ``<name>_async`` twin of ``method`` (a method of the class being defined): a coroutine function with its
    parameters and docstring that calls ``self.<name>`` and returns what it returns, as tinker's training and
    ``create_*`` twins do (the future, the client); with ``awaited``, what that future resolves to, as tinker's
    ``sample_async`` and ``compute_logprobs_async`` do."""
    name = method.__name__
    if awaited:
        async def twin(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self, name)(*args, **kwargs)
    else:
        async def twin(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self, name)(*args, **kwargs)

    functools.update_wrapper(twin, method)  # docstring, module; __wrapped__ resolves its annotations' names
    twin.__name__, twin.__qualname__ = f"{name}_async", f"{method.__qualname__}_async"
    signature = inspect.signature(method)
    if awaited:  # "APIFuture[X]" -> "X"
        returns = signature.return_annotation
        returns = returns[returns.index("[") + 1:-1] if isinstance(returns, str) and "[" in returns else returns
        signature = signature.replace(return_annotation=returns)
    twin.__annotations__ = {**method.__annotations__, "return": signature.return_annotation}
    twin.__signature__ = signature  # type: ignore[attr-defined]  # what inspect.signature shows
    return twin


def optim_params_of(optim_params: Any, adam_params: Any) -> Any:
    """The params of an ``optim_step(optim_params, *, adam_params)`` call as Tinker's SDK takes it (one of the two;
    ``adam_params=`` is its older keyword for AdamParams)."""
    if (optim_params is None) == (adam_params is None):
        raise ConfigurationError("optim_step takes one of optim_params (types.AdamParams or types.DimuonParams) and "
                                 f"adam_params, got {'both' if optim_params is not None else 'neither'}")
    return optim_params if optim_params is not None else adam_params


def adam_of(optim_params: Any, adam_params: Any) -> types.AdamParams:
    """The AdamParams of an ``optim_step`` call to a client that trains with AdamW only (the Ray trainer's)."""
    params = optim_params_of(optim_params, adam_params)
    if not isinstance(params, types.AdamParams):
        raise ConfigurationError(f"optim_step: this client trains with AdamW, so it takes types.AdamParams, got "
                                 f"{type(params).__name__}")
    return params


class _SelfFuture:
    """Lets ``client.result()`` and ``await client`` return the client itself (SDK >= 0.38 creation style)."""

    def result(self, timeout: float | None = None) -> Any:
        return self

    async def result_async(self, timeout: float | None = None) -> Any:
        return self

    def __await__(self):
        return self.result_async().__await__()


class ServiceClient:
    """Entry point: creates training and sampling clients on the local engine.

    >>> service_client = rlvr.ServiceClient()  # or ServiceClient(precision="bfloat16")
    >>> training_client = service_client.create_lora_training_client(base_model="tiny", rank=8)

    ``device``: where the process's engine computes, "auto" (a CUDA GPU when there is one), "cpu", "cuda" or
    "cuda:N" (None: ``RLVR_DEVICE``, else "auto"); see ``rlvr.engine.device``.
    """

    def __init__(self, engine: Engine | None = None, *, precision: str | None = None,
                 device: str | torch.device | None = None, numerics: Numerics | None = None,
                 **_ignored: Any) -> None:
        """Clients on the process's shared engine, which computes by ``numerics`` (``rlvr.numerics``; None: the
        environment's), its frozen base matmuls in ``precision`` (``"float32"`` or ``"bfloat16"``; None: the
        policy's, else the device's default) on ``device``, or on ``engine``, an engine of your own. Tinker's
        ``api_key``, ``base_url`` and other connection settings mean nothing in-process and are ignored."""
        self.engine = _engine(engine, precision, device, numerics)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> TrainingClient:
        """A TrainingClient for a new LoRA adapter on ``base_model`` ('tiny', 'smollm2-135m', a path, a hub id).

        ``seed`` fixes the adapter's initial weights (None: random). ``optimizer`` is fixed for the client's life:
        ``types.AdamOptimizerConfig()`` (None, the default) or ``types.DimuonOptimizerConfig()``.
        """
        spec = LoraSpec(rank=rank, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed)
        trainer = self.engine.run(self.engine.create_trainer, base_model, spec, seed, kind_of_config(optimizer))
        return TrainingClient(self, trainer)

    create_lora_training_client_async = _async_of(create_lora_training_client)

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict[str, str] | None = None, *,
                                          optimizer: types.OptimizerConfig | None = None) -> TrainingClient:
        """A TrainingClient with the weights saved at ``path`` (a save_state path) and a fresh ``optimizer`` (AdamW
        unless given). ``base_model``, when given, must be the one the state was trained on (the state records it)."""
        return TrainingClient(self, self._trainer_from_state(path, base_model, False, kind_of_config(optimizer)))

    create_training_client_from_state_async = _async_of(create_training_client_from_state)

    def create_training_client_from_state_with_optimizer(
        self, path: str, base_model: str | None = None, user_metadata: dict[str, str] | None = None
    ) -> TrainingClient:
        """A TrainingClient resuming exactly from ``path``: weights, its optimizer (AdamW or Dimuon) and that
        optimizer's state, step and RNG state. ``base_model``, when given, must be the one the state was trained on
        (the state records it)."""
        return TrainingClient(self, self._trainer_from_state(path, base_model, True))

    create_training_client_from_state_with_optimizer_async = _async_of(
        create_training_client_from_state_with_optimizer)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config: Any = None, record_stability_info: bool = False,
                               **_ignored: Any) -> SamplingClient:
        """A SamplingClient for saved sampler weights (``model_path``) or for an untrained ``base_model``.

        ``record_stability_info`` is accepted as Tinker takes it: rlvr's ``stable_reinforce`` needs nothing recorded
        beyond each datum's ``logprobs`` and provenance, and every sequence already carries a ``sequence_id``."""
        handle = self.engine.run(self.engine.sampler, model_path, base_model)
        return SamplingClient(self.engine, handle)

    create_sampling_client_async = _async_of(create_sampling_client)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        from rlvr.engine.models.load import SMOLLM2

        return types.GetServerCapabilitiesResponse(
            supported_models=[types.SupportedModel(model_name=name) for name in ("tiny", SMOLLM2)])

    get_server_capabilities_async = _async_of(get_server_capabilities)

    def distributed_metrics(self) -> dict[str, float]:
        """Worker restarts and re-sent requests (rlvr's own, not Tinker's: the Ray service's counters, for the loop's
        client protocol): none in process, so ``{}``."""
        return {}

    def close(self) -> None:
        """Nothing to end: the clients run on the process's engine, which outlives them (the Ray service ends its
        actors here)."""

    def _trainer_from_state(self, path: str, base_model: str | None, with_optimizer: bool,
                            optimizer: str = "adamw") -> Trainer:
        if base_model is not None:
            trained_on = checkpoint.read_meta(path)[1]["base_model"]
            if canonical_name(base_model) != canonical_name(trained_on):
                raise ConfigurationError(f"base_model={base_model!r}, but {path} was trained on {trained_on!r}; leave "
                                         "base_model out (the state records it) or pass that one")
        return self.engine.run(self.engine.trainer_from_state, path, with_optimizer, optimizer)


class TrainingClient(_SelfFuture):
    """Trains one LoRA adapter: forward_backward, optim_step, checkpoints, sampler snapshots."""

    def __init__(self, service: ServiceClient, trainer: Trainer) -> None:
        self.service = service
        self.engine = service.engine
        self._trainer = trainer
        self.model_id = trainer.run_id
        # Free the adapter and its optimizer state once the client is gone (a server's clients come and go).
        weakref.finalize(self, self.engine.release_trainer_later, trainer)

    # Training ------------------------------------------------------------------------------------------------------

    def forward(self, data: list[types.Datum], loss_fn: str,
                loss_fn_config: Mapping[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-token logprobs without gradients."""
        return self.engine.submit(self.engine.forward, self._trainer, data, loss_fn, _dict(loss_fn_config), False)

    def forward_backward(self, data: list[types.Datum], loss_fn: str,
                         loss_fn_config: Mapping[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn`` (see ``rlvr.engine.train.losses.LOSSES``) summed over ``data``."""
        return self.engine.submit(self.engine.forward, self._trainer, data, loss_fn, _dict(loss_fn_config), True)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: CustomLossFn
                                ) -> APIFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn(data, logprobs_list) -> (loss, metrics)``; each ``logprobs_list[i]``
        holds datum i's target-token logprobs and carries gradient."""
        return self.engine.submit(self.engine.forward_backward_custom, self._trainer, data, loss_fn)

    def optim_step(self, optim_params: types.OptimParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        """One step of the client's optimizer on the gradients accumulated since the last step; metrics hold
        ``grad_norm:mean``. The parameters come as Tinker takes them: ``optim_params`` (positional: AdamParams for
        AdamW, DimuonParams for Dimuon; the other kind is refused) or the older ``adam_params=``."""
        params = optim_params_of(optim_params, adam_params)
        check_params_for(kind_of(self._trainer.optimizer), params)
        return self.engine.submit(self.engine.optim_step, self._trainer, params)

    forward_async = _async_of(forward)
    forward_backward_async = _async_of(forward_backward)
    forward_backward_custom_async = _async_of(forward_backward_custom)
    optim_step_async = _async_of(optim_step)

    # Checkpoints ---------------------------------------------------------------------------------------------------

    def save_state(self, name: str) -> APIFuture[types.SaveWeightsResponse]:
        """Save weights, optimizer and RNG state as ``rlvr://<run>/weights/<name>`` (atomically)."""
        return self.engine.submit(self.engine.save_state, self._trainer, name)

    def load_state(self, path: str) -> APIFuture[types.LoadWeightsResponse]:
        """Load weights saved by save_state; the optimizer starts fresh."""
        return self.engine.submit(self.engine.load_state, self._trainer, path, False)

    def load_state_with_optimizer(self, path: str) -> APIFuture[types.LoadWeightsResponse]:
        """Load weights, optimizer and RNG state saved by save_state."""
        return self.engine.submit(self.engine.load_state, self._trainer, path, True)

    def save_weights_for_sampler(self, name: str) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Save the current weights as ``rlvr://<run>/sampler_weights/<name>`` for create_sampling_client."""

        def job() -> types.SaveWeightsForSamplerResponse:
            return types.SaveWeightsForSamplerResponse(path=self.engine.save_for_sampler(self._trainer, name))

        return self.engine.submit(job)

    def save_weights_and_get_sampling_client(self, name: str | None = None, retry_config: Any = None,
                                             record_stability_info: bool = False) -> SamplingClient:
        """A SamplingClient on a snapshot of the current weights (written to disk too when ``name`` is given);
        ``record_stability_info`` as in ``ServiceClient.create_sampling_client``."""
        path = self.engine.run(self.engine.save_for_sampler, self._trainer, name)
        return self.service.create_sampling_client(model_path=path, record_stability_info=record_stability_info)

    save_state_async = _async_of(save_state)
    load_state_async = _async_of(load_state)
    load_state_with_optimizer_async = _async_of(load_state_with_optimizer)
    save_weights_for_sampler_async = _async_of(save_weights_for_sampler)
    save_weights_and_get_sampling_client_async = _async_of(save_weights_and_get_sampling_client)

    # Information ---------------------------------------------------------------------------------------------------

    def get_info(self) -> types.GetInfoResponse:
        base = self._trainer.host.base
        return types.GetInfoResponse(
            model_data=types.ModelData(arch=base.model.config.model_type, model_name=base.name, tokenizer_id=base.name),
            model_id=self.model_id,
            is_lora=True,
            lora_rank=self._trainer.spec.rank,
            model_name=base.name,
            optimizer_config=config_of(self._trainer.optimizer),
        )

    get_info_async = _async_of(get_info)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self._trainer.host.base.tokenizer

    def parameters(self) -> dict[str, torch.Tensor]:
        """A copy of the adapter's current weights, on the CPU whatever the engine's device (for inspection and tests;
        not part of Tinker's API)."""
        adapter = self._trainer.adapter
        return self.engine.run(lambda: {n.replace(f".{adapter}.", "."): p.detach().to("cpu", copy=True)
                                        for n, p in self._trainer.host.parameters(adapter).items()})


class SamplingClient(_SelfFuture):
    """Samples from one frozen set of weights."""

    def __init__(self, engine: Engine, handle: SamplerHandle) -> None:
        self.engine = engine
        self._handle = handle
        self.model_path = handle.model_path
        if handle.model_path is not None:  # Free the snapshot's adapter once no client uses it.
            weakref.finalize(self, engine.release_sampler_later, handle.model_path, handle.adapter)

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> APIFuture[types.SampleResponse]:
        """``num_samples`` continuations of ``prompt``; each has tokens, one logprob per token (under the model at
        temperature 1, see ``rlvr.engine.sample.sampler``) and a stop reason (``"stop"`` or ``"length"``). The other
        arguments are Tinker's optional prompt and sample scores (``rlvr.engine.sample.scores``)."""
        scores = ScoreRequest(include_prompt_logprobs, topk_prompt_logprobs, topk_sample_logprobs,
                              target_prompt_logprobs, prompt_alt_tokens_k, prompt_logprobs_last_n)
        return self.engine.submit_sample(self._handle, prompt, num_samples, sampling_params, scores=scores)

    sample_async = _async_of(sample, awaited=True)  # the response, as tinker's sample_async returns

    def sample_many(self, requests: Sequence[tuple[types.ModelInput, int, types.SamplingParams]]
                    ) -> list[APIFuture[types.SampleResponse]]:
        """``sample(prompt, num_samples, params)`` for each request, decoded together and with no other request
        (rlvr's own, not Tinker's): the same requests then give the same logprobs bit for bit however busy the
        machine is, where requests sent one by one share a batch with whatever arrived meanwhile. The RL loop
        samples a step this way when its client has it."""
        return self.engine.submit_samples(self._handle, requests)

    def sample_watched(self, watch: Watch, prompt: types.ModelInput, num_samples: int,
                       sampling_params: types.SamplingParams, topk_sample_logprobs: int = 0
                       ) -> APIFuture[types.SampleResponse]:
        """``sample`` (rlvr's own) that hands ``watch`` the tokens as they are drawn, while decoding goes on;
        ``watch.cancel()`` stops it (``rlvr.engine.sample.watch``). What is sampled is what ``sample`` would give.
        The OpenAI routes stream this way."""
        return self.engine.submit_sample(self._handle, prompt, num_samples, sampling_params,
                                         scores=ScoreRequest(topk_sample=topk_sample_logprobs), watch=watch)

    def compute_logprobs(self, prompt: types.ModelInput) -> APIFuture[list[float | None]]:
        """log p(token_i | tokens_<i) for every prompt token; None for the first."""
        return self.engine.submit(self.engine.compute_logprobs, self._handle, prompt)

    compute_logprobs_async = _async_of(compute_logprobs, awaited=True)

    def compute_topk_logprobs(self, prompt: types.ModelInput, k: int) -> APIFuture[PromptTopk]:
        """``compute_logprobs`` and the ``k`` most likely tokens at each prompt position after the first, scored by
        the same forward (rlvr's own, not Tinker's: what an OpenAI ``echo`` with ``logprobs`` returns)."""
        return self.engine.submit(self.engine.compute_topk_logprobs, self._handle, prompt, k)

    compute_topk_logprobs_async = _async_of(compute_topk_logprobs, awaited=True)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self._handle.host.base.tokenizer

    def get_base_model(self) -> str:
        return self._handle.host.base.name

    get_base_model_async = _async_of(get_base_model)


def run_precision(precision: str | None, base_model: str) -> str:
    """What a training run on ``base_model`` multiplies its frozen weights in: ``precision``, else
    ``$RLVR_PRECISION``, else on the CPU ``rlvr.numerics.run_default_precision`` (bfloat16 for a model of 300M+
    linear weights where the CPU multiplies bfloat16 in hardware, float32 otherwise), else float32. Read from the
    model's config alone, before anything loads; the run records the answer, and a resume keeps it. Where this
    process's engine already exists (a process holds one), an unset precision is the one it multiplies in."""
    if Numerics.resolve(precision=precision).precision or resolve_device(None).type != "cpu":
        return base_precision(precision)
    if (engine := Engine.current()) is not None:
        return engine.precision
    from rlvr.engine.cpu.packed import native_bfloat16
    from rlvr.engine.models.load import linear_parameters

    native = native_bfloat16()  # where it is not, the model's size is not even read
    return run_default_precision(linear_parameters(base_model) if native else None, native)


def check_base_model(base_model: str) -> None:
    """ConfigurationError / ModelLoadError unless ``base_model`` names something that can load, checked before any
    model loads (``engine/models/load.py`` ``check_base_model``)."""
    from rlvr.engine.models.load import check_base_model as check

    check(base_model)


def check_loss(loss_fn: str, loss_fn_config: Mapping[str, Any] | None, inputs: frozenset[str]) -> None:
    """ConfigurationError unless ``loss_fn`` is a built-in loss (the loss table, ``engine/train/losses.py``) whose
    ``loss_fn_inputs`` a caller that makes ``inputs`` (besides ``target_tokens``) can feed, and ``loss_fn_config``
    holds only its keys, with values that fit it; the error names the losses that fit, and a near one."""
    from rlvr.engine.train.losses import LOSSES, resolve_loss

    usable = sorted(name for name, spec in LOSSES.items() if set(spec.inputs) <= inputs and not spec.provenance)
    if loss_fn in LOSSES and loss_fn not in usable:
        raise ConfigurationError(f"loss_fn={loss_fn!r} needs loss_fn_inputs the RL loop does not make "
                                 f"({sorted(LOSSES[loss_fn].inputs)}); choose one of {usable}")
    if loss_fn not in LOSSES:
        import difflib

        close = difflib.get_close_matches(str(loss_fn), usable, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigurationError(f"loss_fn={loss_fn!r} is not a built-in loss{hint}; choose one of {usable}")
    resolve_loss(loss_fn, dict(loss_fn_config or {}))


def resolve_numerics(numerics: Numerics, *, local: bool = True) -> Numerics:
    """``numerics`` resolved on this machine (``Numerics.resolved``: the concrete precision, device and matmul
    kinds), what a run records: with ``local``, the policy of this process's engine, which is created with
    ``numerics`` where there is none yet (ConfigurationError where the existing one computes otherwise); else (the
    engines are elsewhere: Ray actors) resolved here without an engine, as an engine on this machine would."""
    if local:
        return Engine.default(numerics=numerics).numerics
    from rlvr.engine.device import resolve_numerics as on_this_machine

    return on_this_machine(numerics)


def _engine(engine: Engine | None, precision: str | None, device: str | torch.device | None = None,
            numerics: Numerics | None = None) -> Engine:
    """The engine a ServiceClient runs on: ``engine`` when given (and then ``precision``, ``device`` and
    ``numerics``, if given, must be its own), else the process's shared one by ``numerics``, in ``precision`` on
    ``device``."""
    if engine is None:
        return Engine.default(precision, device, numerics)
    if numerics is not None:
        engine.check_policy(numerics)
    if device is not None and resolve_device(device) != engine.device:
        raise ConfigurationError(f"device={device!r}, but the engine given runs on {engine.device}: drop one")
    if precision is not None and base_precision(precision) != engine.precision:
        raise ConfigurationError(f"ServiceClient(engine=..., precision={precision!r}): that engine multiplies in "
                                 f"{engine.precision}; leave precision unset, or pass an engine created with "
                                 f"Engine(precision={precision!r})")
    return engine


def _dict(config: Mapping[str, float] | None) -> dict[str, float] | None:
    return None if config is None else dict(config)

