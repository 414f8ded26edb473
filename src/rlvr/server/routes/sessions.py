"""The routes around the work: health, the settings the SDK reads on start (``client/config``), capabilities,
telemetry, and sessions (create, heartbeat, finish); and ``unserved``, the router ``create_app`` includes last, which
answers the SDK calls ``client/config`` switches off with a 400 naming the feature and every other ``/api/v1`` path
with a 404.

Not here: listing and searching sessions (``rest.py``, the SDK's ``RestClient``), what a session is and when it is
gone (``state.py``), the API key check that ``healthz`` alone skips (``auth.py``).
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from tinker import types

from rlvr.server import wire
from rlvr.server.routes.context import Body, Ctx, Owner, refusal
from rlvr.server.state import UnknownId

__all__ = ["router", "unserved"]

router = APIRouter()
unserved = APIRouter()


@router.get("/api/v1/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.post("/api/v1/client/config")
async def client_config(ctx: Ctx) -> dict:
    return wire.json_body(types.ClientConfigResponse(
        pjwt_auth_enabled=False, use_pyqwest_transport=False, proto_compress_fwdbwd=ctx.compress_fwdbwd,
        sample_use_retrieve_futures=False, custom_loss_server_side=False, sample_join_sampling_session=False))


@router.post("/api/v1/client/dynamic_config")
async def client_dynamic_config() -> dict:
    return wire.json_body(types.ClientDynamicConfigResponse())


@router.get("/api/v1/get_server_capabilities")
async def capabilities(ctx: Ctx) -> dict:
    return wire.json_body(ctx.state.service.get_server_capabilities())


@router.post("/api/v1/telemetry")
async def telemetry() -> dict:
    return {"status": "accepted"}


@router.post("/api/v1/create_session")
async def create_session(body: Body, ctx: Ctx, owner: Owner) -> dict:
    req = wire.parse_json(types.CreateSessionRequest, body)
    session = ctx.state.create_session(owner, req.user_metadata)
    return wire.json_body(types.CreateSessionResponse(session_id=session.session_id))


@router.post("/api/v1/session_heartbeat")
async def heartbeat(body: Body, ctx: Ctx, owner: Owner) -> dict:
    req = wire.parse_json(types.SessionHeartbeatRequest, body)
    ctx.state.heartbeat(req.session_id, owner)
    return {"type": "session_heartbeat"}


class _FinishBody(pydantic.BaseModel):
    reason: dict[str, Any] | None = None
    detail: str | None = None


@router.post("/api/v1/sessions/{session_id}/finish")
async def finish(session_id: str, body: Body, ctx: Ctx, owner: Owner) -> Response:
    req = wire.parse_json(_FinishBody, body) if body else _FinishBody()
    ctx.state.finish_session(session_id, owner, str((req.reason or {}).get("type", "finished")), req.detail)
    return JSONResponse(None)


# -- unserved: included last, after every other router -----------------------------------------------------------------

OFF_IN_CLIENT_CONFIG = {
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


for _path, (_sdk_method, _why) in OFF_IN_CLIENT_CONFIG.items():
    unserved.add_api_route(_path, refusal(f"{_sdk_method} is not supported by rlvr serve: {_why}"), methods=["POST"])


@unserved.api_route("/api/v1/{name:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(name: str, request: Request, body: Body, ctx: Ctx) -> Response:
    # Registered last, so it only sees what no route above takes. SDK calls rlvr does not implement (a newer SDK's)
    # may still carry a seq_id, which must be freed like any other refusal's. The open path's other methods
    # (POST /api/v1/healthz) come here without a key: no principal, so no model of theirs to free a seq_id on.
    owner = request.scope.get("state", {}).get("principal", "")
    with ctx.refusal_frees_seq_id(owner, lambda: wire.json_position(body)):
        raise UnknownId(f"rlvr serve does not implement {request.method} /api/v1/{name}; the tinker SDK call behind "
                        "it is not supported")
