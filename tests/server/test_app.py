"""``rlvr.server.app``: what ``create_app`` puts together (its settings in the routes' context, the routers in order,
the catch-all last, ``/hf`` and ``/v1`` beside them) and the status each error a route raises is answered with."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from rlvr.errors import ConfigurationError, RlvrError
from rlvr.server import wire
from rlvr.server.app import create_app
from rlvr.server.auth import BodyTooLarge
from rlvr.server.routes.context import RouteContext
from rlvr.server.state import Gone, SeqIdRefused, UnknownId

KEY = "tml-app-key-0123456789"


@pytest.fixture(scope="module")
def app(rlvr_home, service) -> Iterator[FastAPI]:
    yield create_app(KEY, service=service, long_poll_s=3.0, compress_fwdbwd=False, max_body_bytes=1 << 20)


@pytest.fixture(scope="module")
def http(app) -> Iterator[TestClient]:
    with TestClient(app, headers={"X-API-Key": KEY}) as client:
        yield client


def test_the_settings_reach_the_routes_context(app):
    ctx = app.state.routes
    assert isinstance(ctx, RouteContext) and ctx.state is app.state.rlvr
    assert (ctx.long_poll_s, ctx.compress_fwdbwd, ctx.max_body_bytes) == (3.0, False, 1 << 20)


def test_long_poll_must_end_before_the_sdk_gives_up(rlvr_home, service):
    with pytest.raises(ConfigurationError, match=r"long_poll_s=45 must be in \(0, 45\)"):
        create_app(KEY, service=service, long_poll_s=45)


@pytest.mark.parametrize(("exc", "status"), [
    (wire.BadRequest("bad field"), 400), (wire.BadRequest("too big", 413), 413), (BodyTooLarge("body"), 413),
    (UnknownId("no such model"), 404), (Gone("session finished"), 410), (RlvrError("lr < 0"), 400),
    (SeqIdRefused("seq_id 3 refused"), 400), (UnknownId(), 404),
])
def test_each_error_has_its_status_and_its_message(app, exc, status):
    # The handler Starlette picks: the one of the nearest class in the error's MRO.
    handler = next(app.exception_handlers[c] for c in type(exc).__mro__ if c in app.exception_handlers)
    reply = handler(None, exc)
    assert reply.status_code == status
    assert json.loads(reply.body) == {"detail": str(exc) or type(exc).__name__}


def test_the_catch_all_comes_after_every_route(http):
    # A RestClient path that the catch-all would also take reaches its own route (a 404 of the catalog's).
    r = http.delete("/api/v1/training_runs/no-such-run/checkpoints/weights/s1")
    assert r.status_code == 404 and "does not implement" not in r.json()["detail"]


def test_the_openai_and_hub_views_are_mounted_beside(http):
    assert http.get("/v1/models").json()["object"] == "list"
    assert http.get("/hf/api/models/tiny").headers["x-error-code"] == "RepoNotFound"  # no sampler of ours yet
