"""Batch scoring that never hangs or crashes the training loop: :func:`score_batch` and :class:`RewardRunner`.

What it is: each reward call runs in a worker process the trainer can kill, with a wall-clock timeout per call. A
call that raises, returns a non-number, kills its worker or runs past its timeout is *counted* (``failures``,
``reward/errors:sum``, ``reward/timeouts:sum``) and logged (logger ``rlvr.rewards``) with the offending response;
its score is ``None`` (NaN in :meth:`BatchScores.values`), never 0. The rest of the batch is scored as usual.

Why fork: workers are forked from the trainer (``multiprocessing``'s ``fork`` context), so they inherit the reward
as it is in memory -- closures, lambdas, functions from ``__main__`` or a notebook -- without pickling it; only
items (``meta`` must be picklable, else that item is an error) and scores cross a pipe. A timed-out worker is
SIGKILLed (not ``signal.alarm``: main thread only, and it cannot interrupt C code) and a fresh one forked on demand.
Workers stay warm across batches while a :class:`RewardRunner` lives, and die with it, with the thread that created
them (``PR_SET_PDEATHSIG``: create the runner in a long-lived thread) or when their pipe closes. So a reward must not
count on state one call leaves for the next, and should not use torch (forked after the trainer started threads).

Composite rewards (``combine``, ``format_correct``) are split into parts run as separate calls, so a part's failure
is reported under its name and per-part means reach the metrics (``reward/format/mean``). *Inline* rewards
(``code_tests``) bound their own time (the sandbox kills programs at their timeout) and are scored in this process
with one ``score_many`` call over the whole batch.

What it is not: the rewards themselves (``registry``, ``builtin``, ``math``, ``code``) or the training loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards.registry import (
    CompositeReward,
    Reward,
    RewardFn,
    RewardItem,
    as_item,
    check_value,
    resolve_reward,
)

logger = logging.getLogger("rlvr.rewards")

_LOGGED_RESPONSE_CHARS = 500
_LOGGED_FAILURES = 10  # per batch, then one summary line


@dataclass(frozen=True)
class RewardFailure:
    """One reward call that produced no score."""

    index: int
    """Position of the item in the batch."""

    reward: str
    """Name of the reward (the part, for a composite) that failed."""

    kind: str
    """``"error"`` (raised, returned a non-number, its worker died) or ``"timeout"`` (killed at the timeout)."""

    message: str
    """What happened: the exception and the end of its traceback, or the timeout."""

    response: str
    """The response being scored, in full."""


@dataclass
class BatchScores:
    """The scores of one batch, with every failure counted."""

    scores: list[float | None]
    """One per item, in order; ``None`` where a reward (or a part of it) failed."""

    failures: list[RewardFailure] = field(default_factory=list)
    """Every failed call, in item order."""

    parts: dict[str, list[float | None]] = field(default_factory=dict)
    """For a composite reward, each part's scores by part name (``format``, ``correct``...)."""

    duration_s: float = 0.0
    """Wall-clock seconds the batch took."""

    @property
    def errors(self) -> int:
        """Calls that raised, returned a non-number, or lost their worker."""
        return sum(f.kind == "error" for f in self.failures)

    @property
    def timeouts(self) -> int:
        """Calls killed at their timeout."""
        return sum(f.kind == "timeout" for f in self.failures)

    @property
    def failed(self) -> int:
        """Items without a score."""
        return sum(s is None for s in self.scores)

    @classmethod
    def concat(cls, batches: Sequence[BatchScores]) -> BatchScores:
        """One batch of these batches' items, in order (failures re-indexed; durations added)."""
        out, offset = cls([]), 0
        for batch in batches:
            out.failures += [dataclasses.replace(f, index=f.index + offset) for f in batch.failures]
            for name in set(out.parts) | set(batch.parts):
                out.parts[name] = (out.parts.get(name, [None] * offset)
                                   + batch.parts.get(name, [None] * len(batch.scores)))
            out.scores += batch.scores
            out.duration_s += batch.duration_s
            offset += len(batch.scores)
        return out

    def values(self, fill: float = math.nan) -> list[float]:
        """The scores with ``fill`` (NaN by default) where an item failed."""
        return [fill if s is None else s for s in self.scores]

    def metrics(self, prefix: str = "reward") -> dict[str, float]:
        """``{prefix}/mean`` (over scored items; NaN when none), ``{prefix}/scored:sum``, ``{prefix}/errors:sum``,
        ``{prefix}/timeouts:sum``, and ``{prefix}/<part>/mean`` per composite part."""
        out = {f"{prefix}/mean": _mean(self.scores), f"{prefix}/scored:sum": float(len(self.scores) - self.failed),
               f"{prefix}/errors:sum": float(self.errors), f"{prefix}/timeouts:sum": float(self.timeouts)}
        for name, scores in self.parts.items():
            out[f"{prefix}/{name}/mean"] = _mean(scores)
        return out


def _mean(scores: Sequence[float | None]) -> float:
    good = [s for s in scores if s is not None]
    return sum(good) / len(good) if good else math.nan


@dataclass(frozen=True)
class _Failed:
    kind: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> _Failed:
        """A raised :class:`TimeoutError` (math-verify's, say) is a timeout; anything else an error."""
        return cls("timeout" if isinstance(exc, TimeoutError) else "error", _describe(exc))


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines).strip()
    return f"{type(exc).__name__}: {exc}" + (f"\n{text[-1500:]}" if len(lines) > 1 else "")


# -- the worker side ------------------------------------------------------------------------------------------------
def _serve(conn: multiprocessing.connection.Connection, leaves: Sequence[Reward],
           inherited: Sequence[multiprocessing.connection.Connection], parent_pid: int) -> None:
    """Worker loop: receive ``(task, leaf, prompt, response, meta)``, send back ``(task, ok, value)``."""
    for other in inherited:  # other workers' and our own parent-side pipe ends: EOF must mean the parent is gone
        with contextlib.suppress(OSError):
            other.close()
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the closed pipe still ends an idle worker
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then closes us
    while True:
        try:
            task, leaf, prompt, response, meta = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        try:
            reply = (task, True, check_value(leaves[leaf](prompt, response, meta), leaves[leaf].name))
        except BaseException as exc:  # SystemExit, KeyboardInterrupt from a reward are its errors too
            failed = _Failed.of(exc)
            reply = (task, False, (failed.kind, failed.message))
        conn.send(reply)


class _Worker:
    def __init__(self, context: Any, leaves: Sequence[Reward], others: Sequence[_Worker]) -> None:
        parent_end, child_end = context.Pipe(duplex=True)
        inherited = [w.conn for w in others] + [parent_end]
        self.process = context.Process(target=_serve, args=(child_end, leaves, inherited, os.getpid()),
                                       name="rlvr-reward-worker", daemon=True)
        self.process.start()
        child_end.close()
        self.conn = parent_end
        self.task: int | None = None
        self.deadline = 0.0

    def kill(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()
        self.process.join()
        self.conn.close()
        self.process.close()


class RewardRunner:
    """Scores batches with one reward, each call in a killable forked worker; see the module docstring.

    Args:
        reward_fn: a reward name, :class:`Reward` or plain function ``(prompt, response, meta=None) -> float``.
        timeout: wall-clock seconds per call (per part, for a composite reward).
        num_workers: worker processes; default ``min(4, CPUs)``.
        isolate: False runs every call in this process, without timeouts (for debugging; failures are still
            counted).
    """

    def __init__(self, reward_fn: str | Reward | RewardFn, *, timeout: float = 10.0, num_workers: int | None = None,
                 isolate: bool = True) -> None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ConfigurationError(f"RewardRunner(timeout={timeout!r}): must be a positive number of seconds")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_workers = min(4, cpus) if num_workers is None else num_workers
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ConfigurationError(f"RewardRunner(num_workers={num_workers!r}): must be an int >= 1")
        self.reward = resolve_reward(reward_fn)
        self.timeout, self.num_workers, self.isolate = float(timeout), num_workers, isolate
        self.leaves: list[Reward] = []
        self._collect(self.reward)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._context: Any = None
        if isolate and any(not leaf.inline for leaf in self.leaves):
            try:
                self._context = multiprocessing.get_context("fork")
            except ValueError:
                raise ConfigurationError("RewardRunner needs fork-based worker processes, which this platform "
                                         "lacks; pass isolate=False to score in-process without timeouts") from None

    def _collect(self, reward: Reward) -> None:
        if isinstance(reward, CompositeReward):
            for part in reward.parts().values():
                self._collect(part)
        elif all(reward is not leaf for leaf in self.leaves):
            self.leaves.append(reward)

    # -- scoring -------------------------------------------------------------------------------------------------
    def score(self, items: Iterable[RewardItem | Mapping[str, Any] | Sequence[Any]]) -> BatchScores:
        """Score ``items`` (each a :class:`RewardItem`, a mapping or a ``(prompt, response[, meta])`` tuple)."""
        batch = [as_item(item) for item in items]
        started = time.monotonic()
        outcomes: dict[tuple[int, int], float | _Failed] = {}
        pooled: list[tuple[int, int]] = []
        with self._lock:
            for leaf_index, leaf in enumerate(self.leaves):
                if leaf.inline or not self.isolate:
                    outcomes.update(self._inline(leaf_index, leaf, batch))
                else:
                    pooled.extend((leaf_index, i) for i in range(len(batch)))
            if pooled:
                outcomes.update(self._pooled(pooled, batch))
        result = BatchScores(scores=[], duration_s=0.0)
        leaf_index = {id(leaf): n for n, leaf in enumerate(self.leaves)}
        for i, item in enumerate(batch):
            memo: dict[int, float | None] = {}
            result.scores.append(self._value(self.reward, i, item, outcomes, leaf_index, memo, result.failures))
            if isinstance(self.reward, CompositeReward):
                for label, part in self.reward.parts().items():
                    result.parts.setdefault(label, []).append(memo[id(part)])
        result.duration_s = time.monotonic() - started
        for failure in result.failures[:_LOGGED_FAILURES]:
            cut = len(failure.response) > _LOGGED_RESPONSE_CHARS
            shown = failure.response[:_LOGGED_RESPONSE_CHARS] + ("..." if cut else "")
            logger.warning("reward %r %s on item %d (not scored): %s; response (%d chars): %r", failure.reward,
                           "timed out" if failure.kind == "timeout" else "failed", failure.index,
                           failure.message.splitlines()[0][:300], len(failure.response), shown)
        if len(result.failures) > _LOGGED_FAILURES:
            logger.warning("... and %d more reward failures in this batch (%d errors, %d timeouts in all; see "
                           "BatchScores.failures)", len(result.failures) - _LOGGED_FAILURES, result.errors,
                           result.timeouts)
        return result

    def _value(self, reward: Reward, i: int, item: RewardItem, outcomes: Mapping[tuple[int, int], Any],
               leaf_index: Mapping[int, int], memo: dict[int, float | None], failures: list[RewardFailure]
               ) -> float | None:
        if id(reward) in memo:
            return memo[id(reward)]
        value: float | None
        if isinstance(reward, CompositeReward):
            parts = {label: self._value(part, i, item, outcomes, leaf_index, memo, failures)
                     for label, part in reward.parts().items()}
            value = None
            if all(v is not None for v in parts.values()):
                try:
                    value = check_value(reward.merge(parts), reward.name)
                except Exception as exc:
                    failures.append(RewardFailure(i, reward.name, "error", _describe(exc), item.response))
        else:
            outcome = outcomes[(leaf_index[id(reward)], i)]
            value = None if isinstance(outcome, _Failed) else outcome
            if isinstance(outcome, _Failed):
                failures.append(RewardFailure(i, reward.name, outcome.kind, outcome.message, item.response))
        memo[id(reward)] = value
        return value

    @staticmethod
    def _inline(leaf_index: int, leaf: Reward, batch: Sequence[RewardItem]
                ) -> dict[tuple[int, int], float | _Failed]:
        try:
            results = leaf.score_many(batch)
            if len(results) != len(batch):
                raise RuntimeError(f"{type(leaf).__name__}.score_many returned {len(results)} results for "
                                   f"{len(batch)} items")
        except Exception as exc:
            return {(leaf_index, i): _Failed.of(exc) for i in range(len(batch))}

        def outcome(result: Any) -> float | _Failed:
            try:
                return _Failed.of(result) if isinstance(result, BaseException) else check_value(result, leaf.name)
            except Exception as exc:
                return _Failed.of(exc)

        return {(leaf_index, i): outcome(result) for i, result in enumerate(results)}

    def _pooled(self, tasks: list[tuple[int, int]], batch: Sequence[RewardItem]
                ) -> dict[tuple[int, int], float | _Failed]:
        out: dict[tuple[int, int], float | _Failed] = {}
        queue = deque(range(len(tasks)))
        while queue or any(w.task is not None for w in self._workers):
            while queue and len(self._workers) < self.num_workers:
                self._workers.append(_Worker(self._context, self.leaves, self._workers))
            for worker in list(self._workers):
                if queue and worker.task is None:
                    self._dispatch(worker, queue, tasks, batch, out)
            busy = [w for w in self._workers if w.task is not None]
            if not busy:
                continue
            wait = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = set(multiprocessing.connection.wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                                                        timeout=wait))
            for worker in busy:
                if worker.conn in ready or worker.process.sentinel in ready:
                    self._collect_reply(worker, tasks, out)
            now = time.monotonic()
            for worker in [w for w in self._workers if w.task is not None and now >= w.deadline]:
                out[tasks[worker.task]] = _Failed("timeout", f"no result within the {self.timeout:g} s timeout; "
                                                  "the call was killed (SIGKILL)")
                self._replace(worker)
        return out

    def _dispatch(self, worker: _Worker, queue: deque[int], tasks: list[tuple[int, int]],
                  batch: Sequence[RewardItem], out: dict[tuple[int, int], float | _Failed]) -> None:
        task = queue.popleft()
        leaf, i = tasks[task]
        item = batch[i]
        try:
            worker.conn.send((task, leaf, item.prompt, item.response, item.meta))
        except (OSError, EOFError):  # the worker died while idle: replace it and try again once
            self._replace(worker)
            queue.appendleft(task)
        except Exception as exc:  # pickling meta failed before anything was written
            out[tasks[task]] = _Failed("error", f"the item could not be sent to a reward worker (meta must be "
                                                f"picklable): {type(exc).__name__}: {exc}")
        else:
            worker.task, worker.deadline = task, time.monotonic() + self.timeout

    def _collect_reply(self, worker: _Worker, tasks: list[tuple[int, int]],
                       out: dict[tuple[int, int], float | _Failed]) -> None:
        task = worker.task
        try:
            if worker.conn.poll():
                reply_task, ok, payload = worker.conn.recv()
                if reply_task == task:
                    out[tasks[task]] = payload if ok else _Failed(*payload)
                    worker.task = None
                    return
        except (OSError, EOFError):
            pass
        worker.process.join(timeout=1.0)
        code = worker.process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit status {code}"
        out[tasks[task]] = _Failed("error", f"the reward worker died while scoring ({how}); a reward must return, "
                                            "not exit or crash the interpreter")
        self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.task = None
        worker.kill()
        self._workers.remove(worker)

    # -- lifetime --------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the workers. Idempotent; the runner forks new ones if used again."""
        with self._lock:
            for worker in self._workers:
                worker.kill()
            self._workers.clear()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def score_batch(reward_fn: str | Reward | RewardFn, items: Iterable[RewardItem | Mapping[str, Any] | Sequence[Any]],
                *, timeout: float = 10.0, num_workers: int | None = None, isolate: bool = True) -> BatchScores:
    """Score ``items`` with ``reward_fn``, each call in a killable worker with ``timeout`` seconds; failures are
    counted, logged and scored ``None``. One-shot: a training loop keeps a :class:`RewardRunner` instead, whose
    workers stay warm between batches."""
    with RewardRunner(reward_fn, timeout=timeout, num_workers=num_workers, isolate=isolate) as runner:
        return runner.score(items)
