"""ActorFuture: a Tinker ``APIFuture`` over one Ray actor call, re-sent when its actor dies and comes back.

What it is: ``result()`` / ``await`` / ``future()`` as Tinker's futures have them; the call's own exception is raised
as itself (unwrapped from Ray's RayTaskError); an actor death is handed to a ``recover`` callback (see
``cluster.Replicas.recover``) which waits for Ray's restart, and the call is sent again, up to
:data:`MAX_ATTEMPTS` times in all; otherwise the call fails with WorkerLostError.

What it is not: the policy of what to do on a restart (``cluster.Replicas``). This module imports tinker, and with
it torch, so the torch-free reward actors never import it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future as ConcurrentFuture
from types import ModuleType
from typing import Any, Generic, TypeVar

from tinker.lib.public_interfaces.api_future import APIFuture

from rlvr.distributed.remote import unwrap
from rlvr.errors import WorkerLostError

T = TypeVar("T")

MAX_ATTEMPTS = 4
"""Tries per request (the first included) when its actor dies; each retry waits for the restarted actor."""


class ActorFuture(APIFuture[T], Generic[T]):
    """A Tinker future over one actor call. ``unpack`` turns the reply into the result (``Replicas`` strips the
    actor's incarnation there). ``recover`` decides whether a call whose actor died is sent again;
    after :data:`MAX_ATTEMPTS` the call fails with WorkerLostError. ``recover=None`` is for the trainer, which is
    never restarted: its death is a WorkerLostError that says to resume from a checkpoint."""

    def __init__(self, ray: ModuleType, submit: Callable[[], Any], recover: Callable[[BaseException], bool] | None,
                 what: str, unpack: Callable[[Any], T] | None = None) -> None:
        self._ray, self._submit, self._recover, self._what, self._unpack = ray, submit, recover, what, unpack
        self._ref = submit()
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def result(self, timeout: float | None = None) -> T:
        ray = self._ray
        with self._lock:
            attempts = 1
            while not self._done:
                try:
                    reply = ray.get(self._ref, timeout=timeout)
                except ray.exceptions.GetTimeoutError:
                    raise TimeoutError(f"{self._what} gave no result within {timeout} s") from None
                except ray.exceptions.RayActorError as exc:
                    if self._recover is not None and attempts < MAX_ATTEMPTS and self._recover(exc):
                        attempts += 1
                        self._ref = self._submit()
                        continue
                    self._error = self._lost(exc, attempts)
                except ray.exceptions.RayTaskError as exc:
                    self._error = unwrap(exc)
                else:
                    try:
                        self._value = reply if self._unpack is None else self._unpack(reply)
                    except Exception as exc:  # e.g. a restarted replica that could not reload the adapter
                        self._error = exc
                self._done = True
        if self._error is not None:
            raise self._error
        return self._value

    def _lost(self, exc: BaseException, attempts: int) -> WorkerLostError:
        """The error of a call whose actor died for good (or, for the trainer, at all)."""
        reason = str(exc).splitlines()[0]
        if self._recover is None:
            error = WorkerLostError(f"{self._what} died: {reason}. It is not restarted, since its state (weights, "
                                    "optimizer) lived in its memory; resume from the last checkpoint (resume=True)")
        else:
            error = WorkerLostError(f"{self._what} died and the request could not be completed after {attempts} "
                                    f"attempt(s): {reason}. Its log on its node (/tmp/ray/session_latest/logs) "
                                    "says why, e.g. it was killed for memory")
        error.__cause__ = exc
        return error

    async def result_async(self, timeout: float | None = None) -> T:
        return await asyncio.to_thread(self.result, timeout)

    def future(self) -> ConcurrentFuture[T]:
        out: ConcurrentFuture[T] = ConcurrentFuture()

        def settle() -> None:
            try:
                out.set_result(self.result())
            except BaseException as exc:
                out.set_exception(exc)

        threading.Thread(target=settle, daemon=True, name="rlvr-ray-future").start()
        return out
