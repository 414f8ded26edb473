"""What the server remembers between requests: sessions, models, samplers, and the futures clients poll.

* ``Sequencer`` -- runs one model's requests in ``seq_id`` order, one at a time, whatever order they arrive in
  (the SDK sends the chunks of one forward_backward concurrently). A retried request (same ``seq_id``) gets the
  same future back; a request refused before it was queued frees its ``seq_id`` at once (``refuse``); a gap that
  stays open for ``gap_timeout_s`` is skipped so one lost request cannot wedge a model.
* ``FutureStore`` -- request id -> concurrent future of a wire-ready result, kept for ``ttl_s`` after completion.
* ``ServerState`` -- the registries, keyed by the ids the SDK uses (``{session}:train:{n}``, ``{session}:sample:{n}``),
  each owned by the principal (API key digest) that created it; another key's ids read as unknown.

Jobs call the public ``rlvr`` client API (``rlvr.ServiceClient`` and its clients); blocking calls run on a small
dispatch pool, never on the event loop or the engine thread.

Not here: HTTP (``app.py``, ``routes/``), body formats (``wire.py``), model math (``rlvr.engine``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlvr.client import SamplingClient, ServiceClient, TrainingClient

__all__ = ["FutureStore", "Gone", "ModelEntry", "SamplerEntry", "SeqIdRefused", "Sequencer", "ServerState",
           "Session", "UnknownId", "chain", "done"]

log = logging.getLogger("rlvr.server")

Job = Callable[[], "Future[Any]"]
"""Starts one request and returns a future of its wire-ready result."""


class UnknownId(LookupError):
    """An id (session, model, sampler, request) this server does not know, or that belongs to another key (404)."""


class Gone(LookupError):
    """A session that has finished (410)."""


class SeqIdRefused(ValueError):
    """A request reusing the ``seq_id`` of a request this model refused earlier (400): that number is spent."""


def done(value: Any) -> Future[Any]:
    """A future already holding ``value``."""
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def chain(source: Any, convert: Callable[[Any], Any]) -> Future[Any]:
    """A future of ``convert(result of source)``; ``source`` is a concurrent future or a tinker APIFuture."""
    inner = source.future() if hasattr(source, "future") and not isinstance(source, Future) else source
    out: Future[Any] = Future()

    def finish(f: Future[Any]) -> None:
        try:
            out.set_result(convert(f.result()))
        except BaseException as exc:
            out.set_exception(exc)

    inner.add_done_callback(finish)
    return out


@dataclass(frozen=True)
class _Refused:
    """The mark a refused request leaves on its ``seq_id``: why it was refused."""

    reason: str


class Sequencer:
    """Runs the jobs of one model strictly one after another, in ``seq_id`` order.

    Each ``seq_id`` is taken once: by a job (``submit``), or by a refusal (``refuse``) that counts as done at once.
    The SDK numbers a model's requests itself and does not resend one the server refused with a 4xx, so without the
    refusal its number would stay a gap until ``gap_timeout_s`` and stall every request behind it.
    """

    def __init__(self, pool: ThreadPoolExecutor, first_seq: int = 1, gap_timeout_s: float = 10.0) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._next = first_seq
        """The seq_id whose turn it is: each lower one has run, been refused, or been skipped as lost."""
        self._waiting: dict[int, tuple[Job, Future[Any]]] = {}
        self._seen: dict[int, str | _Refused] = {}
        """seq_id -> the request id that took it, or its refusal."""
        self._busy = False
        self._gap_timeout_s = gap_timeout_s
        self._gap_timer: threading.Timer | None = None

    def submit(self, seq_id: int, request_id: str, job: Job) -> tuple[str, Future[Any] | None]:
        """Queue ``job`` as ``seq_id``; returns (request id, its future), or (earlier request id, None) for a repeat.

        Raises ``SeqIdRefused`` when ``seq_id`` belongs to a request refused earlier."""
        with self._lock:
            seen = self._seen.get(seq_id)
            if isinstance(seen, _Refused):
                raise SeqIdRefused(f"seq_id {seq_id} belongs to a request this model refused earlier ({seen.reason}); "
                                   "a seq_id is used once, so make the call again: the SDK gives it a new seq_id")
            if seen is not None:
                return seen, None
            self._seen[seq_id] = request_id
            future: Future[Any] = Future()
            self._waiting[seq_id] = (job, future)
        self._pump()
        return request_id, future

    def refuse(self, seq_id: int, reason: str) -> None:
        """Count ``seq_id`` as done without running anything: its request was refused before it was queued, for
        ``reason``. Requests after it no longer wait for it, and a later request with this seq_id is refused too.
        A seq_id a job already took keeps its job."""
        with self._lock:
            if seq_id in self._seen:
                return
            self._seen[seq_id] = _Refused(reason)
        self._pump()

    def _pump(self) -> None:
        with self._lock:
            while isinstance(self._seen.get(self._next), _Refused):
                self._next += 1
            if self._busy or not self._waiting:
                return
            first = min(self._waiting)
            if first > self._next:  # a gap: wait for the missing request, at most gap_timeout_s
                self._arm_gap_timer()
                return
            # first == next, or first < next: it arrived after its gap was skipped; run it, and keep next where it is
            job, future = self._waiting.pop(first)
            self._next = max(self._next, first + 1)
            self._busy = True
            if self._gap_timer is not None:  # the gap it waited on is closed; a later gap gets a full timeout
                self._gap_timer.cancel()
                self._gap_timer = None
        self._pool.submit(self._run, job, future)

    def _run(self, job: Job, future: Future[Any]) -> None:
        try:
            inner = job()
        except BaseException as exc:
            future.set_exception(exc)
            self._release()
            return

        def finish(f: Future[Any]) -> None:
            try:
                future.set_result(f.result())
            except BaseException as exc:
                future.set_exception(exc)
            self._pool.submit(self._release)  # Never start the next job on the engine thread.

        inner.add_done_callback(finish)

    def _release(self) -> None:
        with self._lock:
            self._busy = False
        self._pump()

    def _arm_gap_timer(self) -> None:
        if self._gap_timer is not None:
            return
        timer = threading.Timer(self._gap_timeout_s, self._skip_gap)
        timer.args = (timer,)
        timer.daemon = True
        self._gap_timer = timer
        timer.start()

    def _skip_gap(self, timer: threading.Timer) -> None:
        with self._lock:
            if timer is not self._gap_timer:  # fired as its gap closed: not this gap's timer
                return
            self._gap_timer = None
            if self._waiting and min(self._waiting) > self._next and not self._busy:
                log.warning("seq_id %d never arrived; running seq_id %d next", self._next, min(self._waiting))
                self._next = min(self._waiting)
        self._pump()


@dataclass
class _Stored:
    future: Future[Any]
    owner: str
    finished_at: float | None = None


class FutureStore:
    """Request id -> future of a wire-ready result (a pydantic model or ``wire.ProtoPayload``)."""

    def __init__(self, ttl_s: float = 900.0) -> None:
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._items: dict[str, _Stored] = {}

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def put(self, request_id: str, owner: str, future: Future[Any]) -> None:
        stored = _Stored(future, owner)
        with self._lock:
            self._sweep()
            self._items[request_id] = stored

        def mark(_: Future[Any]) -> None:
            stored.finished_at = time.monotonic()

        future.add_done_callback(mark)

    def get(self, request_id: str, owner: str) -> Future[Any]:
        with self._lock:
            stored = self._items.get(request_id)
        if stored is None or stored.owner != owner:
            raise UnknownId(f"request_id {request_id!r} is unknown or expired (results are kept {self._ttl_s:.0f} s "
                            "after they complete); submit the request again")
        return stored.future

    def cancel(self, request_id: str, owner: str) -> None:
        self.get(request_id, owner).cancel()

    def _sweep(self) -> None:
        now = time.monotonic()
        expired = [k for k, s in self._items.items() if s.finished_at is not None and now - s.finished_at > self._ttl_s]
        for key in expired:
            del self._items[key]


@dataclass
class Session:
    session_id: str
    owner: str
    user_metadata: dict[str, Any]
    created_at: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    """When the client last showed it was alive: a heartbeat, or any request in this session."""
    finished: str | None = None
    finished_detail: str | None = None
    """What the client said when it closed the session (``ServiceClient.close(status, detail)``)."""
    model_ids: list[str] = field(default_factory=list)
    """Every model created in this session, in order (kept after the session finishes, for get_session)."""
    sampler_ids: list[str] = field(default_factory=list)
    """Every sampling session created in this session, in order."""


@dataclass
class ModelEntry:
    model_id: str
    session_id: str
    owner: str
    base_model: str | None
    sequencer: Sequencer
    client: TrainingClient | None = None
    user_metadata: dict[str, Any] | None = None
    last_request_time: float = field(default_factory=time.time)


@dataclass
class SamplerEntry:
    sampler_id: str
    session_id: str
    owner: str
    client: SamplingClient
    base_model: str
    model_path: str | None
    seq: itertools.count = field(default_factory=itertools.count)


SESSION_TIMEOUT_S = 300.0
"""How long a session may stay silent (no heartbeat, no request) before the server ends it (``rlvr serve
--session-timeout``); the tinker SDK heartbeats every 10 s and warns after two minutes without one."""


class ServerState:
    """Every session, model, sampler and future of one server, over one ``rlvr.ServiceClient``."""

    def __init__(self, service: ServiceClient | None = None, *, gap_timeout_s: float = 10.0,
                 future_ttl_s: float = 900.0, dispatch_threads: int = 8,
                 session_timeout_s: float | None = SESSION_TIMEOUT_S) -> None:
        """``session_timeout_s``: a session silent that long (no heartbeat, no request) is finished as expired,
        freeing its models and samplers (None: never)."""
        if session_timeout_s is not None and session_timeout_s <= 0:
            raise ValueError(f"session_timeout_s={session_timeout_s} must be positive (None: sessions never expire)")
        self.session_timeout_s = session_timeout_s
        self.service = service or ServiceClient()
        self.pool = ThreadPoolExecutor(max_workers=dispatch_threads, thread_name_prefix="rlvr-server")
        self.futures = FutureStore(future_ttl_s)
        self.gap_timeout_s = gap_timeout_s
        self._lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, ModelEntry] = {}
        self.samplers: dict[str, SamplerEntry] = {}
        self.run_owners: dict[str, str] = {}
        """rlvr run id -> principal, for runs created through this server."""
        self.run_of_model: dict[str, str] = {}
        """model id the SDK holds -> the rlvr run id behind it (kept after its session finishes)."""

    # -- sessions ---------------------------------------------------------------------------------------------------

    def create_session(self, owner: str, user_metadata: dict[str, Any] | None) -> Session:
        self.expire_silent_sessions()
        session = Session(f"session-{uuid.uuid4().hex[:16]}", owner, dict(user_metadata or {}))
        with self._lock:
            self.sessions[session.session_id] = session
        return session

    def session(self, session_id: str, owner: str, *, live: bool = True) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.owner != owner:
            raise UnknownId(f"session_id {session_id!r} is unknown; create one with /api/v1/create_session")
        if live and session.finished is not None:
            raise Gone(f"session {session_id!r} has finished ({session.finished}); start a new ServiceClient")
        if live:
            session.last_heartbeat = time.time()
        return session

    def heartbeat(self, session_id: str, owner: str) -> None:
        """A live session's heartbeat (Gone once it finished); also the moment to expire silent sessions."""
        self.expire_silent_sessions()
        self.session(session_id, owner)

    def expire_silent_sessions(self, now: float | None = None) -> list[str]:
        """Finish, as ``expired``, every live session silent for ``session_timeout_s``: its client went away without
        closing it (the tinker SDK heartbeats every 10 s while a ServiceClient lives, and Tinker ends such sessions
        too). Its models and samplers are dropped, so their adapters leave the engine once no other code holds their
        clients. Returns the expired sessions' ids."""
        if self.session_timeout_s is None:
            return []
        now = time.time() if now is None else now
        silent = self.finish_live_sessions("expired", f"no heartbeat or request for {self.session_timeout_s:g} s",
                                           silent_since=now - self.session_timeout_s)
        for session in silent:
            log.info("session %s expired (silent for %.0f s); its models and samplers were dropped",
                     session.session_id, now - session.last_heartbeat)
        return [s.session_id for s in silent]

    def finish_live_sessions(self, reason: str, detail: str | None = None, *,
                             silent_since: float | None = None) -> list[Session]:
        """Finish every live session (only those silent since ``silent_since``, when given) as ``reason``, dropping
        their models and samplers; returns them."""
        live = [s for s in list(self.sessions.values()) if s.finished is None
                and (silent_since is None or s.last_heartbeat < silent_since)]
        for session in live:
            self.finish_session(session.session_id, session.owner, reason, detail)
        return live

    def finish_session(self, session_id: str, owner: str, reason: str, detail: str | None = None) -> None:
        session = self.session(session_id, owner, live=False)
        with self._lock:
            if session.finished is None:  # first reason wins, as Tinker's
                session.finished, session.finished_detail = reason, detail
            for key in [k for k, m in self.models.items() if m.session_id == session_id]:
                del self.models[key]
            for key in [k for k, s in self.samplers.items() if s.session_id == session_id]:
                del self.samplers[key]

    # -- models -----------------------------------------------------------------------------------------------------

    def add_model(self, session: Session, model_seq_id: int, base_model: str | None,
                  user_metadata: dict[str, Any] | None) -> ModelEntry:
        model_id = f"{session.session_id}:train:{model_seq_id}"
        with self._lock:
            if model_id in self.models:
                raise ValueError(f"model_seq_id {model_seq_id} was already used in session {session.session_id!r}; "
                                 "each create_model needs a new model_seq_id")
            entry = ModelEntry(model_id, session.session_id, session.owner, base_model,
                               Sequencer(self.pool, first_seq=0, gap_timeout_s=self.gap_timeout_s),
                               user_metadata=user_metadata)
            self.models[model_id] = entry
            session.model_ids.append(model_id)
        return entry

    def model(self, model_id: str, owner: str) -> ModelEntry:
        entry = self.models.get(model_id)
        if entry is None or entry.owner != owner:
            raise UnknownId(f"model_id {model_id!r} is unknown; use the model_id that create_model returned in a "
                            "live session")
        self.session(entry.session_id, owner)
        entry.last_request_time = time.time()
        return entry

    def bind(self, entry: ModelEntry, client: TrainingClient) -> None:
        """Attach the rlvr client that now backs ``entry``."""
        entry.client = client
        self.run_owners[client.model_id] = entry.owner
        self.run_of_model[entry.model_id] = client.model_id

    def trainer(self, entry: ModelEntry) -> TrainingClient:
        if entry.client is None:
            raise UnknownId(f"model {entry.model_id!r} failed to load or is still loading; create it again")
        return entry.client

    # -- samplers ---------------------------------------------------------------------------------------------------

    def add_sampler(self, session: Session, seq_id: int, client: SamplingClient, base_model: str,
                    model_path: str | None) -> SamplerEntry:
        entry = SamplerEntry(f"{session.session_id}:sample:{seq_id}", session.session_id, session.owner, client,
                             base_model, model_path)
        with self._lock:
            self.samplers[entry.sampler_id] = entry
            session.sampler_ids.append(entry.sampler_id)
        return entry

    def sampler(self, sampler_id: str, owner: str) -> SamplerEntry:
        entry = self.samplers.get(sampler_id)
        if entry is None or entry.owner != owner:
            raise UnknownId(f"sampling_session_id {sampler_id!r} is unknown; create one with create_sampling_client "
                            "or save_weights_and_get_sampling_client")
        self.session(entry.session_id, owner)
        return entry

    def close(self) -> None:
        """The server stops: every live session ends (``server_stopped``), dropping its models and samplers, and the
        dispatch pool takes no more work."""
        self.finish_live_sessions("server_stopped")
        self.pool.shutdown(wait=False, cancel_futures=True)

