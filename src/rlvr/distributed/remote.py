"""The exception a Ray actor raised, out of the wrapper Ray delivers it in.

Torch-free and Ray-free (it reads the wrapper's type name and ``cause``), so the reward actors, the cluster and the
futures share it. Not here: what to do when an actor dies (``cluster.Replicas``) or how a call is retried
(``futures.ActorFuture``).
"""

from __future__ import annotations


def unwrap(exc: BaseException) -> BaseException:
    """The exception an actor raised, out of Ray's RayTaskError wrapper (which keeps the remote traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and type(exc).__name__.startswith("RayTaskError"):
        cause.__cause__ = exc
        return cause
    return exc
