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

Not here: training, sampling and futures (``app.py``), what a run or checkpoint is (``catalog.py``).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from tinker import types

from rlvr.server import wire
from rlvr.server.catalog import Catalog
from rlvr.server.signing import UrlSigner
from rlvr.server.state import ServerState, Session, UnknownId

__all__ = ["add_rest_routes"]

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


def add_rest_routes(app: FastAPI, state: ServerState, catalog: Catalog, owner: Callable[[Request], str],
                    signer: UrlSigner) -> None:
    """Register the RestClient routes on ``app`` (before any catch-all route); ``signer`` signs download URLs."""

    # -- training runs ----------------------------------------------------------------------------------------------

    @app.get("/api/v1/training_runs")
    async def training_runs(request: Request, limit: int = 20, offset: int = 0) -> dict:
        ids = catalog.runs(owner(request))
        page = [catalog.run(r, owner(request)) for r in ids[offset:offset + max(limit, 0)]]
        return wire.json_body(types.TrainingRunsResponse(
            training_runs=page, cursor=types.Cursor(offset=offset, limit=limit, total_count=len(ids))))

    @app.get("/api/v1/training_runs/{run_id}")
    async def training_run(run_id: str, request: Request) -> dict:
        return wire.json_body(catalog.run(run_id, owner(request)))

    # -- checkpoints ------------------------------------------------------------------------------------------------

    @app.get("/api/v1/training_runs/{run_id}/checkpoints")
    async def run_checkpoints(run_id: str, request: Request) -> dict:
        return wire.json_body(types.CheckpointsListResponse(checkpoints=catalog.checkpoints(run_id, owner(request))))

    @app.get("/api/v1/checkpoints")
    async def user_checkpoints(request: Request, limit: int = 100, offset: int = 0) -> dict:
        found = [c for r in catalog.runs(owner(request)) for c in catalog.checkpoints(r, owner(request))]
        return wire.json_body(types.CheckpointsListResponse(
            checkpoints=found[offset:offset + max(limit, 0)],
            cursor=types.Cursor(offset=offset, limit=limit, total_count=len(found))))

    @app.delete("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}")
    async def delete_checkpoint(run_id: str, kind: str, name: str, request: Request) -> Response:
        catalog.delete(run_id, kind, name, owner(request))
        return JSONResponse(None)

    @app.post("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def publish(run_id: str, kind: str, name: str, request: Request) -> Response:
        catalog.set_public(catalog.folder(run_id, kind, name, owner(request)), True)
        return JSONResponse(None)

    @app.delete("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def unpublish(run_id: str, kind: str, name: str, request: Request) -> Response:
        catalog.set_public(catalog.folder(run_id, kind, name, owner(request)), False)
        return JSONResponse(None)

    @app.put("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
    async def set_ttl(run_id: str, kind: str, name: str, request: Request) -> Response:
        body = wire.parse_json(_TtlBody, await request.body())
        catalog.set_ttl(catalog.folder(run_id, kind, name, owner(request)), body.ttl_seconds)
        return JSONResponse(None)

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request) -> dict:
        body = wire.parse_json(_WeightsInfoBody, await request.body())
        return wire.json_body(catalog.weights_info(body.tinker_path, owner(request)))

    @app.get("/api/v1/billing/usage/checkpoints/current")
    async def storage_usage(request: Request, project_id: str | None = None) -> dict:
        found = [c for r in catalog.runs(owner(request)) for c in catalog.checkpoints(r, owner(request))]
        size = sum(c.size_bytes or 0 for c in found)
        item = types.CurrentCheckpointStorageUsageItem(checkpoint_count=len(found), size_bytes=size,
                                                       size_gigabytes=size / 1e9)
        return wire.json_body(types.CurrentCheckpointStorageUsageResponse(data=[item]))

    # -- downloads --------------------------------------------------------------------------------------------------

    @app.get("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls")
    async def external_weights_urls(run_id: str, kind: str, name: str, request: Request) -> dict:
        folder = catalog.folder(run_id, kind, name, owner(request))
        run = catalog.run_id(run_id, owner(request))
        ttl_end = next((c.expires_at.timestamp() for c in catalog.checkpoints(run, owner(request))
                        if c.checkpoint_id == f"{kind}/{name}" and c.expires_at is not None), None)
        expires = signer.expiry(not_after=ttl_end)
        base = str(request.base_url).rstrip("/")
        prefix = f"/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/files/"
        urls = {file: f"{base}{quote(prefix + file)}?{signer.sign(prefix + file, owner(request), expires)}"
                for file in catalog.files(folder)}
        return wire.json_body(types.ExternalWeightsUrlsResponse(urls=urls,
                                                                expires=datetime.fromtimestamp(expires, UTC)))

    @app.get("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/files/{file:path}")
    async def checkpoint_file(run_id: str, kind: str, name: str, file: str, request: Request) -> Response:
        folder = catalog.folder(run_id, kind, name, owner(request))
        if file not in catalog.files(folder):  # also refuses '..' and absolute paths: only listed files are served
            raise UnknownId(f"checkpoint {kind}/{name} of run {run_id!r} has no file {file!r}; "
                            "get_external_weights_urls lists its files")
        return FileResponse(folder / file, media_type="application/octet-stream")

    @app.get("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/archive")
    async def checkpoint_archive(run_id: str, kind: str, name: str, request: Request) -> Response:
        folder = catalog.folder(run_id, kind, name, owner(request))

        def pack() -> bytes:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                for file in catalog.files(folder):
                    tar.add(folder / file, arcname=f"{name}/{file}")
            return buffer.getvalue()

        data = await run_in_threadpool(pack)
        return Response(data, media_type="application/x-tar",
                        headers={"Content-Disposition": f'attachment; filename="{name}.tar"'})

    # -- sessions ---------------------------------------------------------------------------------------------------

    def sessions_of(request: Request) -> list[Session]:
        return sorted((s for s in state.sessions.values() if s.owner == owner(request)),
                      key=lambda s: (s.created_at, s.session_id))

    @app.get("/api/v1/sessions")
    async def list_sessions(request: Request, limit: int = 20, offset: int = 0) -> dict:
        ids = [s.session_id for s in sessions_of(request)]
        return wire.json_body(types.ListSessionsResponse(sessions=ids[offset:offset + max(limit, 0)]))

    @app.get("/api/v1/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> dict:
        session = state.session(session_id, owner(request), live=False)
        return wire.json_body(types.GetSessionResponse(
            training_run_ids=list(session.model_ids), sampler_ids=list(session.sampler_ids),
            user_metadata={str(k): str(v) for k, v in session.user_metadata.items()} or None))

    @app.post("/api/v1/sessions/search")
    async def search_sessions(request: Request) -> dict:
        req = wire.parse_json(types.SessionSearchRequest, await request.body())
        if req.project_ids:
            raise wire.BadRequest(f"RestClient.search_sessions: project_ids={req.project_ids!r}, but rlvr serve has "
                                  "no projects; leave project_ids unset")
        if getattr(req.owner, "type", "own") != "own":
            raise wire.BadRequest("RestClient.search_sessions: rlvr serve searches only the caller's own sessions; "
                                  "leave owner unset")
        found = [_summary(s, catalog) for s in reversed(sessions_of(request)) if _matches(s, req)]
        if req.cursor is not None:
            after = (req.cursor.last_created_at, req.cursor.last_session_id)
            found = [s for s in found if (s.created_at, s.session_id) < after]
        page = found[:req.limit]
        more = len(found) > req.limit
        return wire.json_body(types.SessionSearchResponse(
            sessions=page, next_cursor=types.SessionSearchCursor(
                last_created_at=page[-1].created_at, last_session_id=page[-1].session_id) if more else None))

    # -- refused ----------------------------------------------------------------------------------------------------

    for (method, path), (sdk_method, why) in REFUSED.items():
        def refuse(request: Request, sdk_method: str = sdk_method, why: str = why) -> Response:
            raise wire.BadRequest(f"{sdk_method} is not supported: {why}")

        app.add_api_route(path, refuse, methods=[method])


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
