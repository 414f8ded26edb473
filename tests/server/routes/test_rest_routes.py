"""``rlvr.server.routes.rest``: the RestClient's session listing and search (handlers and their helpers called
directly), the calls refused with the SDK method's name, and what a checkpoint's file routes refuse."""

from __future__ import annotations

import asyncio
import json

import pytest
from tinker import types

from rlvr.server.routes import rest


def _search(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_sessions_are_listed_oldest_first_a_page_at_a_time(api):
    first, second, third = api.session(), api.session(), api.session()
    every = asyncio.run(rest.list_sessions(api.ctx, api.owner, limit=1000))["sessions"]
    assert every[-3:] == [first, second, third]
    page = asyncio.run(rest.list_sessions(api.ctx, api.owner, limit=2, offset=len(every) - 3))["sessions"]
    assert page == [first, second]
    assert first not in asyncio.run(rest.list_sessions(api.ctx, "someone-else", limit=1000))["sessions"]
    assert api.get("/sessions", params={"limit": 1000}).json()["sessions"] == every


def test_search_finds_by_display_name_words_and_pages_newest_first(api):
    ids = [api.post("/create_session", json={"tags": [], "user_metadata": {"display_name": f"Search Me {n}"},
                                             "sdk_version": "0.38.0"}).json()["session_id"] for n in range(3)]
    found = asyncio.run(rest.search_sessions(_search(display_name="me search", limit=2), api.ctx, api.owner))
    assert [s["session_id"] for s in found["sessions"]] == [ids[2], ids[1]]
    cursor = found["next_cursor"]
    rest_of = asyncio.run(rest.search_sessions(_search(display_name="me search", limit=2, cursor=cursor),
                                               api.ctx, api.owner))
    assert [s["session_id"] for s in rest_of["sessions"]] == [ids[0]] and "next_cursor" not in rest_of


def test_search_matches_statuses():
    from rlvr.server.state import Session

    live, done = Session("a", "o", {}), Session("b", "o", {})
    done.finished = "errored"
    active = types.SessionSearchRequest.model_validate({"statuses": [{"type": "active"}]})
    assert rest._matches(live, active) and not rest._matches(done, active)
    assert rest._status(done).reason.type == "errored"


def test_search_refuses_projects_and_other_owners(api):
    r = api.post("/sessions/search", json={"project_ids": ["p1"]})
    assert r.status_code == 400 and "project_ids=['p1'], but rlvr serve has no projects" in r.json()["detail"]


@pytest.mark.parametrize(("method", "path"), list(rest.REFUSED))
def test_calls_without_meaning_here_are_400_naming_the_sdk_method(api, method, path):
    sdk_method, why = rest.REFUSED[(method, path)]
    r = api.http.request(method, path.replace("{session_id}", "s1"), headers={"X-API-Key": api.key},
                         params={"sdk_method": "x", "why": "a caller's words"})  # not taken from the query string
    assert r.status_code == 400 and r.json()["detail"] == f"{sdk_method} is not supported: {why}"


def test_a_finished_session_is_still_shown(api):
    session_id = api.session()
    api.post(f"/sessions/{session_id}/finish", json={"reason": {"type": "success"}})
    got = asyncio.run(rest.get_session(session_id, api.ctx, api.owner))
    assert got == {"training_run_ids": [], "sampler_ids": []}


def test_checkpoint_files_outside_the_listing_are_404(api):
    model_id = api.model()
    saved = api.result(api.post("/save_weights_for_sampler", json={"model_id": model_id, "seq_id": 1, "path": "w"}))
    run = saved.json()["path"].split("/")[2]
    files = f"/training_runs/{run}/checkpoints/sampler_weights/w/files"
    urls = api.get(f"/training_runs/{run}/checkpoints/sampler_weights/w/external_weights_urls").json()["urls"]
    assert urls and all(u.startswith(f"http://testserver/api/v1{files}/") for u in urls.values())
    r = api.get(f"{files}/rlvr.json.missing")
    assert r.status_code == 404 and "get_external_weights_urls lists its files" in r.json()["detail"]
    assert api.get(f"{files}/{next(iter(urls))}", api.other).status_code == 404  # another key's run
