"""The training routes, what the SDK's ``TrainingClient`` calls: ``create_model``, ``get_info``, ``forward_backward``
(protobuf, maybe zstd-compressed), ``optim_step``, ``save_weights`` (training state), ``save_weights_for_sampler``
(a checkpoint, or a sampler straight away), ``save_weights_external`` (an export to download) and ``load_weights``
(into a model, or a new model created by the load).

Every call but ``get_info`` is queued on its model in ``seq_id`` order (``RouteContext.sequenced``; a model's creation
is its request 0) and answered at once with a future id the SDK polls (``futures.py``). A request refused before it
was queued frees its ``seq_id`` (``RouteContext.refusal_frees_seq_id``).

Not here: the training itself (``rlvr.TrainingClient`` on the engine), body formats (``wire.py``), the checkpoints'
listing and TTLs (``catalog.py``, ``rest.py``), which optimizers exist (``rlvr.engine.train.optim``).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from tinker import types

from rlvr.engine.train.optim import check_params_for, kind_of_config, kind_of_params
from rlvr.server import wire
from rlvr.server.catalog import Catalog
from rlvr.server.routes.context import Body, Ctx, Owner, RouteContext
from rlvr.server.state import ModelEntry, chain, done

__all__ = ["router"]

router = APIRouter()


@router.post("/api/v1/create_model")
async def create_model(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    req = wire.parse_json(types.CreateModelRequest, body)
    kind_of_config(req.optimizer_config)  # an optimizer rlvr lacks is refused here, with a 400 naming it
    lora = req.lora_config or types.LoraConfig(rank=32)
    state = ctx.state
    entry = state.add_model(state.session(req.session_id, owner), req.model_seq_id, req.base_model, req.user_metadata)

    def create() -> Future:
        state.bind(entry, state.service.create_lora_training_client(
            req.base_model, rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp, train_attn=lora.train_attn,
            train_unembed=lora.train_unembed, optimizer=req.optimizer_config))
        return done(types.CreateModelResponse(model_id=entry.model_id))

    return ctx.created(owner, entry, create)


@router.post("/api/v1/get_info")
async def get_info(body: Body, ctx: Ctx, owner: Owner) -> dict:
    req = wire.parse_json(types.GetInfoRequest, body)
    client = ctx.state.trainer(ctx.state.model(req.model_id, owner))
    info = client.get_info()
    tokenizer_dir = await run_in_threadpool(ctx.tokenizers.folder, info.model_data.model_name or "model",
                                            client.get_tokenizer)  # a local folder: the SDK loads it offline
    data = info.model_data.model_copy(update={"tokenizer_id": str(tokenizer_dir)})
    return wire.json_body(info.model_copy(update={"model_id": req.model_id, "model_data": data}))


@router.post("/api/v1/forward_backward")
async def forward_backward(body: Body, ctx: Ctx, owner: Owner,
                           content_encoding: Annotated[str | None, Header()] = None) -> JSONResponse:
    raw = wire.decompress(body, content_encoding, ctx.max_body_bytes)
    with ctx.refusal_frees_seq_id(owner, lambda: wire.proto_position(raw)):
        call = wire.decode_forward_backward(raw)

        def job(entry: ModelEntry) -> Future:
            client = ctx.state.trainer(entry)
            method = client.forward if call.forward_only else client.forward_backward
            return chain(method(call.data, call.loss_fn, call.loss_fn_config), wire.encode_forward_backward_output)

        return ctx.sequenced(owner, call.model_id, call.seq_id, job)


@router.post("/api/v1/optim_step")
async def optim_step(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    with ctx.refusal_frees_seq_id(owner, lambda: wire.json_position(body)):
        req = wire.parse_json(types.OptimStepRequest, body)
        kind_of_params(req.optim_params)  # neither AdamParams nor DimuonParams: a 400 naming both
        bound = ctx.state.model(req.model_id, owner).client
        if bound is not None:  # the other optimizer's params: a 400 now (else the step's future fails)
            check_params_for(bound.get_info().optimizer_config.type, req.optim_params)
        return ctx.sequenced(owner, req.model_id, req.seq_id,
                             lambda e: chain(ctx.state.trainer(e).optim_step(req.optim_params), lambda r: r))


@router.post("/api/v1/save_weights")
async def save_weights(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    with ctx.refusal_frees_seq_id(owner, lambda: wire.json_position(body)):
        req = wire.parse_json(types.SaveWeightsRequest, body)
        Catalog.check_ttl(req.ttl_seconds)
        name = req.path or f"state-{req.seq_id}"
        return ctx.sequenced(owner, req.model_id, req.seq_id, lambda e: chain(
            ctx.state.trainer(e).save_state(name),
            lambda r: types.SaveWeightsResponse(path=ctx.with_ttl(r.path, req.ttl_seconds))))


@router.post("/api/v1/save_weights_for_sampler")
async def save_weights_for_sampler(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    with ctx.refusal_frees_seq_id(owner, lambda: wire.json_position(body)):
        req = wire.parse_json(types.SaveWeightsForSamplerRequest, body)
        Catalog.check_ttl(req.ttl_seconds)
        if req.kind != "snapshot":
            raise wire.BadRequest(f"kind={req.kind!r}: rlvr serves snapshot sampling clients only; use "
                                  "kind='snapshot'")
        if req.path is None and req.sampling_session_seq_id is None:
            raise wire.BadRequest("save_weights_for_sampler needs path (a checkpoint name) or "
                                  "sampling_session_seq_id")
        state = ctx.state
        session = state.session(state.model(req.model_id, owner).session_id, owner)

        def job(entry: ModelEntry) -> Future:
            client = state.trainer(entry)
            if req.path is not None:
                return chain(client.save_weights_for_sampler(req.path), lambda r: (
                    types.SaveWeightsForSamplerResponseInternal(path=ctx.with_ttl(r.path, req.ttl_seconds))))
            sampler = client.save_weights_and_get_sampling_client()
            added = state.add_sampler(session, req.sampling_session_seq_id, sampler, client.get_info().model_name,
                                      sampler.model_path)
            return done(types.SaveWeightsForSamplerResponseInternal(sampling_session_id=added.sampler_id))

        return ctx.sequenced(owner, req.model_id, req.seq_id, job)


@router.post("/api/v1/save_weights_external")
async def save_weights_external(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    with ctx.refusal_frees_seq_id(owner, lambda: wire.json_position(body)):
        req = wire.parse_json(types.SaveWeightsExternalRequest, body)
        if req.age_encryption_recipients:
            raise wire.BadRequest("TrainingClient.save_weights_external: age_encryption_recipients is not "
                                  "supported by rlvr serve (files are served over this server's API key); "
                                  "leave it unset")
        Catalog.check_ttl(req.ttl_seconds)
        if not req.path or "/" in req.path or req.path.startswith("."):
            raise wire.BadRequest(f"TrainingClient.save_weights_external: name={req.path!r} must be non-empty, "
                                  "without '/', and not start with '.'")

        def job(entry: ModelEntry) -> Future:
            saved = ctx.state.trainer(entry).save_weights_for_sampler(f"export-{ctx.state.futures.new_id()}").result()
            folder = ctx.catalog.export(saved.path, req.path, req.ttl_seconds)
            return done(types.SaveWeightsExternalResponseInternal(
                path=f"tinker://{folder.parts[-3]}/external_weights/{req.path}",
                size_bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())))

        return ctx.sequenced(owner, req.model_id, req.seq_id, job)


@router.post("/api/v1/load_weights")
async def load_weights(body: Body, ctx: Ctx, owner: Owner) -> JSONResponse:
    with ctx.refusal_frees_seq_id(owner, lambda: wire.json_position(body)):
        req = wire.parse_json(types.LoadWeightsRequest, body)
        ctx.catalog.sweep()  # an expired checkpoint is gone, not loadable
        if req.optimizer_config is not None and (req.optimizer or req.session_id is None):
            raise wire.BadRequest("load_weights: optimizer_config chooses the optimizer of a new model loaded "
                                  "without optimizer state; a load with optimizer state keeps the checkpoint's, "
                                  "and an existing model keeps its own, so leave optimizer_config unset")
        kind_of_config(req.optimizer_config)
        if req.session_id is not None:  # Create-via-load: a new model whose first request is this load.
            return _created_by_load(req, ctx, owner)
        if req.model_id is None:
            raise wire.BadRequest("load_weights needs model_id (and seq_id), or session_id and model_seq_id")

        def job(entry: ModelEntry) -> Future:
            client = ctx.state.trainer(entry)
            method = client.load_state_with_optimizer if req.optimizer else client.load_state
            return chain(method(req.path), lambda r: types.LoadWeightsResponse(path=req.path, model_id=entry.model_id))

        return ctx.sequenced(owner, req.model_id, req.seq_id, job)


def _created_by_load(req: types.LoadWeightsRequest, ctx: RouteContext, owner: str) -> JSONResponse:
    """A new model in ``req.session_id`` whose creation (its request 0) is loading ``req.path``."""
    if req.model_seq_id is None:
        raise wire.BadRequest("load_weights with session_id needs model_seq_id")
    state = ctx.state
    entry = state.add_model(state.session(req.session_id, owner), req.model_seq_id, req.base_model,
                            req.user_metadata)

    def create() -> Future:
        if req.optimizer:  # the checkpoint's optimizer and its state
            client = state.service.create_training_client_from_state_with_optimizer(req.path)
        else:
            client = state.service.create_training_client_from_state(req.path, optimizer=req.optimizer_config)
        state.bind(entry, client)
        return done(types.LoadWeightsResponse(path=req.path, model_id=entry.model_id))

    return ctx.created(owner, entry, create)
