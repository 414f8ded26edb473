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

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from transformers import PreTrainedTokenizerBase

from rlvr.engine.device import resolve_device
from rlvr.engine.engine import CustomLossFn, Engine, SamplerHandle, Trainer
from rlvr.engine.lora import LORA_ALPHA, LoraSpec
from rlvr.errors import ConfigurationError
from rlvr.precision import base_precision

__all__ = ["LORA_ALPHA", "SamplingClient", "ServiceClient", "TrainingClient"]


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
                 device: str | torch.device | None = None, **_ignored: Any) -> None:
        """Clients on the process's shared engine, whose frozen base matmuls multiply in ``precision`` (``"float32"``
        or ``"bfloat16"``; None: ``$RLVR_PRECISION``, else the device's default; see ``rlvr.precision``) on
        ``device``, or on ``engine``, an engine of your own. Tinker's ``api_key``, ``base_url`` and other connection
        settings mean nothing in-process and are ignored."""
        self.engine = _engine(engine, precision, device)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
    ) -> TrainingClient:
        """A TrainingClient for a new LoRA adapter on ``base_model`` ('tiny', 'smollm2-135m', a path, a hub id).

        ``seed`` fixes the adapter's initial weights (None: random).
        """
        spec = LoraSpec(rank=rank, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed)
        trainer = self.engine.run(self.engine.create_trainer, base_model, spec, seed)
        return TrainingClient(self, trainer)

    async def create_lora_training_client_async(self, base_model: str, **kwargs: Any) -> TrainingClient:
        return self.create_lora_training_client(base_model, **kwargs)

    def create_training_client_from_state(self, path: str, user_metadata: dict[str, str] | None = None
                                          ) -> TrainingClient:
        """A TrainingClient with the weights saved at ``path`` (a save_state path) and a fresh optimizer."""
        return TrainingClient(self, self.engine.run(self.engine.trainer_from_state, path, False))

    async def create_training_client_from_state_async(self, path: str, **kwargs: Any) -> TrainingClient:
        return self.create_training_client_from_state(path, **kwargs)

    def create_training_client_from_state_with_optimizer(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> TrainingClient:
        """A TrainingClient resuming exactly from ``path``: weights, AdamW moments, step and RNG state."""
        return TrainingClient(self, self.engine.run(self.engine.trainer_from_state, path, True))

    async def create_training_client_from_state_with_optimizer_async(self, path: str, **kwargs: Any
                                                                     ) -> TrainingClient:
        return self.create_training_client_from_state_with_optimizer(path, **kwargs)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               **_ignored: Any) -> SamplingClient:
        """A SamplingClient for saved sampler weights (``model_path``) or for an untrained ``base_model``."""
        handle = self.engine.run(self.engine.sampler, model_path, base_model)
        return SamplingClient(self.engine, handle)

    async def create_sampling_client_async(self, model_path: str | None = None, base_model: str | None = None,
                                           **kwargs: Any) -> SamplingClient:
        return self.create_sampling_client(model_path, base_model, **kwargs)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        from rlvr.engine.models import SMOLLM2

        return types.GetServerCapabilitiesResponse(
            supported_models=[types.SupportedModel(model_name=name) for name in ("tiny", SMOLLM2)])


class TrainingClient(_SelfFuture):
    """Trains one LoRA adapter: forward_backward, optim_step, checkpoints, sampler snapshots."""

    def __init__(self, service: ServiceClient, trainer: Trainer) -> None:
        self.service = service
        self.engine = service.engine
        self._trainer = trainer
        self.model_id = trainer.run_id

    # Training ------------------------------------------------------------------------------------------------------

    def forward(self, data: list[types.Datum], loss_fn: str,
                loss_fn_config: Mapping[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-token logprobs without gradients."""
        return self.engine.submit(self.engine.forward, self._trainer, data, loss_fn, _dict(loss_fn_config), False)

    def forward_backward(self, data: list[types.Datum], loss_fn: str,
                         loss_fn_config: Mapping[str, float] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn`` (see ``rlvr.engine.losses.LOSSES``) summed over ``data``."""
        return self.engine.submit(self.engine.forward, self._trainer, data, loss_fn, _dict(loss_fn_config), True)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: CustomLossFn
                                ) -> APIFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn(data, logprobs_list) -> (loss, metrics)``; each ``logprobs_list[i]``
        holds datum i's target-token logprobs and carries gradient."""
        return self.engine.submit(self.engine.forward_backward_custom, self._trainer, data, loss_fn)

    def optim_step(self, adam_params: types.AdamParams) -> APIFuture[types.OptimStepResponse]:
        """One AdamW step on the gradients accumulated since the last step; metrics hold ``grad_norm:mean``."""
        return self.engine.submit(self.engine.optim_step, self._trainer, adam_params)

    async def forward_async(self, data: list[types.Datum], loss_fn: str,
                            loss_fn_config: Mapping[str, float] | None = None) -> APIFuture:
        return self.forward(data, loss_fn, loss_fn_config)

    async def forward_backward_async(self, data: list[types.Datum], loss_fn: str,
                                     loss_fn_config: Mapping[str, float] | None = None) -> APIFuture:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    async def forward_backward_custom_async(self, data: list[types.Datum], loss_fn: CustomLossFn) -> APIFuture:
        return self.forward_backward_custom(data, loss_fn)

    async def optim_step_async(self, adam_params: types.AdamParams) -> APIFuture:
        return self.optim_step(adam_params)

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

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> SamplingClient:
        """A SamplingClient on a snapshot of the current weights (written to disk too when ``name`` is given)."""
        path = self.engine.run(self.engine.save_for_sampler, self._trainer, name)
        return self.service.create_sampling_client(model_path=path)

    async def save_state_async(self, name: str) -> APIFuture:
        return self.save_state(name)

    async def load_state_async(self, path: str) -> APIFuture:
        return self.load_state(path)

    async def load_state_with_optimizer_async(self, path: str) -> APIFuture:
        return self.load_state_with_optimizer(path)

    async def save_weights_for_sampler_async(self, name: str) -> APIFuture:
        return self.save_weights_for_sampler(name)

    async def save_weights_and_get_sampling_client_async(self, name: str | None = None) -> SamplingClient:
        return self.save_weights_and_get_sampling_client(name)

    # Information ---------------------------------------------------------------------------------------------------

    def get_info(self) -> types.GetInfoResponse:
        base = self._trainer.host.base
        return types.GetInfoResponse(
            model_data=types.ModelData(arch=base.model.config.model_type, model_name=base.name, tokenizer_id=base.name),
            model_id=self.model_id,
            is_lora=True,
            lora_rank=self._trainer.spec.rank,
            model_name=base.name,
        )

    async def get_info_async(self) -> types.GetInfoResponse:
        return self.get_info()

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self._trainer.host.base.tokenizer

    def parameters(self) -> dict[str, torch.Tensor]:
        """A copy of the adapter's current weights (for inspection and tests; not part of Tinker's API)."""
        adapter = self._trainer.adapter
        return self.engine.run(lambda: {n.replace(f".{adapter}.", "."): p.detach().clone()
                                        for n, p in self._trainer.host.parameters(adapter).items()})


class SamplingClient(_SelfFuture):
    """Samples from one frozen set of weights."""

    def __init__(self, engine: Engine, handle: SamplerHandle) -> None:
        self.engine = engine
        self._handle = handle
        self.model_path = handle.model_path
        if handle.model_path is not None:  # Free the snapshot's adapter once no client uses it.
            weakref.finalize(self, engine.release_sampler_later, handle.model_path)

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> APIFuture[types.SampleResponse]:
        """``num_samples`` continuations of ``prompt``; each has tokens, one logprob per token (under the model at
        temperature 1, see ``rlvr.engine.sampler``) and a stop reason (``"stop"`` or ``"length"``)."""
        if topk_prompt_logprobs:
            raise ConfigurationError("topk_prompt_logprobs is not supported yet; use include_prompt_logprobs=True")
        return self.engine.submit_sample(self._handle, prompt, num_samples, sampling_params, include_prompt_logprobs)

    async def sample_async(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
                           include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0
                           ) -> types.SampleResponse:
        return await self.sample(prompt, num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs)

    def compute_logprobs(self, prompt: types.ModelInput) -> APIFuture[list[float | None]]:
        """log p(token_i | tokens_<i) for every prompt token; None for the first."""
        return self.engine.submit(self.engine.compute_logprobs, self._handle, prompt)

    async def compute_logprobs_async(self, prompt: types.ModelInput) -> list[float | None]:
        return await self.compute_logprobs(prompt)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self._handle.host.base.tokenizer

    def get_base_model(self) -> str:
        return self._handle.host.base.name


def _engine(engine: Engine | None, precision: str | None, device: str | torch.device | None = None) -> Engine:
    """The engine a ServiceClient runs on: ``engine`` when given (and then ``precision`` and ``device``, if given,
    must be its own), else the process's shared one in ``precision`` on ``device``."""
    if engine is None:
        return Engine.default(precision, device)
    if device is not None and resolve_device(device) != engine.device:
        raise ConfigurationError(f"device={device!r}, but the engine given runs on {engine.device}: drop one")
    if precision is not None and base_precision(precision) != engine.precision:
        raise ConfigurationError(f"ServiceClient(engine=..., precision={precision!r}): that engine multiplies in "
                                 f"{engine.precision}; leave precision unset, or pass an engine created with "
                                 f"Engine(precision={precision!r})")
    return engine


def _dict(config: Mapping[str, float] | None) -> dict[str, float] | None:
    return None if config is None else dict(config)

