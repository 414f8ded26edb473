"""The HTTP routes of ``rlvr serve``: Tinker's ``/api/v1`` protocol, as the official ``tinker`` SDK (>= 0.38) speaks it.

Each route parses its body (``wire.py``), turns it into calls on the public rlvr client API (``rlvr.ServiceClient``,
``TrainingClient``, ``SamplingClient``) through ``state.py``, and answers the way the SDK expects: most training and
sampling calls return a future id at once (``UntypedAPIFuture``), and the SDK long-polls ``/retrieve_future`` for the
result (protobuf for forward_backward and sample, JSON otherwise).

Status codes: 400 malformed body or a request rlvr rejects (message names the field and the fix), 401 bad or missing
key (``auth.py``), 403 an expired or altered signed download URL (``signing.py``), 404 unknown id or route, 410
finished session, 413 body too large. A failure inside one request is reported on that request's future only; the
server keeps serving everyone else. A request refused with a 4xx before it was queued frees its ``seq_id`` at once
(``Sequencer.refuse``): the SDK does not resend it, and the model's next request must not wait out the gap timeout
for it.

Not here: body formats (``wire.py``), sessions/ordering (``state.py``), keys and size limits (``auth.py``), the
RestClient routes (``rest.py``), what a run or checkpoint is (``catalog.py``), signed download URLs (``signing.py``),
tokenizer folders and their hub-shaped view at ``/hf`` (``hub.py``) and the OpenAI-compatible sampling routes mounted
at ``/v1`` (``openai.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from tinker import types

from rlvr.client import ServiceClient
from rlvr.engine.train.optim import check_params_for, kind_of_config, kind_of_params
from rlvr.errors import ConfigurationError, RlvrError, RunInterrupted
from rlvr.server import wire
from rlvr.server.auth import AdmissionMiddleware, BodyTooLarge, load_api_keys, principal_of
from rlvr.server.catalog import Catalog
from rlvr.server.hub import TokenizerFolders, add_hub_routes
from rlvr.server.openai import openai_routes
from rlvr.server.rest import add_rest_routes
from rlvr.server.signing import DEFAULT_LIFETIME_S, UrlSigner, load_secret
from rlvr.server.state import Gone, SeqIdRefused, ServerState, UnknownId, chain, done

__all__ = ["create_app", "serve"]

log = logging.getLogger("rlvr.server")

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
KEEP_ALIVE_S = 120
GRACE_S = 30
"""How long a stopping server waits for the requests in flight (a long poll lasts at most ``long_poll_s``)."""
"""Idle keep-alive for client connections: longer than the SDK's pauses, so it never sends on a connection the server
has just closed (uvicorn's default of 5 s makes the SDK see connection errors and back off for up to 30 s)."""


def create_app(api_keys: str | list[str] | None = None, *, keys_file: str | Path | None = None,
               service: ServiceClient | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               long_poll_s: float = 25.0, compress_fwdbwd: bool = True, gap_timeout_s: float = 10.0,
               url_lifetime_s: float = DEFAULT_LIFETIME_S) -> FastAPI:
    """The ASGI app serving Tinker's protocol on ``service`` (default: a ``rlvr.ServiceClient()`` on the shared engine).

    ``api_keys`` / ``keys_file``: accepted keys (default ``$RLVR_API_KEY`` / ``$RLVR_API_KEYS_FILE``), each ``tml-...``.
    ``long_poll_s``: how long ``/retrieve_future`` waits for a result before answering ``try_again`` (the SDK gives up
    on a poll after 45 s). ``compress_fwdbwd``: ask the SDK to zstd-compress forward_backward bodies.
    ``url_lifetime_s``: how long the signed download URLs of ``get_external_weights_urls`` hold (signed with the
    secret in ``$RLVR_HOME/server/url-signing.key``, made on first use).
    """
    from rlvr.home import rlvr_home

    keys = load_api_keys(api_keys, keys_file)
    if not 0 < long_poll_s < 45:
        raise ConfigurationError(f"long_poll_s={long_poll_s} must be in (0, 45): the tinker SDK abandons a "
                                 "retrieve_future poll after 45 s")
    signer = UrlSigner(load_secret(rlvr_home() / "server"), {principal_of(k) for k in keys}, url_lifetime_s)
    state = ServerState(service, gap_timeout_s=gap_timeout_s)
    catalog = Catalog(state)
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.close()

    app = FastAPI(title="rlvr", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_middleware(AdmissionMiddleware, api_keys=keys, max_body_bytes=max_body_bytes, signer=signer)
    app.state.rlvr = state
    tokenizers = TokenizerFolders()

    def owner(request: Request) -> str:
        return request.scope["state"]["principal"]

    def accepted(request_id: str, model_id: str | None = None, **extra: Any) -> JSONResponse:
        return JSONResponse(wire.json_body(types.UntypedAPIFuture(request_id=request_id, model_id=model_id, **extra)))

    def sequenced(request: Request, model_id: str, seq_id: int | None, job: Any) -> JSONResponse:
        entry = state.model(model_id, owner(request))
        if seq_id is None or seq_id < 1:
            raise wire.BadRequest(f"seq_id={seq_id!r} must be an integer >= 1 (the SDK numbers each model's requests "
                                  "from 1)")
        request_id, future = entry.sequencer.submit(seq_id, state.futures.new_id(), lambda: job(entry))
        if future is not None:
            state.futures.put(request_id, owner(request), future)
        return accepted(request_id, model_id)

    @contextlib.contextmanager
    def refusal_frees_seq_id(request: Request, position: Callable[[], tuple[str, int] | None]) -> Iterator[None]:
        """Wraps a route that queues a request on a model: if the route refuses it (4xx), the seq_id it carried is
        marked done on that model's sequencer. ``position`` reads (model_id, seq_id) from the body; it is called only
        on refusal, and may find none (then the gap timeout covers the number). A 5xx frees nothing: the SDK retries
        those with the same seq_id."""
        try:
            yield
        except (wire.BadRequest, RlvrError, UnknownId, Gone, SeqIdRefused) as exc:
            found = None if isinstance(exc, wire.BadRequest) and exc.status_code >= 500 else position()
            if found is not None and found[1] >= 1:  # seq_id 0 is the model's creation, queued by the server itself
                with contextlib.suppress(UnknownId, Gone):  # no such model for this key: no number to free
                    state.model(found[0], owner(request)).sequencer.refuse(found[1], str(exc) or type(exc).__name__)
            raise

    def with_ttl(path: str, ttl_seconds: int | None) -> str:
        """The wire path of a checkpoint just saved, after giving it the TTL its save request asked for."""
        from rlvr.home import resolve

        if ttl_seconds is not None:
            catalog.set_ttl(resolve(path), ttl_seconds)
        return wire.to_wire_path(path)

    # -- errors -----------------------------------------------------------------------------------------------------

    def error(status: int, exc: BaseException) -> JSONResponse:
        return JSONResponse({"detail": str(exc) or type(exc).__name__}, status_code=status)

    app.add_exception_handler(wire.BadRequest, lambda r, e: error(e.status_code, e))
    app.add_exception_handler(BodyTooLarge, lambda r, e: error(413, e))
    app.add_exception_handler(UnknownId, lambda r, e: error(404, e))
    app.add_exception_handler(Gone, lambda r, e: error(410, e))
    app.add_exception_handler(RlvrError, lambda r, e: error(400, e))
    app.add_exception_handler(SeqIdRefused, lambda r, e: error(400, e))

    # -- service ----------------------------------------------------------------------------------------------------

    @app.get("/api/v1/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict:
        return wire.json_body(types.ClientConfigResponse(
            pjwt_auth_enabled=False, use_pyqwest_transport=False, proto_compress_fwdbwd=compress_fwdbwd,
            sample_use_retrieve_futures=False, custom_loss_server_side=False, sample_join_sampling_session=False))

    @app.post("/api/v1/client/dynamic_config")
    async def client_dynamic_config() -> dict:
        return wire.json_body(types.ClientDynamicConfigResponse())

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict:
        return wire.json_body(state.service.get_server_capabilities())

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict:
        req = wire.parse_json(types.CreateSessionRequest, await request.body())
        session = state.create_session(owner(request), req.user_metadata)
        return wire.json_body(types.CreateSessionResponse(session_id=session.session_id))

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict:
        req = wire.parse_json(types.SessionHeartbeatRequest, await request.body())
        state.session(req.session_id, owner(request)).last_heartbeat = time.time()
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        raw = await request.body()
        body = wire.parse_json(_FinishBody, raw) if raw else _FinishBody()
        state.finish_session(session_id, owner(request), str((body.reason or {}).get("type", "finished")),
                             body.detail)
        return JSONResponse(None)

    # -- training ---------------------------------------------------------------------------------------------------

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> JSONResponse:
        req = wire.parse_json(types.CreateModelRequest, await request.body())
        kind_of_config(req.optimizer_config)  # an optimizer rlvr lacks is refused here, with a 400 naming it
        lora = req.lora_config or types.LoraConfig(rank=32)
        session = state.session(req.session_id, owner(request))
        entry = state.add_model(session, req.model_seq_id, req.base_model, req.user_metadata)

        def job(entry: Any = entry) -> Future:
            state.bind(entry, state.service.create_lora_training_client(
                req.base_model, rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp, train_attn=lora.train_attn,
                train_unembed=lora.train_unembed, optimizer=req.optimizer_config))
            return done(types.CreateModelResponse(model_id=entry.model_id))

        request_id, future = entry.sequencer.submit(0, state.futures.new_id(), job)
        assert future is not None
        state.futures.put(request_id, owner(request), future)
        return accepted(request_id, entry.model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict:
        req = wire.parse_json(types.GetInfoRequest, await request.body())
        client = state.trainer(state.model(req.model_id, owner(request)))
        info = client.get_info()
        tokenizer_dir = await run_in_threadpool(tokenizers.folder, info.model_data.model_name or "model",
                                                client.get_tokenizer)  # a local folder: the SDK loads it offline
        data = info.model_data.model_copy(update={"tokenizer_id": str(tokenizer_dir)})
        return wire.json_body(info.model_copy(update={"model_id": req.model_id, "model_data": data}))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> JSONResponse:
        body = wire.decompress(await request.body(), request.headers.get("content-encoding"),
                               max_body_bytes)
        with refusal_frees_seq_id(request, lambda: wire.proto_position(body)):
            call = wire.decode_forward_backward(body)

            def job(entry: Any) -> Future:
                client = state.trainer(entry)
                method = client.forward if call.forward_only else client.forward_backward
                return chain(method(call.data, call.loss_fn, call.loss_fn_config), wire.encode_forward_backward_output)

            return sequenced(request, call.model_id, call.seq_id, job)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> JSONResponse:
        body = await request.body()
        with refusal_frees_seq_id(request, lambda: wire.json_position(body)):
            req = wire.parse_json(types.OptimStepRequest, body)
            kind_of_params(req.optim_params)  # neither AdamParams nor DimuonParams: a 400 naming both
            bound = state.model(req.model_id, owner(request)).client
            if bound is not None:  # the other optimizer's params: a 400 now (else the step's future fails)
                check_params_for(bound.get_info().optimizer_config.type, req.optim_params)
            return sequenced(request, req.model_id, req.seq_id,
                             lambda e: chain(state.trainer(e).optim_step(req.optim_params), lambda r: r))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> JSONResponse:
        body = await request.body()
        with refusal_frees_seq_id(request, lambda: wire.json_position(body)):
            req = wire.parse_json(types.SaveWeightsRequest, body)
            Catalog.check_ttl(req.ttl_seconds)
            name = req.path or f"state-{req.seq_id}"
            return sequenced(request, req.model_id, req.seq_id, lambda e: chain(
                state.trainer(e).save_state(name),
                lambda r: types.SaveWeightsResponse(path=with_ttl(r.path, req.ttl_seconds))))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> JSONResponse:
        body = await request.body()
        with refusal_frees_seq_id(request, lambda: wire.json_position(body)):
            req = wire.parse_json(types.SaveWeightsForSamplerRequest, body)
            Catalog.check_ttl(req.ttl_seconds)
            if req.kind != "snapshot":
                raise wire.BadRequest(f"kind={req.kind!r}: rlvr serves snapshot sampling clients only; use "
                                      "kind='snapshot'")
            if req.path is None and req.sampling_session_seq_id is None:
                raise wire.BadRequest("save_weights_for_sampler needs path (a checkpoint name) or "
                                      "sampling_session_seq_id")
            session = state.session(state.model(req.model_id, owner(request)).session_id, owner(request))

            def job(entry: Any) -> Future:
                client = state.trainer(entry)
                if req.path is not None:
                    return chain(client.save_weights_for_sampler(req.path), lambda r: (
                        types.SaveWeightsForSamplerResponseInternal(path=with_ttl(r.path, req.ttl_seconds))))
                sampler = client.save_weights_and_get_sampling_client()
                added = state.add_sampler(session, req.sampling_session_seq_id, sampler, client.get_info().model_name,
                                          sampler.model_path)
                return done(types.SaveWeightsForSamplerResponseInternal(sampling_session_id=added.sampler_id))

            return sequenced(request, req.model_id, req.seq_id, job)

    @app.post("/api/v1/save_weights_external")
    async def save_weights_external(request: Request) -> JSONResponse:
        body = await request.body()
        with refusal_frees_seq_id(request, lambda: wire.json_position(body)):
            req = wire.parse_json(types.SaveWeightsExternalRequest, body)
            if req.age_encryption_recipients:
                raise wire.BadRequest("TrainingClient.save_weights_external: age_encryption_recipients is not "
                                      "supported by rlvr serve (files are served over this server's API key); "
                                      "leave it unset")
            Catalog.check_ttl(req.ttl_seconds)
            if not req.path or "/" in req.path or req.path.startswith("."):
                raise wire.BadRequest(f"TrainingClient.save_weights_external: name={req.path!r} must be non-empty, "
                                      "without '/', and not start with '.'")

            def job(entry: Any) -> Future:
                saved = state.trainer(entry).save_weights_for_sampler(f"export-{state.futures.new_id()}").result()
                folder = catalog.export(saved.path, req.path, req.ttl_seconds)
                return done(types.SaveWeightsExternalResponseInternal(
                    path=f"tinker://{folder.parts[-3]}/external_weights/{req.path}",
                    size_bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())))

            return sequenced(request, req.model_id, req.seq_id, job)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> JSONResponse:
        body = await request.body()
        with refusal_frees_seq_id(request, lambda: wire.json_position(body)):
            req = wire.parse_json(types.LoadWeightsRequest, body)
            catalog.sweep()  # an expired checkpoint is gone, not loadable
            if req.optimizer_config is not None and (req.optimizer or req.session_id is None):
                raise wire.BadRequest("load_weights: optimizer_config chooses the optimizer of a new model loaded "
                                      "without optimizer state; a load with optimizer state keeps the checkpoint's, "
                                      "and an existing model keeps its own, so leave optimizer_config unset")
            kind_of_config(req.optimizer_config)
            if req.session_id is not None:  # Create-via-load: a new model whose first request is this load.
                if req.model_seq_id is None:
                    raise wire.BadRequest("load_weights with session_id needs model_seq_id")
                session = state.session(req.session_id, owner(request))
                entry = state.add_model(session, req.model_seq_id, req.base_model, req.user_metadata)

                def create(entry: Any = entry) -> Future:
                    if req.optimizer:  # the checkpoint's optimizer and its state
                        client = state.service.create_training_client_from_state_with_optimizer(req.path)
                    else:
                        client = state.service.create_training_client_from_state(req.path,
                                                                                 optimizer=req.optimizer_config)
                    state.bind(entry, client)
                    return done(types.LoadWeightsResponse(path=req.path, model_id=entry.model_id))

                request_id, future = entry.sequencer.submit(0, state.futures.new_id(), create)
                assert future is not None
                state.futures.put(request_id, owner(request), future)
                return accepted(request_id, entry.model_id)
            if req.model_id is None:
                raise wire.BadRequest("load_weights needs model_id (and seq_id), or session_id and model_seq_id")

            def job(entry: Any) -> Future:
                client = state.trainer(entry)
                method = client.load_state_with_optimizer if req.optimizer else client.load_state
                return chain(method(req.path),
                             lambda r: types.LoadWeightsResponse(path=req.path, model_id=entry.model_id))

            return sequenced(request, req.model_id, req.seq_id, job)

    # -- sampling ---------------------------------------------------------------------------------------------------

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        req = wire.parse_json(types.CreateSamplingSessionRequest, await request.body())
        session = state.session(req.session_id, owner(request))
        catalog.sweep()
        client = await run_in_threadpool(state.service.create_sampling_client, req.model_path, req.base_model)
        entry = state.add_sampler(session, req.sampling_session_seq_id, client, client.get_base_model(),
                                  req.model_path)
        return wire.json_body(types.CreateSamplingSessionResponse(sampling_session_id=entry.sampler_id))

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request) -> dict:
        entry = state.sampler(sampler_id, owner(request))
        path = wire.to_wire_path(entry.model_path) if entry.model_path else None
        return wire.json_body(types.GetSamplerResponse(sampler_id=sampler_id, base_model=entry.base_model,
                                                       model_path=path))

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> JSONResponse:
        req = wire.parse_json(types.SampleRequest, await request.body())
        if req.sampling_session_id is None:
            raise wire.BadRequest("asample needs sampling_session_id; create one with create_sampling_client")
        if req.num_samples < 1:
            raise wire.BadRequest(f"num_samples={req.num_samples} must be >= 1")
        entry = state.sampler(req.sampling_session_id, owner(request))
        future = entry.client.sample(req.prompt, req.num_samples, req.sampling_params,
                                     include_prompt_logprobs=bool(req.prompt_logprobs),
                                     topk_prompt_logprobs=req.topk_prompt_logprobs, **wire.sample_scores(req))
        request_id = state.futures.new_id()
        state.futures.put(request_id, owner(request), chain(future, wire.encode_sample_response))
        return accepted(request_id, sample_sequence_ids=[f"{request_id}:{i}" for i in range(req.num_samples)])

    # -- futures ----------------------------------------------------------------------------------------------------

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        req = wire.parse_json(types.FutureRetrieveRequest, await request.body())
        future = state.futures.get(req.request_id, owner(request))
        if not future.done():
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(
                lambda: waiter.done() or waiter.set_result(None)))
            await asyncio.wait([waiter], timeout=long_poll_s)
        if not future.done():
            return JSONResponse({"type": "try_again", "request_id": req.request_id, "queue_state": "active"})
        if future.cancelled():
            return JSONResponse({"error": "the request was cancelled", "category": "user"})
        exc = future.exception()
        if exc is not None:
            user = isinstance(exc, (RlvrError, ValueError, KeyError, UnknownId, TypeError))
            if not user:
                log.error("request %s failed", req.request_id, exc_info=exc)
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}", "category": "user" if user else "server"})
        result = future.result()
        if isinstance(result, wire.ProtoPayload):
            return Response(result.data, media_type=wire.PROTO_CONTENT_TYPE)
        return JSONResponse(wire.json_body(result))

    @app.post("/api/v1/cancel_future")
    async def cancel_future(request: Request) -> Response:
        req = wire.parse_json(types.FutureRetrieveRequest, await request.body())
        state.futures.cancel(req.request_id, owner(request))
        return JSONResponse(None)

    # -- training runs, checkpoints, sessions (RestClient) ----------------------------------------------------------

    add_rest_routes(app, state, catalog, owner, signer)

    # -- tokenizers, hub-shaped, for SamplingClient.get_tokenizer (HF_ENDPOINT=<server>/hf) -------------------------

    add_hub_routes(app, state, tokenizers, owner)

    # -- OpenAI-compatible sampling (/v1/models, /v1/completions, /v1/chat/completions) ---------------------------

    app.mount("/v1", openai_routes(state, catalog))

    # -- calls client/config tells the SDK not to make ------------------------------------------------------------

    for path, (sdk_method, why) in _OFF_IN_CLIENT_CONFIG.items():
        def refuse(sdk_method: str = sdk_method, why: str = why) -> Response:
            raise wire.BadRequest(f"{sdk_method} is not supported by rlvr serve: {why}")

        app.add_api_route(path, refuse, methods=["POST"])

    # -- everything else --------------------------------------------------------------------------------------------

    @app.api_route("/api/v1/{name:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def not_served(name: str, request: Request) -> Response:
        # Registered last, so it only sees what no route above takes. SDK calls rlvr does not implement (a newer
        # SDK's) may still carry a seq_id, which must be freed like any other refusal's.
        body = await request.body()
        with refusal_frees_seq_id(request, lambda: wire.json_position(body)):
            raise UnknownId(f"rlvr serve does not implement {request.method} /api/v1/{name}; the tinker SDK call "
                            "behind it is not supported")

    return app


_OFF_IN_CLIENT_CONFIG = {
    "/api/v1/create_custom_loss": (
        "ServiceClient.create_custom_loss (server-side)", "rlvr does not run uploaded loss graphs; client/config says "
        "custom_loss_server_side=false, so the SDK runs the LossHandle client-side in forward_backward_custom"),
    "/api/v1/join_sampling_session": (
        "SamplingClient (join_sampling_session)", "client/config says sample_join_sampling_session=false; sampling "
        "clients are created with create_sampling_session"),
    "/api/v1/retrieve_futures": (
        "SamplingClient (batched retrieve_futures)", "client/config says sample_use_retrieve_futures=false; poll "
        "each request with /retrieve_future"),
}
"""Routes of SDK features that ``client/config`` switches off: the SDK does not call them, and a client that does
anyway gets a 400 naming the feature instead of a stall. None carries a model seq_id, so there is none to free."""


class _FinishBody(pydantic.BaseModel):
    reason: dict[str, Any] | None = None
    detail: str | None = None


def serve(host: str = "127.0.0.1", port: int = 8000, api_keys: str | list[str] | None = None, *,
          keys_file: str | Path | None = None, log_level: str = "info", **app_options: Any) -> None:
    """Run the server until interrupted (the ``rlvr serve`` command). Binds loopback only unless ``host`` says
    otherwise; keys default to ``$RLVR_API_KEY`` / ``$RLVR_API_KEYS_FILE``.

    SIGTERM or Ctrl-C stop it: no new connections, the requests in flight answered (those still open after
    ``GRACE_S`` are cut), then RunInterrupted (``rlvr`` exits with 128 + the signal); a second Ctrl-C cuts the
    requests in flight at once."""
    import uvicorn

    app = create_app(api_keys, keys_file=keys_file, **app_options)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("rlvr serve is listening on %s: anyone who can reach it and holds a key can train and sample", host)
    server = _stoppable_server()(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACE_S))
    server.run()
    if server.stopped_by is not None:
        raise RunInterrupted(server.stopped_by)


def _stoppable_server() -> type:
    import uvicorn  # the class is built when serving: uvicorn is imported only then

    class StoppableServer(uvicorn.Server):
        """uvicorn's server, which records the signal that stopped it instead of raising it again once shut down (so
        the process ends with 128 + the signal whatever the signal's disposition was when it started)."""

        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stopped_by is None:
                self.stopped_by = sig
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # the second Ctrl-C: requests in flight are cut
            else:
                self.should_exit = True

    return StoppableServer
