"""Tinker-shaped clients whose calls run on Ray actors: RayServiceClient, RayTrainingClient, RaySamplingClient.

What it is: drop-in stand-ins for ``rlvr.ServiceClient`` and the clients it makes, for code that drives only the
Tinker API (the RL loop). Training calls go to the one :class:`~rlvr.distributed.actors.TrainerActor` and run in
submission order; every call returns a future (``.result()`` or ``await``). Sampling requests are spread
round-robin over the sampler replicas, each with its own seed: the request's ``SamplingParams.seed``, or one drawn
here from a generator seeded by the run's seed, so a seeded run samples the same tokens whichever replica serves
each request.

Weight publication is verified: ``save_weights_and_get_sampling_client`` has the trainer write the adapter and hash
it, sends the files to every replica, and returns only once each replica reports holding weights with that hash
(else SamplingError). Each request names the adapter and its hash; a replica that holds other weights under that
name refuses it (SamplingError), and one that lacks them (restarted since) loads them from the files first.

Fault handling: a sampler that dies is restarted by Ray; its requests are re-sent to it once it is back, after it
has reloaded the newest adapter, and ``distributed_metrics()`` counts ``distributed/sampler_restarts`` and
``distributed/sampler_retries``. A trainer that dies is a WorkerLostError: resume from the last checkpoint.

What it is not: the actors themselves (``actors``), reward scoring (``rewards``), or a Tinker server.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tinker import types

from rlvr.client import _async_of, _SelfFuture, adam_of
from rlvr.distributed.cluster import Replicas, import_ray
from rlvr.distributed.futures import ActorFuture
from rlvr.distributed.remote import unwrap
from rlvr.errors import ConfigurationError, SamplingError, WorkerLostError


@dataclass(frozen=True)
class _Publication:
    """One set of weights the samplers serve."""

    key: str
    """The name requests use for it: the trainer's sampler-weights path, or ``base:<model>`` for a base model."""
    digest: str
    """Content hash of its adapter (``weights.adapter_digest``), or ``actors.BASE_DIGEST``."""
    files_ref: Any
    """Ray reference to the adapter folder's files (None for a base model): a replica lacking the adapter loads it."""


class RayServiceClient:
    """Creates training and sampling clients backed by one trainer actor and ``len(samplers)`` sampler actors.

    Made by :func:`rlvr.distributed.ray_backend`; ``close()`` (or ``with``) ends the actors, which otherwise end when
    the last client using them is garbage-collected.
    """

    def __init__(self, trainer: Any, samplers: list[Any], seed: int | None = None) -> None:
        self.ray = import_ray()
        self.trainer = trainer
        self.samplers = Replicas("sampler", samplers, on_restart=self._reload)
        try:
            self.ray.get(trainer.ready.remote())
        except self.ray.exceptions.RayError as exc:
            raise WorkerLostError(f"the trainer actor could not start: {str(exc).splitlines()[0]}") from exc
        self._rng = random.Random(seed)
        self._latest: _Publication | None = None
        self._tokenizers: dict[str, Any] = {}
        self.runners: list[Any] = []
        """Reward runners started with this service (by ray_backend), whose counters distributed_metrics adds."""

    # -- clients --------------------------------------------------------------------------------------------------

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict[str, str] | None = None) -> RayTrainingClient:
        """A training client for a new LoRA adapter on ``base_model``, living in the trainer actor."""
        model_id = self._get(self.trainer.create_lora_training_client.remote(
            base_model=base_model, rank=rank, seed=seed, train_mlp=train_mlp, train_attn=train_attn,
            train_unembed=train_unembed))
        return RayTrainingClient(self, model_id)

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict[str, str] | None = None) -> RayTrainingClient:
        """Weights from ``path`` (a save_state path, resolved on the trainer's machine), fresh optimizer;
        ``base_model``, when given, must be the one the state records."""
        return RayTrainingClient(self, self._get(
            self.trainer.create_training_client_from_state.remote(path, False, base_model)))

    def create_training_client_from_state_with_optimizer(
        self, path: str, base_model: str | None = None, user_metadata: dict[str, str] | None = None
    ) -> RayTrainingClient:
        """Resume exactly from ``path``: weights, AdamW moments, step and RNG state."""
        return RayTrainingClient(self, self._get(
            self.trainer.create_training_client_from_state.remote(path, True, base_model)))

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               **_ignored: Any) -> RaySamplingClient:
        """Sample saved sampler weights (``model_path``, read on the trainer's machine) or the base model."""
        from rlvr.distributed.actors import BASE_DIGEST

        if model_path is not None:
            files_ref, digest_ref, base_ref = self.trainer.read_sampler_weights.options(num_returns=3).remote(
                model_path)
            publication = self.publish(model_path, self._get(digest_ref), files_ref)
            return RaySamplingClient(self, publication, self._get(base_ref))
        if base_model is None:
            raise SamplingError("create_sampling_client needs model_path (a saved sampler checkpoint) or base_model "
                                "(to sample the untrained model)")
        return RaySamplingClient(self, _Publication(f"base:{base_model}", BASE_DIGEST, None), base_model)

    create_lora_training_client_async = _async_of(create_lora_training_client)
    create_training_client_from_state_async = _async_of(create_training_client_from_state)
    create_training_client_from_state_with_optimizer_async = _async_of(
        create_training_client_from_state_with_optimizer)
    create_sampling_client_async = _async_of(create_sampling_client)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        from rlvr.client import ServiceClient

        return ServiceClient.get_server_capabilities(self)  # type: ignore[arg-type]  # the same models load here

    get_server_capabilities_async = _async_of(get_server_capabilities)

    # -- publication ----------------------------------------------------------------------------------------------

    def publish(self, key: str, digest: str, files_ref: Any) -> _Publication:
        """Send adapter ``key`` to every sampler and wait until each holds weights hashing to ``digest``."""
        publication = _Publication(key, digest, files_ref)
        futures = [self.samplers.future(i, "load", key, digest, files_ref) for i in range(len(self.samplers.handles))]
        errors: list[BaseException] = []
        for index, future in enumerate(futures):  # every reply read, so no replica's error goes unreported
            try:
                held = future.result()
            except Exception as exc:
                errors.append(exc)
                continue
            if held != digest:
                errors.append(SamplingError(
                    f"sampler replica {index} reports weights with hash {str(held)[:12]} after publishing {key!r} "
                    f"with hash {digest[:12]}: the weight sync did not happen"))
        if errors:
            raise errors[0]
        self._latest = publication
        return publication

    def _reload(self, index: int) -> None:
        """A restarted sampler reloads the newest adapter before it serves again."""
        latest = self._latest
        if latest is None:
            return
        ray = self.ray
        try:
            held = ray.get(self.samplers.handles[index].load.remote(latest.key, latest.digest, latest.files_ref))
        except ray.exceptions.RayActorError:
            return  # died again: the next request recovers it again
        except ray.exceptions.RayTaskError as exc:
            raise unwrap(exc) from None
        if held != latest.digest:
            raise SamplingError(f"restarted sampler replica {index} holds weights with hash {str(held)[:12]}, "
                                f"expected {latest.digest[:12]}")

    # -- helpers --------------------------------------------------------------------------------------------------

    def _get(self, ref: Any) -> Any:
        """The result of a trainer call; a dead trainer is a WorkerLostError (its state is gone)."""
        return ActorFuture(self.ray, lambda: ref, None, "trainer actor").result()

    def tokenizer_for(self, base_model: str) -> Any:
        """The base model's tokenizer (fetched from the trainer once)."""
        if base_model not in self._tokenizers:
            self._tokenizers[base_model] = self._get(self.trainer.get_tokenizer.remote(None, base_model))
        return self._tokenizers[base_model]

    def next_seed(self) -> int:
        """A seed for a request that brings none, from the run's generator."""
        return self._rng.randrange(2**62)

    def distributed_metrics(self) -> dict[str, float]:
        """Cumulative fault counters since the start: ``distributed/sampler_restarts`` (sampler actor deaths, each
        restarted by Ray) and ``distributed/sampler_retries`` (requests re-sent because their sampler died), plus
        ``distributed/reward_restarts|retries`` of the reward runners in ``runners``."""
        out = {"distributed/sampler_restarts": float(self.samplers.restarts),
               "distributed/sampler_retries": float(self.samplers.retries)}
        for runner in self.runners:
            for key, value in runner.distributed_metrics().items():
                out[key] = out.get(key, 0.0) + value
        return out

    def close(self) -> None:
        """End the trainer and sampler actors (unsaved training state is lost)."""
        for handle in [self.trainer, *self.samplers.handles]:
            self.ray.kill(handle, no_restart=True)

    def __enter__(self) -> RayServiceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RayTrainingClient(_SelfFuture):
    """One LoRA adapter trained in the trainer actor; the methods of ``rlvr.TrainingClient``."""

    def __init__(self, service: RayServiceClient, model_id: str) -> None:
        self.service = service
        self.model_id = model_id
        self._info: types.GetInfoResponse | None = None
        self._tokenizer: Any = None

    def _submit(self, method: str, *args: Any) -> ActorFuture:
        trainer = self.service.trainer
        return ActorFuture(self.service.ray, lambda: trainer.call.remote(self.model_id, method, *args), None,
                           f"trainer actor ({method})")

    def forward(self, data: list[types.Datum], loss_fn: str,
                loss_fn_config: Mapping[str, float] | None = None) -> ActorFuture[types.ForwardBackwardOutput]:
        """Loss and per-token logprobs without gradients."""
        return self._submit("forward", data, loss_fn, _dict(loss_fn_config))

    def forward_backward(self, data: list[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
                         ) -> ActorFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn`` summed over ``data``."""
        return self._submit("forward_backward", data, loss_fn, _dict(loss_fn_config))

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: Any) -> ActorFuture:
        """A custom loss (sent to the trainer with cloudpickle, so it must be importable or defined in __main__)."""
        return self._submit("forward_backward_custom", data, loss_fn)

    def optim_step(self, optim_params: types.OptimParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> ActorFuture[types.OptimStepResponse]:
        """One AdamW step on the gradients accumulated so far (``optim_params`` or the older ``adam_params=``); other
        optimizers' params are refused (ConfigurationError)."""
        return self._submit("optim_step", adam_of(optim_params, adam_params))

    def save_state(self, name: str) -> ActorFuture[types.SaveWeightsResponse]:
        """Save weights, optimizer and RNG state on the trainer's machine as ``rlvr://<run>/weights/<name>``."""
        return self._submit("save_state", name)

    def load_state(self, path: str) -> ActorFuture[types.LoadWeightsResponse]:
        return self._submit("load_state", path)

    def load_state_with_optimizer(self, path: str) -> ActorFuture[types.LoadWeightsResponse]:
        return self._submit("load_state_with_optimizer", path)

    def save_weights_for_sampler(self, name: str) -> ActorFuture[types.SaveWeightsForSamplerResponse]:
        return self._submit("save_weights_for_sampler", name)

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> RaySamplingClient:
        """Publish the current weights to every sampler (verified by hash) and return a client sampling them."""
        path_ref, files_ref, digest_ref = self.service.trainer.publish.options(num_returns=3).remote(
            self.model_id, name)
        path, digest = self.service._get(path_ref), self.service._get(digest_ref)
        publication = self.service.publish(path, digest, files_ref)
        return RaySamplingClient(self.service, publication, self.get_info().model_name)

    def get_info(self) -> types.GetInfoResponse:
        if self._info is None:
            self._info = self.service._get(self.service.trainer.get_info.remote(self.model_id))
        return self._info

    def get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self.service._get(self.service.trainer.get_tokenizer.remote(self.model_id))
            self.service._tokenizers.setdefault(self.get_info().model_name, self._tokenizer)
        return self._tokenizer

    def parameters(self) -> dict[str, Any]:
        """A copy of the adapter's current weights (not part of Tinker's API)."""
        return self.service._get(self.service.trainer.parameters.remote(self.model_id))

    forward_async = _async_of(forward)
    forward_backward_async = _async_of(forward_backward)
    forward_backward_custom_async = _async_of(forward_backward_custom)
    optim_step_async = _async_of(optim_step)
    save_state_async = _async_of(save_state)
    load_state_async = _async_of(load_state)
    load_state_with_optimizer_async = _async_of(load_state_with_optimizer)
    save_weights_for_sampler_async = _async_of(save_weights_for_sampler)
    save_weights_and_get_sampling_client_async = _async_of(save_weights_and_get_sampling_client)
    get_info_async = _async_of(get_info)


class RaySamplingClient(_SelfFuture):
    """Samples one published set of weights on the sampler replicas."""

    def __init__(self, service: RayServiceClient, publication: _Publication, base_model: str) -> None:
        self.service = service
        self._publication = publication
        self._base_model = base_model
        self.model_path = None if publication.key.startswith("base:") else publication.key
        self.digest = publication.digest
        """Content hash of the weights this client samples (the trainer's, verified on every replica)."""

    def _request(self, method: str, *args: Any) -> ActorFuture:
        p = self._publication
        return self.service.samplers.future(self.service.samplers.pick(), method, p.key, p.digest, [p.files_ref],
                                            *args)

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0
               ) -> ActorFuture[types.SampleResponse]:
        """``num_samples`` continuations of ``prompt`` from one replica, with a fixed seed (see module docstring)."""
        if topk_prompt_logprobs:
            raise ConfigurationError("topk_prompt_logprobs is not supported yet; use include_prompt_logprobs=True")
        if sampling_params.seed is None:
            sampling_params = sampling_params.model_copy(update={"seed": self.service.next_seed()})
        return self._request("sample", prompt.to_ints(), num_samples, sampling_params, include_prompt_logprobs)

    sample_async = _async_of(sample, awaited=True)  # the response, as tinker's sample_async returns

    def sample_many(self, requests: Sequence[tuple[types.ModelInput, int, types.SamplingParams]]
                    ) -> list[ActorFuture[types.SampleResponse]]:
        """``sample(prompt, num_samples, params)`` for each request, as the in-process client's ``sample_many``.
        Here each request goes to a replica on its own, and what a replica batches it with depends on timing, so
        the bit-for-bit promise of the in-process client does not hold on Ray (see docs/training.md)."""
        return [self.sample(prompt, n, params) for prompt, n, params in requests]

    def compute_logprobs(self, prompt: types.ModelInput) -> ActorFuture[list[float | None]]:
        """log p(token_i | tokens_<i) for every prompt token; None for the first."""
        return self._request("compute_logprobs", prompt.to_ints())

    compute_logprobs_async = _async_of(compute_logprobs, awaited=True)

    def sample_watched(self, watch: Any, prompt: types.ModelInput, num_samples: int,
                       sampling_params: types.SamplingParams, topk_sample_logprobs: int = 0
                       ) -> ActorFuture[types.SampleResponse]:
        """``sample``, as the in-process client's ``sample_watched`` is called; a replica answers a sample whole, so
        ``watch`` is handed no tokens as they are drawn and its ``cancel`` does not stop the replica (a stream from
        Ray carries each choice whole at its end)."""
        if topk_sample_logprobs:
            raise ConfigurationError("topk_sample_logprobs is not supported on Ray's sampler replicas; leave it 0")
        return self.sample(prompt, num_samples, sampling_params)

    def compute_topk_logprobs(self, prompt: types.ModelInput, k: int) -> ActorFuture[Any]:
        """``compute_logprobs`` and the ``k`` most likely tokens at each prompt position after the first, scored by
        one replica's forward (the in-process client's ``compute_topk_logprobs``)."""
        return self._request("compute_topk_logprobs", prompt.to_ints(), k)

    compute_topk_logprobs_async = _async_of(compute_topk_logprobs, awaited=True)

    def get_tokenizer(self) -> Any:
        return self.service.tokenizer_for(self._base_model)

    def get_base_model(self) -> str:
        return self._base_model

    get_base_model_async = _async_of(get_base_model)


def _dict(config: Mapping[str, float] | None) -> dict[str, float] | None:
    return None if config is None else dict(config)
