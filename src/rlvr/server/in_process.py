"""rlvr's sampling routes in process, with no socket and no key: ``create_openai_app`` (OpenAI's ``/v1`` routes and
vLLM's ``/inference/v1/generate`` as one ASGI app) and ``openai_client`` (an ``openai.AsyncOpenAI`` on it through
``httpx.ASGITransport``), for libraries that sample through an OpenAI client, such as verifiers.

Not here: the routes themselves (``openai.py``, ``generate.py``), ``rlvr serve``'s app with its keys (``app.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI

from rlvr.client import SamplingClient, ServiceClient
from rlvr.server import generate
from rlvr.server.catalog import Catalog
from rlvr.server.openai import openai_routes
from rlvr.server.state import ServerState

__all__ = ["create_openai_app", "openai_client"]


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
