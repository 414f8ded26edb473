"""vLLM's token-in/token-out route, ``POST /inference/v1/generate``: a prompt as token ids in; each sample's token
ids, their logprobs and the prompt's token ids out. Trainers that render prompts themselves call it, as verifiers
0.4's ``TrainClient`` does (through ``renderers.client.generate``)::

    POST /inference/v1/generate  {"model": "tiny", "token_ids": [1, 2, 3],
                                  "sampling_params": {"max_tokens": 8, "stop_token_ids": [2], "logprobs": 1}}
    -> {"request_id": ..., "prompt_token_ids": [1, 2, 3], "usage": {...},
        "choices": [{"index": 0, "token_ids": [...], "finish_reason": "stop" | "length",
                     "logprobs": {"content": [{"token": "token_id:<id>", "logprob": ..., "top_logprobs": [...]}]}}]}

``rlvr serve`` mounts it behind its API keys beside the OpenAI routes (``openai.py``), and ``openai_client`` in
process; ``model`` names the sampler as it does there.

Contract (``sampling_params``, vLLM's names): ``n``, ``temperature``, ``top_p``, ``top_k`` (0 or -1: no limit),
``max_tokens`` (unset: up to the context), ``seed``, ``stop`` or ``stop_token_ids`` (and EOS, as vLLM), ``logprobs``
(that many alternatives; unset: none). Logprobs are under the model at temperature 1 (vLLM's ``raw_logprobs``), the
numbers a training client's forward gives; ``token_ids`` hold every sampled token, the stop token included. A field
that would change the result and is not served (streaming, multimodal parts, prompt logprobs, penalties, ``min_p``,
``min_tokens``, ``ignore_eos``, logit bias, bad words, structured outputs, stop strings with stop ids) is a 400
naming it; fields that only shape text or scheduling are ignored, as are fields vLLM does not know either.

Not here: which weights serve ``model`` (``openai.Models``), the error shape and the body parser (``openai_wire.py``),
the sampling itself (``rlvr.SamplingClient.sample``).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from tinker import types

from rlvr.errors import ConfigurationError, ContextFullError, InvalidDatumError
from rlvr.server import openai_wire as bodies
from rlvr.server.openai import Caller, Models, ModelsOf, TokenStrings, sampling_app
from rlvr.server.openai_wire import MAX_TOP_LOGPROBS, NullMeansUnset, OpenAIError, Stops

__all__ = ["MOUNT", "GenerateRequest", "generate_routes"]

MOUNT = "/inference/v1"
"""Where the route lives: at the server's root, as vLLM serves it (not under ``/v1``)."""

REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "stream": ((None, False), "rlvr returns each sample whole"),
    "features": ((None, {}), "rlvr serves text models"),
    "content_parts": ((None, []), "rlvr serves text models"),
    "sampling_params.prompt_logprobs": ((None, 0), "score the prompt with a training client's forward or "
                                                   "SamplingClient.compute_logprobs"),
    "sampling_params.min_p": ((None, 0), "the sampler has top_k and top_p, not min_p"),
    "sampling_params.presence_penalty": ((None, 0), "the sampler has no penalties"),
    "sampling_params.frequency_penalty": ((None, 0), "the sampler has no penalties"),
    "sampling_params.repetition_penalty": ((None, 1), "the sampler has no penalties"),
    "sampling_params.min_tokens": ((None, 0), "the sampler stops where the model does"),
    "sampling_params.ignore_eos": ((None, False), "the sampler always stops at EOS"),
    "sampling_params.logit_bias": ((None, {}), "the sampler has no logit bias"),
    "sampling_params.allowed_token_ids": ((None, []), "the sampler does not restrict the vocabulary"),
    "sampling_params.bad_words": ((None, []), "the sampler does not restrict the vocabulary"),
    "sampling_params.structured_outputs": ((None,), "rlvr does not constrain the output"),
    "sampling_params.guided_decoding": ((None,), "rlvr does not constrain the output"),
    "sampling_params.best_of": ((None, 1), "use n and rank the samples yourself"),
    "sampling_params.truncate_prompt_tokens": ((None,), "send the prompt you want sampled"),
}
"""Fields that would change the result but that the route does not implement: field -> (the values that change
nothing, why), as ``openai_wire.REFUSED``."""


TokenId = Annotated[pydantic.StrictInt, pydantic.Field(ge=0)]
"""A token id: an integer (not a boolean, a float or a string of digits) >= 0."""


class GenerateSampling(NullMeansUnset):
    """``sampling_params``: vLLM's ``SamplingParams``, the part rlvr's sampler honours. ``null`` counts as unset."""

    n: int = pydantic.Field(1, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0)
    top_p: float = pydantic.Field(1.0, gt=0, le=1)
    top_k: int = pydantic.Field(-1, ge=-1)
    max_tokens: int | None = pydantic.Field(None, ge=1)
    seed: int | None = pydantic.Field(None, ge=-(2**63), lt=2**63)
    stop: Stops = pydantic.Field(default_factory=list)
    stop_token_ids: list[TokenId] = pydantic.Field(default_factory=list)
    logprobs: int | None = pydantic.Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def params(self) -> types.SamplingParams:
        """Tinker's ``SamplingParams`` for these settings (EOS always stops: ``stop=None`` means EOS only)."""
        if self.stop and self.stop_token_ids:
            raise OpenAIError(400, "sampling_params sets both stop strings and stop_token_ids; rlvr's sampler stops "
                                   "on one kind (and at EOS): send stop_token_ids only, or stop only",
                              "sampling_params.stop")
        return types.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                                    top_k=self.top_k or -1, seed=self.seed,
                                    stop=list(self.stop or self.stop_token_ids) or None)


class GenerateRequest(NullMeansUnset):
    """The body of ``POST /inference/v1/generate``, as vLLM's ``GenerateRequest``."""

    model: str
    token_ids: list[TokenId] = pydantic.Field(min_length=1)
    sampling_params: GenerateSampling = GenerateSampling()
    request_id: str | None = None



async def _parsed_request(request: Request) -> GenerateRequest:
    return await bodies.parse(GenerateRequest, request, REFUSED)


router = APIRouter()


@router.post("/generate")
async def generate(req: Annotated[GenerateRequest, Depends(_parsed_request)], models: ModelsOf,
                   owner: Caller) -> JSONResponse:
    client = await models.client(req.model, owner)
    sampling = req.sampling_params
    params = sampling.params()
    try:
        response = await client.sample(types.ModelInput.from_ints(req.token_ids), sampling.n, params,
                                       topk_sample_logprobs=sampling.logprobs or 0)
    except ContextFullError as exc:  # OpenAI's code for it, which clients read as "the conversation is over"
        raise OpenAIError(400, f"token_ids: {exc}", "token_ids", "context_length_exceeded") from exc
    except InvalidDatumError as exc:  # a token id outside the vocabulary
        raise OpenAIError(400, f"token_ids: {exc}", "token_ids") from exc
    except ConfigurationError as exc:  # the sampling settings the body already passed: a stop id outside the vocabulary
        field = "stop_token_ids" if sampling.stop_token_ids else "stop"
        raise OpenAIError(400, f"sampling_params: {exc}", f"sampling_params.{field}") from exc
    show = TokenStrings(None, as_ids=True)
    choices = [{"index": i, "token_ids": seq.tokens, "finish_reason": seq.stop_reason,
                "logprobs": show.chat(seq.tokens, seq.logprobs or [], seq.topk_logprobs)
                if sampling.logprobs is not None else None}
               for i, seq in enumerate(response.sequences)]
    completion = sum(len(seq.tokens) for seq in response.sequences)
    return JSONResponse({"request_id": req.request_id or f"gen-{uuid.uuid4().hex}", "choices": choices,
                         "prompt_token_ids": req.token_ids,
                         "usage": {"prompt_tokens": len(req.token_ids), "completion_tokens": completion,
                                   "total_tokens": len(req.token_ids) + completion}})


def generate_routes(models: Models) -> FastAPI:
    """The route as an app to mount at ``MOUNT``, sampling through ``models`` (those of the OpenAI routes, so both
    serve the same samplers)."""
    app = sampling_app(models, MOUNT, f"POST {MOUNT}/generate")
    app.include_router(router)
    return app
