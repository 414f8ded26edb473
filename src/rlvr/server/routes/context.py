"""What every ``/api/v1`` route works on: ``RouteContext`` (the server's state, its catalog of runs and checkpoints,
the URL signer, the tokenizer folders and ``create_app``'s settings) and the few steps the training routes share,
queueing a request on a model in ``seq_id`` order and freeing the ``seq_id`` of a request they refuse.

A route receives its inputs as FastAPI dependencies, so it is a plain async function of values that a test can call
without HTTP: ``ctx: Ctx`` (the app's ``RouteContext``, ``app.state.routes``), ``owner: Owner`` (the caller's
principal, which ``auth.py`` put in the request's scope) and ``body: Body`` (the raw request body).

Not here: the routes (``sessions.py``, ``training.py``, ``sampling.py``, ``futures.py``, ``rest.py``), what a session,
model or future is and the ``Sequencer`` that orders them (``state.py``), body formats (``wire.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from tinker import types

from rlvr.errors import RlvrError
from rlvr.server import wire
from rlvr.server.catalog import Catalog
from rlvr.server.hub import TokenizerFolders
from rlvr.server.signing import UrlSigner
from rlvr.server.state import Gone, ModelEntry, SeqIdRefused, ServerState, UnknownId

__all__ = ["Body", "Ctx", "Owner", "RouteContext", "accepted", "owner_of", "read_body", "refusal", "route_context"]


@dataclass
class RouteContext:
    """One server's routes' shared state and settings (``create_app`` builds it)."""

    state: ServerState
    """Every session, model, sampler and future, over the ``rlvr.ServiceClient`` that does the work."""
    catalog: Catalog
    """The training runs and checkpoints on disk, and whose they are."""
    signer: UrlSigner
    """Signs the download URLs of ``get_external_weights_urls``."""
    tokenizers: TokenizerFolders
    """Each model's tokenizer as a folder, for ``get_info``'s ``tokenizer_id`` and the ``/hf`` view."""
    max_body_bytes: int
    """The largest body accepted, decompressed ``forward_backward`` bodies included."""
    long_poll_s: float = 25.0
    """How long ``/retrieve_future`` waits for a result before answering ``try_again``."""
    compress_fwdbwd: bool = True
    """Whether ``client/config`` asks the SDK to zstd-compress ``forward_backward`` bodies."""

    def sequenced(self, owner: str, model_id: str, seq_id: int | None,
                  job: Callable[[ModelEntry], Future]) -> JSONResponse:
        """Queue ``job`` on ``owner``'s model ``model_id`` as its request ``seq_id``; the reply names its future."""
        entry = self.state.model(model_id, owner)
        if seq_id is None or seq_id < 1:
            raise wire.BadRequest(f"seq_id={seq_id!r} must be an integer >= 1 (the SDK numbers each model's requests "
                                  "from 1)")
        request_id, future = entry.sequencer.submit(seq_id, self.state.futures.new_id(), lambda: job(entry))
        if future is not None:
            self.state.futures.put(request_id, owner, future)
        return accepted(request_id, model_id)

    def created(self, owner: str, entry: ModelEntry, job: Callable[[], Future]) -> JSONResponse:
        """Queue ``job``, the creation of the new model ``entry``, as its request 0; the reply names its future."""
        request_id, future = entry.sequencer.submit(0, self.state.futures.new_id(), job)
        assert future is not None
        self.state.futures.put(request_id, owner, future)
        return accepted(request_id, entry.model_id)

    @contextlib.contextmanager
    def refusal_frees_seq_id(self, owner: str, position: Callable[[], tuple[str, int] | None]) -> Iterator[None]:
        """Wraps a route that queues a request on a model: if the route refuses it (4xx), the seq_id it carried is
        marked done on that model's sequencer. ``position`` reads (model_id, seq_id) from the body; it is called only
        on refusal, and may find none (then the gap timeout covers the number). A 5xx frees nothing: the SDK retries
        those with the same seq_id."""
        try:
            yield
        except (wire.BadRequest, RlvrError, UnknownId, Gone, SeqIdRefused) as exc:
            found = None if isinstance(exc, wire.BadRequest) and exc.status_code >= 500 else position()
            if found is not None and found[1] >= 1:  # seq_id 0 is the model's creation, queued by the server itself
                with contextlib.suppress(UnknownId, Gone):  # no such model for this key: no number to free
                    self.state.model(found[0], owner).sequencer.refuse(found[1], str(exc) or type(exc).__name__)
            raise

    def with_ttl(self, path: str, ttl_seconds: int | None) -> str:
        """The wire path of a checkpoint just saved, after giving it the TTL its save request asked for."""
        from rlvr.home import resolve

        if ttl_seconds is not None:
            self.catalog.set_ttl(resolve(path), ttl_seconds)
        return wire.to_wire_path(path)


def accepted(request_id: str, model_id: str | None = None, **extra: Any) -> JSONResponse:
    """The reply to a queued request: the id of the future the SDK then polls with ``/retrieve_future``."""
    return JSONResponse(wire.json_body(types.UntypedAPIFuture(request_id=request_id, model_id=model_id, **extra)))


def refusal(message: str) -> Callable[[], JSONResponse]:
    """A handler for a call rlvr serve does not take: every request gets a 400 saying ``message``. It has no
    parameters, which FastAPI would read from the query string."""

    def refuse() -> JSONResponse:
        raise wire.BadRequest(message)

    return refuse


def route_context(request: Request) -> RouteContext:
    """The ``RouteContext`` of the app serving ``request``."""
    return request.app.state.routes


def owner_of(request: Request) -> str:
    """The principal (a digest of the API key) that ``auth.AdmissionMiddleware`` admitted ``request`` as."""
    return request.scope["state"]["principal"]


async def read_body(request: Request) -> bytes:
    return await request.body()


Ctx = Annotated[RouteContext, Depends(route_context)]
Owner = Annotated[str, Depends(owner_of)]
Body = Annotated[bytes, Depends(read_body)]
