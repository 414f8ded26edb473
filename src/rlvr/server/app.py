"""The app of ``rlvr serve``: Tinker's ``/api/v1`` protocol, as the official ``tinker`` SDK (>= 0.38) speaks it, put
together from its routers (``create_app``), and the server that runs it (``serve``).

Each route (``routes/``) parses its body (``wire.py``), turns it into calls on the public rlvr client API
(``rlvr.ServiceClient``, ``TrainingClient``, ``SamplingClient``) through ``state.py``, and answers the way the SDK
expects: most training and sampling calls return a future id at once (``UntypedAPIFuture``), and the SDK long-polls
``/retrieve_future`` for the result (protobuf for forward_backward and sample, JSON otherwise).

Status codes (``ERROR_STATUS``): 400 malformed body or a request rlvr rejects (message names the field and the fix),
401 bad or missing key (``auth.py``), 403 an expired or altered signed download URL (``signing.py``), 404 unknown id or
route, 410 finished session, 413 body too large. A failure inside one request is reported on that request's future
only; the server keeps serving everyone else. A request refused with a 4xx before it was queued frees its ``seq_id``
at once (``Sequencer.refuse``): the SDK does not resend it, and the model's next request must not wait out the gap
timeout for it.

Not here: the routes, by concern (``routes/``: ``sessions.py``, ``training.py``, ``sampling.py``, ``futures.py``, and
``rest.py`` for the RestClient), what they share (``routes/context.py``), body formats (``wire.py``),
sessions/ordering (``state.py``), keys and size limits (``auth.py``), what a run or checkpoint is (``catalog.py``),
signed download URLs (``signing.py``), tokenizer folders and their hub-shaped view at ``/hf`` (``hub.py``), the
OpenAI-compatible sampling routes mounted at ``/v1`` (``openai.py``) and vLLM's token-in/token-out route at
``/inference/v1/generate`` (``generate.py``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlvr.client import ServiceClient
from rlvr.errors import ConfigurationError, RlvrError, RunInterrupted
from rlvr.server import generate, wire
from rlvr.server.auth import AdmissionMiddleware, BodyTooLarge, load_api_keys, principal_of
from rlvr.server.catalog import Catalog
from rlvr.server.hub import TokenizerFolders, add_hub_routes
from rlvr.server.openai import openai_routes
from rlvr.server.routes import futures, rest, sampling, sessions, training
from rlvr.server.routes.context import RouteContext, owner_of
from rlvr.server.signing import DEFAULT_LIFETIME_S, UrlSigner, load_secret
from rlvr.server.state import SESSION_TIMEOUT_S, Gone, SeqIdRefused, ServerState, UnknownId

__all__ = ["create_app", "serve"]

log = logging.getLogger("rlvr.server")

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
KEEP_ALIVE_S = 120
"""Idle keep-alive for client connections: longer than the SDK's pauses, so it never sends on a connection the server
has just closed (uvicorn's default of 5 s makes the SDK see connection errors and back off for up to 30 s)."""
GRACE_S = 30
"""How long a stopping server waits for the requests in flight (a long poll lasts at most ``long_poll_s``)."""


def create_app(api_keys: str | list[str] | None = None, *, keys_file: str | Path | None = None,
               service: ServiceClient | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               long_poll_s: float = 25.0, compress_fwdbwd: bool = True, gap_timeout_s: float = 10.0,
               url_lifetime_s: float = DEFAULT_LIFETIME_S,
               session_timeout_s: float | None = SESSION_TIMEOUT_S) -> FastAPI:
    """The ASGI app serving Tinker's protocol on ``service`` (default: a ``rlvr.ServiceClient()`` on the shared engine).

    ``api_keys`` / ``keys_file``: accepted keys (default ``$RLVR_API_KEY`` / ``$RLVR_API_KEYS_FILE``), each ``tml-...``.
    ``long_poll_s``: how long ``/retrieve_future`` waits for a result before answering ``try_again`` (the SDK gives up
    on a poll after 45 s). ``compress_fwdbwd``: ask the SDK to zstd-compress forward_backward bodies.
    ``url_lifetime_s``: how long the signed download URLs of ``get_external_weights_urls`` hold (signed with the
    secret in ``$RLVR_HOME/server/url-signing.key``, made on first use). ``session_timeout_s``: a session silent that
    long (no heartbeat, no request: its client went away unclosed) ends, freeing its models (None: never).
    """
    from rlvr.home import rlvr_home

    keys = load_api_keys(api_keys, keys_file)
    if not 0 < long_poll_s < 45:
        raise ConfigurationError(f"long_poll_s={long_poll_s} must be in (0, 45): the tinker SDK abandons a "
                                 "retrieve_future poll after 45 s")
    signer = UrlSigner(load_secret(rlvr_home() / "server"), {principal_of(k) for k in keys}, url_lifetime_s)
    state = ServerState(service, gap_timeout_s=gap_timeout_s, session_timeout_s=session_timeout_s)
    ctx = RouteContext(state, Catalog(state), signer, TokenizerFolders(), max_body_bytes, long_poll_s, compress_fwdbwd)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.close()

    app = FastAPI(title="rlvr", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_middleware(AdmissionMiddleware, api_keys=keys, max_body_bytes=max_body_bytes, signer=signer)
    app.state.rlvr = state
    app.state.routes = ctx
    for exc_type, status in ERROR_STATUS.items():
        app.add_exception_handler(exc_type, _error_reply(status))
    for routes in (sessions.router, training.router, sampling.router, futures.router, rest.router):
        app.include_router(routes)
    add_hub_routes(app, state, ctx.tokenizers, owner_of)  # /hf: tokenizers for SamplingClient.get_tokenizer
    openai = openai_routes(state, ctx.catalog)
    app.mount("/v1", openai)  # OpenAI-compatible sampling
    app.mount(generate.MOUNT, generate.generate_routes(openai.state.models))  # vLLM's token-in/token-out route
    app.include_router(sessions.unserved)  # last: it takes every /api/v1 path the routes above do not
    return app


ERROR_STATUS: dict[type[BaseException], int | None] = {
    wire.BadRequest: None, BodyTooLarge: 413, UnknownId: 404, Gone: 410, RlvrError: 400, SeqIdRefused: 400}
"""The HTTP status of each error a route may raise (``None``: the error's own ``status_code``)."""


def _error_reply(status: int | None) -> Callable[[Request, Exception], JSONResponse]:
    def reply(request: Request, exc: Exception) -> JSONResponse:
        code = status if status is not None else exc.status_code  # type: ignore[attr-defined]
        return JSONResponse({"detail": str(exc) or type(exc).__name__}, status_code=code)

    return reply


def serve(host: str = "127.0.0.1", port: int = 8000, api_keys: str | list[str] | None = None, *,
          keys_file: str | Path | None = None, log_level: str = "info", **app_options: Any) -> None:
    """Run the server until interrupted (the ``rlvr serve`` command). Binds loopback only unless ``host`` says
    otherwise; keys default to ``$RLVR_API_KEY`` / ``$RLVR_API_KEYS_FILE``.

    SIGTERM or Ctrl-C stop it: no new connections, the requests in flight answered (those still open after
    ``GRACE_S`` are cut), then RunInterrupted (``rlvr`` exits with 128 + the signal); a second Ctrl-C cuts the
    requests in flight at once."""
    import uvicorn

    app = create_app(api_keys, keys_file=keys_file, **app_options)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("rlvr serve is listening on %s: anyone who can reach it and holds a key can train and sample", host)
    server = _stoppable_server()(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                                timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACE_S))
    server.run()
    if server.stopped_by is not None:
        raise RunInterrupted(server.stopped_by)


def _stoppable_server() -> type:
    import uvicorn  # the class is built when serving: uvicorn is imported only then

    class StoppableServer(uvicorn.Server):
        """uvicorn's server, which records the signal that stopped it instead of raising it again once shut down (so
        the process ends with 128 + the signal whatever the signal's disposition was when it started)."""

        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stopped_by is None:
                self.stopped_by = sig
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # the second Ctrl-C: requests in flight are cut
            else:
                self.should_exit = True

    return StoppableServer
