"""``rlvr.server.routes.futures``: what a poll of a future answers in each of its states, how long it waits, and that
a future is its owner's only. Handlers are called directly on futures the test makes."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import Future

from tinker import types

from rlvr.errors import RlvrError
from rlvr.server import wire
from rlvr.server.routes import futures
from rlvr.server.routes.context import RouteContext


def _body(request_id: str) -> bytes:
    return json.dumps({"request_id": request_id}).encode()


def _failed(exc: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(exc)
    return future


def _done(value: object) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def test_a_running_future_is_try_again():
    r = futures.retrieved("r1", Future())
    assert json.loads(r.body) == {"type": "try_again", "request_id": "r1", "queue_state": "active"}


def test_a_cancelled_future_is_a_user_error():
    future: Future = Future()
    future.cancel()
    assert json.loads(futures.retrieved("r1", future).body) == {"error": "the request was cancelled",
                                                                  "category": "user"}


def test_failures_are_user_or_server_errors_and_server_ones_are_logged(caplog):
    with caplog.at_level(logging.ERROR, logger="rlvr.server"):
        user = json.loads(futures.retrieved("r1", _failed(RlvrError("lr must be > 0; set it"))).body)
        assert not caplog.records
        server = json.loads(futures.retrieved("r2", _failed(RuntimeError("out of memory"))).body)
    assert user == {"error": "RlvrError: lr must be > 0; set it", "category": "user"}
    assert server == {"error": "RuntimeError: out of memory", "category": "server"}
    assert [r.getMessage() for r in caplog.records] == ["request r2 failed"]


def test_results_are_protobuf_or_json():
    proto = futures.retrieved("r1", _done(wire.ProtoPayload(b"\x08\x01")))
    assert proto.body == b"\x08\x01" and proto.media_type == wire.PROTO_CONTENT_TYPE
    saved = futures.retrieved("r2", _done(types.SaveWeightsResponse(path="tinker://run/weights/s1")))
    assert json.loads(saved.body)["path"] == "tinker://run/weights/s1"


def test_a_poll_waits_for_the_result_up_to_long_poll_s(api):
    ctx = RouteContext(**{**vars(api.ctx), "long_poll_s": 0.3})
    pending: Future = Future()
    ctx.state.futures.put("wait-1", api.owner, pending)
    started = time.monotonic()
    r = asyncio.run(futures.retrieve_future(_body("wait-1"), ctx, api.owner))
    assert json.loads(r.body)["type"] == "try_again" and time.monotonic() - started >= 0.29

    soon: Future = Future()  # another: the first poll's callback is on its own, closed, event loop
    ctx.state.futures.put("wait-2", api.owner, soon)
    threading.Timer(0.05, soon.set_result, [types.SaveWeightsResponse(path="tinker://r/weights/a")]).start()
    started = time.monotonic()
    r = asyncio.run(futures.retrieve_future(_body("wait-2"), ctx, api.owner))
    assert json.loads(r.body)["path"] == "tinker://r/weights/a" and time.monotonic() - started < 0.25


def test_a_future_is_its_owners_only_and_cancellable(api):
    pending: Future = Future()
    api.ctx.state.futures.put("mine-1", api.owner, pending)
    assert api.post("/retrieve_future", api.other, json={"request_id": "mine-1"}).status_code == 404
    assert api.post("/cancel_future", api.other, json={"request_id": "mine-1"}).status_code == 404
    assert not pending.cancelled()
    r = api.post("/cancel_future", json={"request_id": "mine-1"})
    assert r.status_code == 200 and r.json() is None and pending.cancelled()
    assert api.post("/retrieve_future", json={"request_id": "mine-1"}).json() == {
        "error": "the request was cancelled", "category": "user"}
    assert api.post("/retrieve_future", json={"request_id": "no-such"}).status_code == 404
