"""The sampling routes, what the SDK's ``SamplingClient`` calls: ``create_sampling_session`` (a sampler on a base model
or a sampler checkpoint), ``samplers/{id}`` (what one samples from) and ``asample``, answered at once with a future id
the SDK polls (``futures.py``). Samples are not queued in ``seq_id`` order: the engine batches them as they come.

Not here: the sampling itself (``rlvr.SamplingClient.sample``), samplers made by ``save_weights_for_sampler``
(``training.py``), OpenAI-compatible sampling (``openai.py``), body formats (``wire.py``).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from tinker import types

from rlvr.server import wire
from rlvr.server.routes.context import Body, Ctx, Owner, accepted
from rlvr.server.state import chain

__all__ = ["router"]

router = APIRouter()


@router.post("/api/v1/create_sampling_session")
async def create_sampling_session(body: Body, ctx: Ctx, owner: Owner) -> dict:
    req = wire.parse_json(types.CreateSamplingSessionRequest, body)
    session = ctx.state.session(req.session_id, owner)
    ctx.catalog.sweep()
    client = await run_in_threadpool(ctx.state.service.create_sampling_client, req.model_path, req.base_model)
    entry = ctx.state.add_sampler(session, req.sampling_session_seq_id, client, client.get_base_model(),
                                  req.model_path)
    return wire.json_body(types.CreateSamplingSessionResponse(sampling_session_id=entry.sampler_id))


@router.get("/api/v1/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, ctx: Ctx, owner: Owner) -> dict:
    entry = ctx.state.sampler(sampler_id, owner)
    path = wire.to_wire_path(entry.model_path) if entry.model_path else None
    return wire.json_body(types.GetSamplerResponse(sampler_id=sampler_id, base_model=entry.base_model,
                                                   model_path=path))


@router.post("/api/v1/asample")
async def asample(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    req = wire.parse_json(types.SampleRequest, body)
    if req.sampling_session_id is None:
        raise wire.BadRequest("asample needs sampling_session_id; create one with create_sampling_client")
    if req.num_samples < 1:
        raise wire.BadRequest(f"num_samples={req.num_samples} must be >= 1")
    entry = ctx.state.sampler(req.sampling_session_id, owner)
    future = entry.client.sample(req.prompt, req.num_samples, req.sampling_params,
                                 include_prompt_logprobs=bool(req.prompt_logprobs),
                                 topk_prompt_logprobs=req.topk_prompt_logprobs, **wire.sample_scores(req))
    request_id = ctx.state.futures.new_id()
    ctx.state.futures.put(request_id, owner, chain(future, wire.encode_sample_response))
    return accepted(request_id, sample_sequence_ids=[f"{request_id}:{i}" for i in range(req.num_samples)])
