"""A live ``rlvr serve`` on a free loopback port for the server tests (uvicorn in a thread, stopped at the end)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi", reason="rlvr serve needs the server extra: pip install 'rlvr[server]'")
pytest.importorskip("uvicorn", reason="rlvr serve needs the server extra: pip install 'rlvr[server]'")

API_KEY = "tml-test-key-0123456789"
OTHER_KEY = "tml-other-key-0123456789"


@dataclass
class LiveServer:
    base_url: str
    api_key: str
    other_key: str
    max_body_bytes: int


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_live: dict[str, object] = {}
"""The running test server's ``ServerState``, once it exists."""


@pytest.fixture(autouse=True, scope="module")
def sessions_end_with_their_module() -> Iterator[None]:
    """When a module ends, every session still open on the test server is finished, as its client's ``close`` would:
    the cookbook's recipes never close theirs. Their training clients and samplers then leave the engine the whole
    worker shares, rather than growing it module after module, and the SDK's heartbeat threads stop at the 410
    rather than warn once the server is gone."""
    yield
    if "state" in _live:
        _live["state"].finish_live_sessions("module_ended")


@pytest.fixture(scope="session")
def server(rlvr_home, service) -> Iterator[LiveServer]:
    import uvicorn

    from rlvr.server import create_app
    from rlvr.server.app import KEEP_ALIVE_S

    max_body = 8 * 1024 * 1024
    app = create_app([API_KEY, OTHER_KEY], service=service, max_body_bytes=max_body, long_poll_s=5.0)
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                            timeout_keep_alive=KEEP_ALIVE_S)
    _live["state"] = app.state.rlvr
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True, name="rlvr-test-server")
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("rlvr test server did not start")
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", API_KEY, OTHER_KEY, max_body)
    finally:
        _live.pop("state", None)
        uv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def sdk(server: LiveServer):
    """The official tinker SDK's ServiceClient, pointed at the test server; one session per module."""
    import tinker

    client = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    yield client
    client.close("success").result(timeout=30)


@pytest.fixture
def root_logging_kept() -> Iterator[None]:
    """The root logger's handlers and level put back after the test: tinker-cookbook's recipes replace them with
    their own (console + a file in their log folder)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
