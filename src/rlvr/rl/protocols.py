"""The client API the loop drives, as protocols: ``ServiceAPI``, ``TrainingAPI``, ``SamplingAPI``, and the reward
runner it scores with, ``RewardScorer``.

Two class trees implement it: the in-process clients (``rlvr.client``: ``ServiceClient``, ``TrainingClient``,
``SamplingClient``) and the Ray clients (``rlvr.distributed.clients``: ``RayServiceClient`` and the clients it
makes). Neither imports this module: they satisfy it by shape, which the type checker verifies and
``tests/rl/test_protocols.py`` checks at run time too. The loop library and the run application are typed against
these protocols only, so a mode, a phase or a dataset works on either backend without asking which one it has.

Contract: names and parameters are Tinker's (``tinker.ServiceClient`` and its clients), limited to what the loop
and the application call, plus three of rlvr's own: ``SamplingAPI.sample_many`` (a step's requests as one unit),
``ServiceAPI.distributed_metrics`` (worker restarts and retries so far; ``{}`` in process) and
``ServiceAPI.close`` (end the workers a failed run started; nothing to end in process). Every training and
sampling call returns a Tinker future (``.result()``); calls on one training client run in submission order.

``RewardScorer`` is what ``rlvr.rewards.RewardRunner`` (killable worker processes) and
``rlvr.distributed.rewards.RayRewardRunner`` (reward actors) both offer: ``score`` never raises for a reward that
fails or hangs, it counts it in the ``BatchScores``.

Not here: the implementations, the ``*_async`` twins (the loop is synchronous), the server's streaming calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, Self

from tinker.lib.public_interfaces.api_future import APIFuture

from rlvr import types
from rlvr.rewards.registry import RewardItem
from rlvr.rewards.runner import BatchScores

__all__ = ["RewardScorer", "SamplingAPI", "ServiceAPI", "TrainingAPI"]


class SamplingAPI(Protocol):
    """Samples from one frozen set of weights."""

    @property
    def model_path(self) -> str | None:
        """The sampler weights' ``rlvr://`` path; None for an untrained base model."""

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0
               ) -> APIFuture[types.SampleResponse]:
        """``num_samples`` continuations of ``prompt``, each with one logprob per sampled token."""

    def sample_many(self, requests: Sequence[tuple[types.ModelInput, int, types.SamplingParams]]
                    ) -> Sequence[APIFuture[types.SampleResponse]]:
        """``sample(prompt, num_samples, params)`` for each request, sent as one unit (rlvr's own)."""

    def compute_logprobs(self, prompt: types.ModelInput) -> APIFuture[list[float | None]]:
        """log p(token_i | tokens_<i) for every prompt token; None for the first."""

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (a ``transformers`` tokenizer)."""

    def get_base_model(self) -> str:
        """The name of the base model the weights sit on."""


class TrainingAPI(Protocol):
    """Trains one LoRA adapter."""

    @property
    def model_id(self) -> str:
        """The adapter's run id, which its ``rlvr://`` paths name."""

    def forward(self, data: list[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
                ) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-token logprobs without gradients."""

    def forward_backward(self, data: list[types.Datum], loss_fn: str,
                         loss_fn_config: Mapping[str, float] | None = None
                         ) -> APIFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn`` summed over ``data``."""

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: Callable[..., Any]
                                ) -> APIFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn(data, logprobs_list) -> (loss, metrics)``."""

    def optim_step(self, optim_params: types.OptimParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        """One step of the client's optimizer on the gradients accumulated since the last one."""

    def save_state(self, name: str) -> APIFuture[types.SaveWeightsResponse]:
        """Save weights, optimizer and RNG state as ``rlvr://<run>/weights/<name>``."""

    def load_state(self, path: str) -> APIFuture[types.LoadWeightsResponse]:
        """Load weights saved by ``save_state``; the optimizer starts fresh."""

    def load_state_with_optimizer(self, path: str) -> APIFuture[types.LoadWeightsResponse]:
        """Load weights, optimizer and RNG state saved by ``save_state``."""

    def save_weights_for_sampler(self, name: str) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Save the current weights for ``ServiceAPI.create_sampling_client``."""

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> SamplingAPI:
        """A sampling client on the current weights (written to disk too when ``name`` is given)."""

    def get_info(self) -> types.GetInfoResponse:
        """The adapter's model, rank and optimizer."""

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (a ``transformers`` tokenizer)."""


class ServiceAPI(Protocol):
    """Creates training and sampling clients."""

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict[str, str] | None = None) -> TrainingAPI:
        """A training client for a new LoRA adapter on ``base_model`` (``seed`` fixes its initial weights)."""

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict[str, str] | None = None) -> TrainingAPI:
        """A training client with the weights saved at ``path`` and a fresh optimizer."""

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None,
                                                         user_metadata: dict[str, str] | None = None
                                                         ) -> TrainingAPI:
        """A training client resuming exactly from ``path``: weights, optimizer state, step and RNG state."""

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None) -> SamplingAPI:
        """A sampling client for saved sampler weights (``model_path``) or an untrained ``base_model``."""

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The models this service loads."""

    def distributed_metrics(self) -> dict[str, float]:
        """Worker restarts and re-sent requests since the start (``distributed/...``); ``{}`` with no workers."""

    def close(self) -> None:
        """End the workers this service started (a failed run's); nothing to end for an in-process service."""


class RewardScorer(Protocol):
    """Scores answers with one reward, in workers that a context (``with``) starts and ends."""

    def score(self, items: Sequence[RewardItem]) -> BatchScores:
        """One score per item, in order; a reward that raises or hangs is a failure counted in the result."""

    def close(self) -> None:
        """End the workers (idempotent; using the runner again starts new ones)."""

    def __enter__(self) -> Self:
        """Start the workers where they are not running yet."""

    def __exit__(self, *exc_info: object) -> None:
        """``close``."""
