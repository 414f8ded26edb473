"""Jobs that arrive one by one from many threads: :class:`JobStream`, behind :meth:`Sandbox.submit`.

What it is: an inbox of ``(job, future)`` pairs and one long-lived thread that feeds them to the pool as they come.
While anything is queued or running, the thread holds the pool (``Sandbox._lock``) and runs its usual loop, taking new
arrivals every turn (a pipe wakes it when one comes); a job starts as soon as a fork server is free, so a slow job
holds up its own server only, and nothing is ever dropped: the inbox has no bound. When the pool goes idle the thread
lets go of it (a ``run_many`` call may then take its turn) and sleeps until the next arrival.

What it is not: a second pool, or a scheduler with priorities: jobs start in the order they were submitted.
"""

from __future__ import annotations

import functools
import os
import select
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rlvr.errors import SandboxError
from rlvr.sandbox.frames import Job


class _Results:
    """Where the pool's loop puts results: each one resolves its future and forgets its job."""

    def __init__(self, jobs: dict[int, Any], futures: dict[int, Future]) -> None:
        self.jobs, self.futures = jobs, futures

    def __setitem__(self, key: int, result: Any) -> None:
        self.jobs.pop(key, None)
        future = self.futures.pop(key, None)
        if future is not None and not future.done():
            future.set_result(result)


class JobStream:
    """The inbox and feeding thread of one :class:`Sandbox` (created by its first ``submit``): ``pool_lock`` is the
    pool's lock (``Sandbox._lock``), held while anything runs, and ``drive`` its loop (``Sandbox._drive``)."""

    def __init__(self, pool_lock: threading.Lock, drive: Callable[..., None]) -> None:
        self._pool_lock, self._drive = pool_lock, drive
        self._inbox: deque[tuple[Job, Future]] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._jobs: dict[int, Any] = {}
        self._futures: dict[int, Future] = {}
        self._next_key = 0
        self._thread = threading.Thread(target=self._feed, name="rlvr-sandbox-stream", daemon=True)
        self._thread.start()

    def put(self, job: Job) -> Future:
        """Queue ``job``; a future of its result."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise SandboxError("this Sandbox is closed; create a new one")
            self._inbox.append((job, future))
        self._wake()
        return future

    def close(self) -> None:
        """Fail what is queued or running with SandboxError and stop the thread (the Sandbox then stops its servers)."""
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(timeout=60.0)

    # -- the feeding thread ----------------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already: the thread will look
            pass

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _intake(self, queue: deque) -> None:
        """Move the inbox into the loop's queue (called every turn); on close, end the loop."""
        self._drain_wake()
        with self._lock:
            if self._closed:
                raise _Closed
            while self._inbox:
                job, future = self._inbox.popleft()
                key, self._next_key = self._next_key, self._next_key + 1
                self._jobs[key], self._futures[key] = job, future
                queue.append(key)

    def _feed(self) -> None:
        while True:
            select.select([self._wake_r], [], [])
            with self._lock:
                if self._closed and not self._inbox:
                    break
            queue: deque[int] = deque()
            try:
                with self._pool_lock:
                    self._drive(self._jobs, queue, _Results(self._jobs, self._futures),
                                functools.partial(self._intake, queue), self._wake_r)
            except _Closed:
                break
            except BaseException as exc:  # no server could start, say: every waiting caller hears why
                self._fail_all(SandboxError(f"the sandbox pool failed: {exc}"))
        self._fail_all(SandboxError("this Sandbox was closed before the job ran; create a new one"))
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            pending = list(self._futures.values()) + [future for _, future in self._inbox]
            self._inbox.clear()
            self._futures.clear()
            self._jobs.clear()
        for future in pending:
            if not future.done():
                future.set_exception(error)


class _Closed(Exception):
    """Raised inside the pool's loop to end it when the stream is closed."""
