r"""Ray plumbing shared by the distributed backend: importing and starting Ray, and restartable actors.

What it is: :func:`import_ray` (a missing Ray is a :class:`~rlvr.errors.ConfigurationError` that says what to
install), :func:`connect`, :func:`actor_env`, :func:`unwrap` (errors raised inside an actor reach the caller as the
original exception, ``SamplingError``, ``InvalidDatumError``..., not wrapped in Ray's types) and :class:`Replicas`
(a set of restartable actors: it waits for a dead one to come back, counts restarts and retries, and runs a hook on
each restart; its calls are :class:`~rlvr.distributed.futures.ActorFuture`\ s, re-sent when their actor dies).

What it is not: the actors (``actors``, ``rewards``) or the Tinker-shaped clients (``clients``). Nothing here
imports Ray, torch or tinker at module level: ``import rlvr`` works without Ray, and reward actors, which import
this module, start without torch.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rlvr.distributed.remote import unwrap
from rlvr.errors import ConfigurationError, WorkerLostError

if TYPE_CHECKING:
    from rlvr.distributed.futures import ActorFuture

MAX_RESTARTS = 4
"""How often Ray restarts a dead sampler or reward actor before giving it up."""
RESTART_TIMEOUT_S = 180.0
"""Longest wait for a restarted actor to answer again (it re-imports torch and reloads the base model)."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or a ConfigurationError naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigurationError("distributed.backend='ray' needs Ray, which is not installed: "
                                 "pip install 'rlvr[ray]' (or use distributed.backend='local')") from exc
    return ray


def connect(address: str | None) -> ModuleType:
    """Ray, initialised: the running instance if this process already called ``ray.init``, else the cluster at
    ``address`` (``auto``, ``ray://host:10001``), else a new local instance (``address=None``)."""
    ray = import_ray()
    if not ray.is_initialized():
        if address is None:
            ray.init(address="local", include_dashboard=False)
        else:
            ray.init(address=address)
    return ray


def actor_env() -> dict[str, Any]:
    """The ``runtime_env`` the model-holding actors get: RLVR_HOME when this process sets it, so checkpoints and
    the model cache resolve to the same folders as here (on one machine; on a cluster set it on every node)."""
    home = os.environ.get("RLVR_HOME")
    return {"env_vars": {"RLVR_HOME": home}} if home else {}


@dataclass(frozen=True)
class Incarnation:
    """Which process an actor is running in; it changes when Ray restarts the actor."""

    token: str
    """Random per actor process."""
    pid: int
    """Its process id (for logs and tests)."""


class RestartableActor:
    """Base of the actors Ray restarts (samplers, reward workers): each process draws an incarnation, and every
    reply carries it (``invoke``), so the driver counts a restart even when no request was in flight at the death.
    Subclasses call ``super().__init__()``."""

    def __init__(self) -> None:
        self._incarnation = {"token": uuid.uuid4().hex, "pid": os.getpid()}

    def ready(self) -> dict[str, Any]:
        """This process's incarnation (answered once the actor has started)."""
        return self._incarnation

    def invoke(self, method: str, *args: Any) -> tuple[dict[str, Any], Any]:
        """``(incarnation, self.<method>(*args))``."""
        return self._incarnation, getattr(self, method)(*args)


class Replicas:
    """Restartable actors of one kind (samplers, reward workers): restarts detected, counted, and followed by
    ``on_restart(index)`` (a sampler reloads the current adapter there)."""

    def __init__(self, kind: str, handles: list[Any], on_restart: Callable[[int], None] | None = None) -> None:
        self.ray = import_ray()
        self.kind = kind
        self.handles = handles
        self.on_restart = on_restart
        self.incarnations: list[Incarnation] = [Incarnation(**info) for info in
                                                self.get_all([h.ready.remote() for h in handles])]
        self._seen = [{i.token} for i in self.incarnations]
        self.restarts = 0
        """Actor restarts seen (a death, and Ray starting the actor again)."""
        self.retries = 0
        """Requests re-sent because their actor died."""
        self._locks = [threading.Lock() for _ in handles]
        self._next = 0
        self._next_lock = threading.Lock()

    def get_all(self, refs: list[Any]) -> list[Any]:
        """Results of calls made as the actors start: an actor that raised gives its own error, one that died a
        WorkerLostError."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as exc:
            raise unwrap(exc) from None
        except self.ray.exceptions.RayActorError as exc:
            raise WorkerLostError(f"a {self.kind} actor died while starting: {str(exc).splitlines()[0]}") from exc

    def pick(self) -> int:
        """The next replica, round-robin."""
        with self._next_lock:
            index = self._next % len(self.handles)
            self._next += 1
        return index

    def observe(self, index: int, info: dict[str, Any]) -> None:
        """Note the incarnation a reply came from; one never seen before is a restart (counted, hook run)."""
        with self._locks[index]:
            self._observe(index, Incarnation(**info))

    def _observe(self, index: int, incarnation: Incarnation) -> None:
        if incarnation.token in self._seen[index]:  # replies of earlier incarnations may be read late: no restart
            return
        self._seen[index].add(incarnation.token)
        self.restarts += 1
        self.incarnations[index] = incarnation
        if self.on_restart is not None:
            self.on_restart(index)

    def recover(self, index: int, error: BaseException) -> bool:
        """After ``error`` (the actor died) on replica ``index``: wait until Ray has restarted it; True to retry
        (counted in ``retries``), False when it did not come back within :data:`RESTART_TIMEOUT_S` or is gone."""
        ray = self.ray
        with self._locks[index]:
            deadline = time.monotonic() + RESTART_TIMEOUT_S
            while True:
                try:
                    info = ray.get(self.handles[index].ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
                    break
                except ray.exceptions.ActorUnavailableError:  # restarting: ask again shortly
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.2)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):  # restarts used up, or stuck
                    return False
            self._observe(index, Incarnation(**info))
            self.retries += 1
            return True

    def future(self, index: int, method: str, *args: Any) -> ActorFuture:
        """Call ``method`` on replica ``index``; re-sent to the restarted actor if this one dies."""
        from rlvr.distributed.futures import ActorFuture  # tinker imports torch: not in torch-free reward actors

        def submit() -> Any:
            return self.handles[index].invoke.remote(method, *args)

        def unpack(reply: tuple[dict[str, Any], Any]) -> Any:
            self.observe(index, reply[0])
            return reply[1]

        return ActorFuture(self.ray, submit, lambda error: self.recover(index, error),
                           f"{self.kind} actor {index} ({method})", unpack=unpack)
