"""The routes behind the SDK's ``RestClient``: training runs, checkpoints (list, delete, publish, TTL, weights info,
download), sessions, and clear refusals for the calls that have no meaning on a single rlvr server.

Every checkpoint route names the checkpoint as two path segments, ``{kind}/{name}``, so a sub-resource
(``.../publish``, ``.../ttl``) never reaches the delete-checkpoint route. Downloads are served by ``rlvr serve``
itself: ``.../files/<file>`` one file, ``.../archive`` the whole checkpoint as a tar, both with the API key.
``get_external_weights_urls`` answers with per-file URLs signed for the caller's key (``signing.py``), which a plain
HTTP client downloads without the key until they expire (``url_lifetime_s``, or the checkpoint's TTL if sooner).

Refused (HTTP 400, the message names the SDK method and why): ``copy_weights`` and ``assign_session_project``
(rlvr has no projects), ``export_session_trace`` (no traces are recorded), ``get_audit_log`` and
``get_billing_usage`` (no accounts, no billing). ``whoami`` never reaches the server (the SDK answers it from a JWT).

Not here: training, sampling and futures (``training.py``, ``sampling.py``, ``futures.py``), what a run or checkpoint
is (``catalog.py``), what a signed URL holds (``signing.py``).
"""

from __future__ import annotations

import io
import tarfile
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pydantic
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from tinker import types

from rlvr.server import wire
from rlvr.server.catalog import Catalog
from rlvr.server.routes.context import Body, Ctx, Owner, refusal
from rlvr.server.state import ServerState, Session, UnknownId

__all__ = ["REFUSED", "router"]

REFUSED = {
    ("POST", "/api/v1/copy_weights"): ("RestClient.copy_weights", "rlvr serve has no projects to copy into; "
                                       "download the checkpoint (get_external_weights_urls) instead"),
    ("PUT", "/api/v1/sessions/{session_id}/project"): ("RestClient.assign_session_project",
                                                       "rlvr serve has no projects"),
    ("GET", "/api/v1/sessions/{session_id}/trace_export"): ("RestClient.export_session_trace",
                                                            "rlvr serve records no session traces"),
    ("GET", "/api/v1/audit"): ("AdminClient.get_audit_log", "rlvr serve keeps no audit log"),
    ("GET", "/api/v1/billing/usage/events"): ("AdminClient.get_billing_usage", "rlvr serve does no billing"),
}


class _TtlBody(pydantic.BaseModel):
    ttl_seconds: int | None = None


class _WeightsInfoBody(pydantic.BaseModel):
    tinker_path: str


router = APIRouter()


# -- training runs ----------------------------------------------------------------------------------------------------

@router.get("/api/v1/training_runs")
async def training_runs(ctx: Ctx, owner: Owner, limit: int = 20, offset: int = 0) -> dict:
    ids = ctx.catalog.runs(owner)
    page = [ctx.catalog.run(r, owner) for r in ids[offset:offset + max(limit, 0)]]
    return wire.json_body(types.TrainingRunsResponse(
        training_runs=page, cursor=types.Cursor(offset=offset, limit=limit, total_count=len(ids))))


@router.get("/api/v1/training_runs/{run_id}")
async def training_run(run_id: str, ctx: Ctx, owner: Owner) -> dict:
    return wire.json_body(ctx.catalog.run(run_id, owner))


# -- checkpoints ------------------------------------------------------------------------------------------------------

@router.get("/api/v1/training_runs/{run_id}/checkpoints")
async def run_checkpoints(run_id: str, ctx: Ctx, owner: Owner) -> dict:
    return wire.json_body(types.CheckpointsListResponse(checkpoints=ctx.catalog.checkpoints(run_id, owner)))


@router.get("/api/v1/checkpoints")
async def user_checkpoints(ctx: Ctx, owner: Owner, limit: int = 100, offset: int = 0) -> dict:
    found = _all_checkpoints(ctx.catalog, owner)
    return wire.json_body(types.CheckpointsListResponse(
        checkpoints=found[offset:offset + max(limit, 0)],
        cursor=types.Cursor(offset=offset, limit=limit, total_count=len(found))))


@router.delete("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}")
async def delete_checkpoint(run_id: str, kind: str, name: str, ctx: Ctx, owner: Owner) -> Response:
    ctx.catalog.delete(run_id, kind, name, owner)
    return JSONResponse(None)


@router.post("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
async def publish(run_id: str, kind: str, name: str, ctx: Ctx, owner: Owner) -> Response:
    ctx.catalog.set_public(ctx.catalog.folder(run_id, kind, name, owner), True)
    return JSONResponse(None)


@router.delete("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
async def unpublish(run_id: str, kind: str, name: str, ctx: Ctx, owner: Owner) -> Response:
    ctx.catalog.set_public(ctx.catalog.folder(run_id, kind, name, owner), False)
    return JSONResponse(None)


@router.put("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
async def set_ttl(run_id: str, kind: str, name: str, body: Body, ctx: Ctx, owner: Owner) -> Response:
    req = wire.parse_json(_TtlBody, body)
    ctx.catalog.set_ttl(ctx.catalog.folder(run_id, kind, name, owner), req.ttl_seconds)
    return JSONResponse(None)


@router.post("/api/v1/weights_info")
async def weights_info(body: Body, ctx: Ctx, owner: Owner) -> dict:
    req = wire.parse_json(_WeightsInfoBody, body)
    return wire.json_body(ctx.catalog.weights_info(req.tinker_path, owner))


@router.get("/api/v1/billing/usage/checkpoints/current")
async def storage_usage(ctx: Ctx, owner: Owner, project_id: str | None = None) -> dict:
    found = _all_checkpoints(ctx.catalog, owner)
    size = sum(c.size_bytes or 0 for c in found)
    item = types.CurrentCheckpointStorageUsageItem(checkpoint_count=len(found), size_bytes=size,
                                                   size_gigabytes=size / 1e9)
    return wire.json_body(types.CurrentCheckpointStorageUsageResponse(data=[item]))


def _all_checkpoints(catalog: Catalog, owner: str) -> list[types.Checkpoint]:
    return [c for r in catalog.runs(owner) for c in catalog.checkpoints(r, owner)]


# -- downloads --------------------------------------------------------------------------------------------------------

@router.get("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls")
async def external_weights_urls(run_id: str, kind: str, name: str, request: Request, ctx: Ctx, owner: Owner) -> dict:
    catalog, signer = ctx.catalog, ctx.signer
    folder = catalog.folder(run_id, kind, name, owner)
    run = catalog.run_id(run_id, owner)
    ttl_end = next((c.expires_at.timestamp() for c in catalog.checkpoints(run, owner)
                    if c.checkpoint_id == f"{kind}/{name}" and c.expires_at is not None), None)
    expires = signer.expiry(not_after=ttl_end)
    base = str(request.base_url).rstrip("/")
    prefix = f"/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/files/"
    urls = {file: f"{base}{quote(prefix + file)}?{signer.sign(prefix + file, owner, expires)}"
            for file in catalog.files(folder)}
    return wire.json_body(types.ExternalWeightsUrlsResponse(urls=urls, expires=datetime.fromtimestamp(expires, UTC)))


@router.get("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/files/{file:path}")
async def checkpoint_file(run_id: str, kind: str, name: str, file: str, ctx: Ctx, owner: Owner) -> Response:
    folder = ctx.catalog.folder(run_id, kind, name, owner)
    if file not in ctx.catalog.files(folder):  # also refuses '..' and absolute paths: only listed files are served
        raise UnknownId(f"checkpoint {kind}/{name} of run {run_id!r} has no file {file!r}; "
                        "get_external_weights_urls lists its files")
    return FileResponse(folder / file, media_type="application/octet-stream")


@router.get("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/archive")
async def checkpoint_archive(run_id: str, kind: str, name: str, ctx: Ctx, owner: Owner) -> Response:
    folder = ctx.catalog.folder(run_id, kind, name, owner)

    def pack() -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for file in ctx.catalog.files(folder):
                tar.add(folder / file, arcname=f"{name}/{file}")
        return buffer.getvalue()

    data = await run_in_threadpool(pack)
    return Response(data, media_type="application/x-tar",
                    headers={"Content-Disposition": f'attachment; filename="{name}.tar"'})


# -- sessions ---------------------------------------------------------------------------------------------------------

@router.get("/api/v1/sessions")
async def list_sessions(ctx: Ctx, owner: Owner, limit: int = 20, offset: int = 0) -> dict:
    ids = [s.session_id for s in _sessions_of(ctx.state, owner)]
    return wire.json_body(types.ListSessionsResponse(sessions=ids[offset:offset + max(limit, 0)]))


@router.get("/api/v1/sessions/{session_id}")
async def get_session(session_id: str, ctx: Ctx, owner: Owner) -> dict:
    session = ctx.state.session(session_id, owner, live=False)
    return wire.json_body(types.GetSessionResponse(
        training_run_ids=list(session.model_ids), sampler_ids=list(session.sampler_ids),
        user_metadata={str(k): str(v) for k, v in session.user_metadata.items()} or None))


@router.post("/api/v1/sessions/search")
async def search_sessions(body: Body, ctx: Ctx, owner: Owner) -> dict:
    req = wire.parse_json(types.SessionSearchRequest, body)
    if req.project_ids:
        raise wire.BadRequest(f"RestClient.search_sessions: project_ids={req.project_ids!r}, but rlvr serve has "
                              "no projects; leave project_ids unset")
    if getattr(req.owner, "type", "own") != "own":
        raise wire.BadRequest("RestClient.search_sessions: rlvr serve searches only the caller's own sessions; "
                              "leave owner unset")
    found = [_summary(s, ctx.catalog) for s in reversed(_sessions_of(ctx.state, owner)) if _matches(s, req)]
    if req.cursor is not None:
        after = (req.cursor.last_created_at, req.cursor.last_session_id)
        found = [s for s in found if (s.created_at, s.session_id) < after]
    page = found[:req.limit]
    more = len(found) > req.limit
    return wire.json_body(types.SessionSearchResponse(
        sessions=page, next_cursor=types.SessionSearchCursor(
            last_created_at=page[-1].created_at, last_session_id=page[-1].session_id) if more else None))


def _sessions_of(state: ServerState, owner: str) -> list[Session]:
    """``owner``'s sessions, oldest first."""
    return sorted((s for s in state.sessions.values() if s.owner == owner), key=lambda s: (s.created_at, s.session_id))


# -- refused ----------------------------------------------------------------------------------------------------------

for (_method, _path), (_sdk_method, _why) in REFUSED.items():
    router.add_api_route(_path, refusal(f"{_sdk_method} is not supported: {_why}"), methods=[_method])


def _status(session: Session) -> Any:
    if session.finished is None:
        return types.SessionActive()
    reason = session.finished if session.finished in ("success", "errored", "interrupted") else "success"
    return types.ClientSessionFinished(reason={"type": reason}, detail=session.finished_detail)


def _matches(session: Session, req: types.SessionSearchRequest) -> bool:
    by_id = req.session_id is not None and session.session_id == req.session_id
    name = str(session.user_metadata.get("display_name", ""))
    by_name = req.display_name is not None and all(w.lower() in name.lower() for w in req.display_name.split())
    if (req.session_id is not None or req.display_name is not None) and not (by_id or by_name):
        return False
    if any(str(session.user_metadata.get(k)) != v for k, v in req.user_metadata.items()):
        return False
    status = _status(session).type
    return req.statuses is None or any(q.type == status for q in req.statuses)


def _summary(session: Session, catalog: Catalog) -> types.SessionSummary:
    runs = {catalog.state.run_of_model[m] for m in session.model_ids if m in catalog.state.run_of_model}
    count = sum(len(catalog.checkpoints(r, session.owner)) for r in runs)
    return types.SessionSummary(
        session_id=session.session_id, created_at=datetime.fromtimestamp(session.created_at, UTC),
        owner=session.owner, project_id="", status=_status(session), checkpoints_count=count,
        user_metadata={str(k): str(v) for k, v in session.user_metadata.items()} or None)
