"""rlvr's sampling routes in process, with no socket and no key: ``create_openai_app`` (OpenAI's ``/v1`` routes and
vLLM's ``/inference/v1/generate`` as one ASGI app) and ``openai_client`` (an ``openai.AsyncOpenAI`` on it through
``httpx.ASGITransport``), for libraries that sample through an OpenAI client, such as verifiers 0.3. For libraries
that take only a URL (verifiers 0.4's ``TrainClient`` builds its own HTTP client), ``LoopbackEndpoint`` serves the
same app on a loopback port for the life of the process, behind a key made for it.

Not here: the routes themselves (``openai.py``, ``generate.py``), ``rlvr serve``'s app with its keys (``app.py``).
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI

from rlvr.client import SamplingClient, ServiceClient
from rlvr.errors import SamplingError
from rlvr.server import generate
from rlvr.server.auth import AdmissionMiddleware
from rlvr.server.catalog import Catalog
from rlvr.server.openai import openai_routes
from rlvr.server.state import ServerState

__all__ = ["LoopbackEndpoint", "create_openai_app", "openai_client"]


def create_openai_app(service: ServiceClient | None = None,
                      sampling_clients: Iterable[SamplingClient] = ()) -> FastAPI:
    """The OpenAI routes alone, at ``/v1``, and vLLM's ``/inference/v1/generate`` (``generate.py``), for in-process
    use: no API key (nothing outside the process reaches it), every checkpoint on disk visible. ``service`` samples
    base models and checkpoints (default: a ``rlvr.ServiceClient()`` on the shared engine, or the engine of the first
    of ``sampling_clients``)."""
    clients = list(sampling_clients)
    if service is None:
        service = ServiceClient(engine=clients[0].engine) if clients else ServiceClient()
    state = ServerState(service)
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    routes = openai_routes(state, Catalog(state), clients)
    app.mount("/v1", routes)
    app.mount(generate.MOUNT, generate.generate_routes(routes.state.models))
    app.state.models = routes.state.models
    return app


def openai_client(client: ServiceClient | SamplingClient | None = None, **options: Any) -> Any:
    """An ``openai.AsyncOpenAI`` that samples from ``client`` in this process, through ``create_openai_app`` over
    ``httpx.ASGITransport`` (no socket). A ``ServiceClient`` serves base models and saved sampler checkpoints; a
    ``SamplingClient`` is served as model ``client.model_path or client.get_base_model()`` besides those. ``options``
    go to ``AsyncOpenAI`` (``max_retries``, ``timeout``...). Needs the ``openai`` package; there is no synchronous
    ``OpenAI`` twin, as httpx has no synchronous ASGI transport."""
    import httpx
    import openai

    if isinstance(client, SamplingClient):
        app = create_openai_app(sampling_clients=[client])
    else:
        app = create_openai_app(client)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    http = httpx.AsyncClient(transport=transport, base_url="http://rlvr.in-process")
    return openai.AsyncOpenAI(base_url="http://rlvr.in-process/v1", api_key="in-process", http_client=http, **options)


class LoopbackEndpoint:
    """``create_openai_app(service)`` served by uvicorn from a daemon thread on ``127.0.0.1`` (a free port), behind
    ``key`` (made here, ``tml-`` + 32 random characters): the base URL is ``url`` (``url + "/v1"`` for an OpenAI
    client). ``serve(sampling_client)`` makes a sampling client's weights, saved or not, the model named by the name
    it returns, until the next ``serve`` (one at a time, so a loop's old samplers are let go). ``close()`` stops the
    server."""

    def __init__(self, service: ServiceClient, start_timeout_s: float = 30.0) -> None:
        import uvicorn

        self.key = "tml-" + secrets.token_urlsafe(24)
        self._served: str | None = None
        app = create_openai_app(service)
        self._models = app.state.models
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        guarded = AdmissionMiddleware(app, api_keys=[self.key], max_body_bytes=64 * 1024 * 1024)
        self._server = uvicorn.Server(uvicorn.Config(guarded, host="127.0.0.1", port=port, log_level="warning",
                                                     lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="rlvr-loopback-endpoint")
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise SamplingError(f"rlvr's loopback endpoint did not start on 127.0.0.1:{port} within "
                                    f"{start_timeout_s:g} s")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port}"

    def serve(self, client: SamplingClient) -> str:
        name = client.model_path or client.get_base_model()
        if self._served is not None:  # the previous step's weights: a loop serves one sampler at a time
            self._models.pinned.pop(self._served, None)
        self._models.pinned[name] = client
        self._served = name
        return name

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
