"""``rlvr.server.routes.sessions``: health, ``client/config``, sessions (create, heartbeat, finish), and the
``unserved`` router's refusals and 404s."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlvr.server.routes import sessions
from rlvr.server.routes.context import RouteContext
from rlvr.server.state import Gone


def test_healthz_needs_no_key(api):
    r = api.http.get("/api/v1/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_client_config_follows_compress_fwdbwd(api):
    # Called directly: the flag is the context's, so a second context stands in for a second app.
    on = asyncio.run(sessions.client_config(api.ctx))
    off_ctx = RouteContext(**{**vars(api.ctx), "compress_fwdbwd": False})
    off = asyncio.run(sessions.client_config(off_ctx))
    assert on["proto_compress_fwdbwd"] is True and off["proto_compress_fwdbwd"] is False
    assert on["sample_use_retrieve_futures"] is False and on["custom_loss_server_side"] is False
    assert api.post("/client/config").json() == on


def test_capabilities_list_the_service_models(api):
    models = [m["model_name"] for m in api.get("/get_server_capabilities").json()["supported_models"]]
    assert "tiny" in models


def test_session_lives_until_finished(api):
    owner = api.owner
    body = json.dumps({"tags": [], "user_metadata": {"display_name": "mine"}, "sdk_version": "0.38.0"}).encode()
    session_id = asyncio.run(sessions.create_session(body, api.ctx, owner))["session_id"]
    assert api.ctx.state.session(session_id, owner).user_metadata == {"display_name": "mine"}
    assert api.post("/session_heartbeat", json={"session_id": session_id}).json() == {"type": "session_heartbeat"}
    assert api.post("/session_heartbeat", api.other, json={"session_id": session_id}).status_code == 404  # not theirs
    r = api.post(f"/sessions/{session_id}/finish", json={"reason": {"type": "errored"}, "detail": "boom"})
    assert r.status_code == 200 and r.json() is None
    assert api.ctx.state.sessions[session_id].finished == "errored"
    assert api.post("/session_heartbeat", json={"session_id": session_id}).status_code == 410
    with pytest.raises(Gone):
        asyncio.run(sessions.heartbeat(json.dumps({"session_id": session_id}).encode(), api.ctx, owner))


def test_finish_takes_an_empty_body(api):
    session_id = api.session()
    assert api.post(f"/sessions/{session_id}/finish").status_code == 200
    assert api.ctx.state.sessions[session_id].finished == "finished"


@pytest.mark.parametrize("path", list(sessions.OFF_IN_CLIENT_CONFIG))
def test_calls_client_config_switches_off_are_400_naming_the_feature(api, path):
    r = api.post(path.removeprefix("/api/v1") + "?sdk_method=x&why=y", json={})  # not taken from the query string
    sdk_method, why = sessions.OFF_IN_CLIENT_CONFIG[path]
    assert r.status_code == 400
    assert r.json()["detail"] == f"{sdk_method} is not supported by rlvr serve: {why}"


def test_any_other_api_path_is_404_naming_method_and_path(api):
    r = api.http.put("/api/v1/some/newer_call", headers={"X-API-Key": api.key})
    assert r.status_code == 404
    assert r.json()["detail"] == ("rlvr serve does not implement PUT /api/v1/some/newer_call; the tinker SDK call "
                                  "behind it is not supported")
    assert api.http.post("/api/v1/nope").status_code == 401  # the key is checked before any route


def test_open_path_with_another_method_is_404_without_a_key(api):
    # POST /api/v1/healthz skips the key check (the path is open) and reaches the catch-all with no principal.
    r = api.http.post("/api/v1/healthz", json={"model_id": "m", "seq_id": 3})
    assert r.status_code == 404 and "does not implement POST /api/v1/healthz" in r.json()["detail"]


def test_create_session_refuses_a_malformed_body(api):
    r = api.post("/create_session", json={"tags": "x"})
    assert r.status_code == 400 and "tags" in r.json()["detail"]
