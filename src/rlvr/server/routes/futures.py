"""The futures routes: ``retrieve_future``, the long poll through which the SDK receives the result of every queued
training and sampling request, and ``cancel_future``.

A poll waits up to ``long_poll_s`` for the result, then answers ``try_again`` (the SDK polls again). A result is
protobuf for forward_backward and sample (``wire.ProtoPayload``), JSON otherwise; a failed request answers 200 with
``{"error", "category"}``, ``user`` for what the caller can fix (its message says how), ``server`` for rlvr's own
failures, which are logged.

Not here: how futures are kept, owned and expired (``state.FutureStore``), what is queued (``training.py``,
``sampling.py``).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from tinker import types

from rlvr.errors import RlvrError
from rlvr.server import wire
from rlvr.server.routes.context import Body, Ctx, Owner
from rlvr.server.state import UnknownId

__all__ = ["retrieved", "router"]

log = logging.getLogger("rlvr.server")

router = APIRouter()


@router.post("/api/v1/retrieve_future")
async def retrieve_future(body: Body, ctx: Ctx, owner: Owner) -> Response:
    req = wire.parse_json(types.FutureRetrieveRequest, body)
    future = ctx.state.futures.get(req.request_id, owner)
    if not future.done():
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(
            lambda: waiter.done() or waiter.set_result(None)))
        await asyncio.wait([waiter], timeout=ctx.long_poll_s)
    return retrieved(req.request_id, future)


def retrieved(request_id: str, future: Future[Any]) -> Response:
    """The reply to a poll of ``request_id``'s ``future``: ``try_again`` while it runs, then its result or error."""
    if not future.done():
        return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
    if future.cancelled():
        return JSONResponse({"error": "the request was cancelled", "category": "user"})
    exc = future.exception()
    if exc is not None:
        user = isinstance(exc, (RlvrError, ValueError, KeyError, UnknownId, TypeError))
        if not user:
            log.error("request %s failed", request_id, exc_info=exc)
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}", "category": "user" if user else "server"})
    result = future.result()
    if isinstance(result, wire.ProtoPayload):
        return Response(result.data, media_type=wire.PROTO_CONTENT_TYPE)
    return JSONResponse(wire.json_body(result))


@router.post("/api/v1/cancel_future")
async def cancel_future(body: Body, ctx: Ctx, owner: Owner) -> Response:
    req = wire.parse_json(types.FutureRetrieveRequest, body)
    ctx.state.futures.cancel(req.request_id, owner)
    return JSONResponse(None)
