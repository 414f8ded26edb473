"""One ``create_app`` per test module for the routes' tests, driven in process through ``TestClient`` (no socket), and
its ``RouteContext`` for the tests that call a handler directly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

KEY = "tml-routes-key-0123456789"
OTHER = "tml-routes-other-0123456789"


@dataclass
class Api:
    """The app under test: ``http`` (a ``TestClient``), ``ctx`` (its ``RouteContext``) and a few SDK steps."""

    http: Any
    ctx: Any
    key: str = KEY
    other: str = OTHER
    """A second key: another caller, who sees none of the first one's sessions, models or futures."""

    @property
    def owner(self) -> str:
        """The principal of ``key``, as the routes' handlers take it."""
        from rlvr.server.auth import principal_of

        return principal_of(self.key)

    def post(self, path: str, key: str = KEY, **kwargs: Any) -> httpx.Response:
        headers = {"X-API-Key": key, **kwargs.pop("headers", {})}
        return self.http.post("/api/v1" + path, headers=headers, **kwargs)

    def get(self, path: str, key: str = KEY, **kwargs: Any) -> httpx.Response:
        return self.http.get("/api/v1" + path, headers={"X-API-Key": key}, **kwargs)

    def session(self, key: str = KEY) -> str:
        r = self.post("/create_session", key, json={"tags": [], "user_metadata": None, "sdk_version": "0.38.0"})
        assert r.status_code == 200, r.text
        return r.json()["session_id"]

    def result(self, accepted: httpx.Response, key: str = KEY, timeout_s: float = 60) -> httpx.Response:
        """The answer of the future an accepted request names, polled until it is no longer ``try_again``."""
        assert accepted.status_code == 200, accepted.text
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.post("/retrieve_future", key, json={"request_id": accepted.json()["request_id"]})
            if r.headers["content-type"].startswith("application/json") and r.json().get("type") == "try_again":
                assert time.monotonic() < deadline, "the future never finished"
                continue
            return r

    def model(self, key: str = KEY, seed: int = 0) -> str:
        """A new LoRA training client on ``tiny`` (rank 2), created and waited for; its model id."""
        r = self.post("/create_model", key, json={"session_id": self.session(key), "model_seq_id": 0,
                                                  "base_model": "tiny", "lora_config": {"rank": 2, "seed": seed}})
        done = self.result(r, key)
        assert "error" not in done.json(), done.text
        return done.json()["model_id"]


@pytest.fixture(scope="module")
def api(rlvr_home, service) -> Iterator[Api]:
    from fastapi.testclient import TestClient

    from rlvr.server import create_app

    app = create_app([KEY, OTHER], service=service, long_poll_s=2.0, gap_timeout_s=30.0)
    with TestClient(app) as http:
        yield Api(http, app.state.routes)
