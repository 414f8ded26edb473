"""The local backend: :class:`Sandbox`, a pool of warm fork servers driven from the trainer process.

What it is: the parent side. ``Sandbox(...)`` starts ``num_workers`` fork servers at once -- create it before
loading a model, since starting processes from a process that holds gigabytes is slow -- each as
``<resolved python> -I -S server.py`` with an empty environment, optionally inside ``bwrap``. ``run_many``
(programs and their tests) and ``run_scripts`` (whole programs, :class:`ScriptJob`) hand jobs to idle servers and
wait for all of them in one ``poll`` loop over the servers' result pipes and their pidfds: no threads, no
sleeping. ``submit`` queues one job from any thread and returns a future; a feeding thread (``stream``) runs such
jobs as they come. A server that dies (or stops answering within the job's timeout plus a grace period) is
killed with its process group, reaped and restarted, and its job is reported as ``status="error"`` with the
reason. Missing protection layers are reported once per process with ``warnings.warn`` and ``logging.warning``.

What it is not: the per-job confinement (``server``, ``confine``, ``landlock``, ``seccomp``) or the test
counting (``harness``); and not thread-parallel: concurrent ``run_many`` calls on one Sandbox, and the
submitted jobs, take turns.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from rlvr.errors import ConfigurationError, SandboxError
from rlvr.sandbox import bwrap as _bwrap
from rlvr.sandbox.backend import SandboxBackend
from rlvr.sandbox.frames import Job, failed, frame, to_result
from rlvr.sandbox.result import JobLike, SandboxResult, ScriptJob, ScriptResult
from rlvr.sandbox.stream import JobStream
from rlvr.sandbox.worker import ForkServerProcess, shutdown

logger = logging.getLogger("rlvr.sandbox")

SERVER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")

#: Standard-library modules each fork server imports before forking, so jobs get them for free.
#: Not ``threading`` or ``random``: their after-fork hooks would cost every job, importing them costs only
#: the jobs that use them.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools",
    "heapq", "itertools", "json", "math", "operator", "re", "string", "traceback", "typing",
)

#: Layers whose absence weakens the sandbox, and what a job can then do.
_LAYER_CONSEQUENCES = {
    "landlock": "jobs can read and write every file their uid can and reach TCP on loopback",
    "seccomp": "jobs can fork, exec programs, open network sockets and signal processes of their uid",
    "privileges": "jobs run as root",
    "subreaper": "processes a job leaves behind are not swept",
    "pidfd": "timeouts fall back to 10 ms polling",
}
_ROOT_PREFIX = "rlvr-sandbox-"
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Warn loudly (``warnings`` and ``logging``) the first time ``key`` comes up in this process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _sweep_stale_roots() -> None:
    """Delete the folders of sandboxes whose process died without closing them (killed trainers)."""
    folder = tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name[len(_ROOT_PREFIX):].split("-", 1)[0]
        if not name.startswith(_ROOT_PREFIX) or not pid.isdigit():
            continue
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)  # its owner is gone
        except OSError:
            continue  # alive (or not ours to judge)


class Sandbox(SandboxBackend):
    """A pool of warm fork servers that run untrusted Python programs and their tests, confined.

    Args:
        num_workers: fork servers (jobs run in parallel); default: the number of usable CPUs.
        timeout: default wall-clock seconds per job (also its CPU-seconds limit, rounded up).
        memory_mb: address-space limit per job (``RLIMIT_AS``), in MiB.
        file_size_mb: largest file a job may write, its stdout and stderr included (``RLIMIT_FSIZE``).
        disk_mb: all a job may write to its folder (a size-capped tmpfs when root or in bwrap, else a
            watchdog that kills the job).
        max_open_files: ``RLIMIT_NOFILE`` per job.
        max_processes: process and thread budget (``RLIMIT_NPROC``), applied where it means something
            (jobs under a dropped uid, or an unprivileged uid without seccomp); it counts every task of
            that uid, so jobs running at once share it.
        use_bwrap: run each server inside bubblewrap; ``None`` (default) when it works here, ``True`` to
            require it (raises :class:`SandboxError` where it cannot work), ``False`` never.
        use_landlock, use_seccomp: turn a layer off (for debugging; the sandbox warns).
        drop_privileges: when running as root, run jobs as ``uid``/``gid`` (default nobody, 65534).
        extra_paths: folders jobs may read and import from (added to ``sys.path``), e.g. a pure-Python
            library; site-packages are otherwise not importable (servers run with ``-S``).
        preload: standard-library modules imported in each server before forking.
        python: the interpreter for the servers; default ``sys.executable`` with symlinks resolved.
        start_timeout: seconds to wait for the servers to start.
        output_tail_chars: how much of a job's stdout/stderr comes back in its result.
    """

    def __init__(self, num_workers: int | None = None, timeout: float = 5.0, memory_mb: int = 512, *,
                 file_size_mb: int = 16, disk_mb: int = 256, max_open_files: int = 64, max_processes: int = 64,
                 use_bwrap: bool | None = None, use_landlock: bool = True, use_seccomp: bool = True,
                 drop_privileges: bool = True, uid: int = 65534, gid: int = 65534,
                 extra_paths: Sequence[str] = (), preload: Sequence[str] = DEFAULT_PRELOAD,
                 python: str | None = None, start_timeout: float = 30.0, output_tail_chars: int = 4000) -> None:
        if num_workers is None:
            num_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        for name, value, low in (("num_workers", num_workers, 1), ("memory_mb", memory_mb, 16),
                                 ("file_size_mb", file_size_mb, 1), ("disk_mb", disk_mb, 1),
                                 ("max_open_files", max_open_files, 8),
                                 ("max_processes", max_processes, 1), ("output_tail_chars", output_tail_chars, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigurationError(f"Sandbox({name}={value!r}): must be an int >= {low}")
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigurationError(f"Sandbox(timeout={timeout!r}): must be a positive number of seconds")
        if not sys.platform.startswith("linux"):
            raise SandboxError(f"rlvr.sandbox runs jobs on Linux only (this is {sys.platform}); use a remote "
                               "SandboxBackend on other systems")
        python = os.path.realpath(python or sys.executable or "")
        if not os.path.isfile(python) or not os.access(python, os.X_OK):
            raise ConfigurationError(f"Sandbox(python={python!r}) is not an executable file; pass the path of "
                                     "a Python >= 3.10 interpreter")
        extra = tuple(os.path.realpath(p) for p in extra_paths)
        for path in extra:
            if not os.path.isdir(path):
                raise ConfigurationError(f"Sandbox(extra_paths=...): {path!r} is not a folder")
        self.timeout = float(timeout)
        self.num_workers = num_workers
        self.python = python
        self._lock = threading.Lock()
        self._stream_lock = threading.Lock()
        self._stream: JobStream | None = None
        self._closed = False
        self.restarts = 0
        self.layers: dict[str, dict[str, Any]] = {}

        self._bwrap_argv = self._decide_bwrap(use_bwrap, python, extra, disk_mb << 20, (2 * file_size_mb + 1) << 20)
        _sweep_stale_roots()
        self._root = tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-")
        os.chmod(self._root, 0o711)  # a dropped uid must reach its job folder, never list its neighbours
        limits = {"memory_bytes": memory_mb << 20, "file_bytes": file_size_mb << 20, "open_files": max_open_files}
        self._workers: list[ForkServerProcess] = []
        for index in range(num_workers):
            root = _bwrap.INNER_ROOT if self._bwrap_argv else os.path.join(self._root, f"w{index}")
            config = {"jobs_root": os.path.join(root, "jobs"), "out_dir": os.path.join(root, "out"),
                      "limits": limits, "max_processes": max_processes, "landlock": use_landlock,
                      "seccomp": use_seccomp, "drop_privileges": drop_privileges, "uid": uid, "gid": gid,
                      "extra_paths": list(extra), "preload": list(preload), "tail_chars": output_tail_chars,
                      "disk_bytes": disk_mb << 20, "wrapped": bool(self._bwrap_argv)}
            argv = [*self._bwrap_argv, python, "-I", "-S", SERVER_SCRIPT, json.dumps(config)]
            self._workers.append(ForkServerProcess(index, argv, os.path.join(self._root, f"server-{index}.log")))
        self._finalizer = weakref.finalize(self, shutdown, self._workers, self._root)
        try:
            self._start_all(start_timeout)
        except BaseException:
            self.close()
            raise
        self._report_layers()

    # -- start-up ----------------------------------------------------------------------------------------------
    def _decide_bwrap(self, use_bwrap: bool | None, python: str, extra: tuple[str, ...], jobs_bytes: int,
                      out_bytes: int) -> list[str]:
        if use_bwrap is False:
            self.layers["bwrap"] = {"active": False, "detail": "disabled by the caller (use_bwrap=False)"}
            return []
        path = _bwrap.find()
        read_only = tuple(_bwrap.interpreter_paths(extra))
        works, detail = _bwrap.probe(path, python, read_only)
        if works:
            self.layers["bwrap"] = {"active": True, "detail": f"{detail}: user/pid/net/ipc namespaces, read-only "
                                    "system binds, private /tmp, uid 65534"}
            return _bwrap.command(path, list(read_only), jobs_bytes, out_bytes)
        self.layers["bwrap"] = {"active": False, "detail": detail}
        if use_bwrap:
            raise SandboxError(f"Sandbox(use_bwrap=True) but {detail}. Install bubblewrap and allow user "
                               "namespaces, or pass use_bwrap=None to run without it")
        if path is None:
            logger.info("rlvr sandbox: %s", detail)
        else:
            warn_once("bwrap", f"rlvr sandbox: {detail}; running fork servers without it. "
                               "Run `rlvr sandbox doctor` for details.")
        return []

    def _start_all(self, start_timeout: float) -> None:
        for worker in self._workers:
            worker.start()
        deadline = time.monotonic() + start_timeout
        while any(w.state == "starting" for w in self._workers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxError(f"fork servers did not start within {start_timeout:g} s; "
                                   f"server log: {self._workers[0].log_tail() or '(empty)'}")
            self._pump(remaining, results=None, jobs=None, queue=None)
        if any(w.state != "up" for w in self._workers):
            raise SandboxError("a fork server could not start (see its log below). Check that "
                               f"{self.python} runs with -I -S and that {self._root} is writable. "
                               f"Server log: {self._workers[0].log_tail() or '(empty)'}")
        self.layers.update(self._workers[0].layers)

    def _report_layers(self) -> None:
        for name, consequence in _LAYER_CONSEQUENCES.items():
            layer = self.layers.get(name)
            if layer and not layer["active"]:
                warn_once(name, f"rlvr sandbox: {name} is not active ({layer['detail']}), so {consequence}. "
                                "Run `rlvr sandbox doctor` for details.")
        privileges = self.layers.get("privileges", {})
        if ("CAP_DAC_READ_SEARCH" in privileges.get("detail", "")
                and not self.layers.get("landlock", {}).get("active")):
            warn_once("read-search", "rlvr sandbox: jobs keep CAP_DAC_READ_SEARCH to read the interpreter and "
                                     "Landlock is off, so jobs can read every file on this machine. Install "
                                     "Python where uid 65534 can read it, or enable Landlock.")

    # -- running -----------------------------------------------------------------------------------------------
    #: Jobs sent ahead to a busy server (it reads the next one as soon as it reports), hiding the round trip.
    _PIPELINE_DEPTH = 2
    #: Larger jobs are only sent to an idle server, so a write never waits on a full pipe.
    _PIPELINE_MAX_BYTES = 32 * 1024

    def run_many(self, jobs: Iterable[JobLike]) -> list[SandboxResult]:
        """Run ``jobs`` on the pool in parallel; one result per job, in order. See :class:`SandboxBackend`."""
        return self._run_batch([self.as_job(job) for job in jobs])  # type: ignore[return-value]

    def run_scripts(self, jobs: Iterable[ScriptJob]) -> list[ScriptResult]:
        """Run whole programs (:class:`ScriptJob`) on the pool in parallel; one result per job, in order."""
        jobs = list(jobs)
        for i, job in enumerate(jobs):
            if not isinstance(job, ScriptJob):
                raise ConfigurationError(f"run_scripts: job {i} is a {type(job).__name__}, not a ScriptJob")
        return self._run_batch(jobs)  # type: ignore[return-value]

    def submit(self, job: JobLike | ScriptJob) -> Future:
        """Queue one job (a :class:`SandboxJob`, a mapping of its fields, or a :class:`ScriptJob`); a future of its
        result, at once. Jobs submitted from any thread run on the pool as they come, in order, each as soon as a
        server is free; none waits for another caller's batch (a ``run_many`` call takes turns with them). The first
        call starts a feeding thread that lives until :meth:`close`."""
        job = job if isinstance(job, ScriptJob) else self.as_job(job)
        with self._stream_lock:
            if self._closed:
                raise SandboxError("this Sandbox is closed; create a new one")
            if self._stream is None:
                self._stream = JobStream(self._lock, self._drive)
        return self._stream.put(job)

    def _run_batch(self, jobs: list[Job]) -> list[SandboxResult | ScriptResult]:
        with self._lock:
            if self._closed:
                raise SandboxError("this Sandbox is closed; create a new one")
            results: list[SandboxResult | ScriptResult | None] = [None] * len(jobs)
            self._drive(jobs, deque(range(len(jobs))), results)
            return [r if r is not None else failed(job, "internal error: no result")
                    for r, job in zip(results, jobs, strict=True)]

    def _drive(self, jobs: Any, queue: deque, results: Any, intake: Callable[[], None] | None = None,
               wake_fd: int | None = None) -> None:
        """Run the queued jobs until none is queued or running; the caller holds ``self._lock``.

        ``jobs`` and ``results`` map a job's key (its index in ``queue``) to the job and take its result. A stream
        passes ``intake``, called every turn to queue the jobs that arrived, and ``wake_fd``, readable when one did;
        its jobs are not sent ahead to busy servers, so none waits behind a slow one while another server is free.
        """
        pipeline = self._PIPELINE_DEPTH if intake is None else 1
        while True:
            if intake is not None:
                intake()
            if not queue and not any(w.inflight for w in self._workers):
                return
            for depth in range(1, pipeline + 1):
                for worker in self._workers:
                    if queue and worker.state == "up" and len(worker.inflight) < depth:
                        self._dispatch(worker, queue, jobs, results)
            if not any(w.state in ("up", "starting") for w in self._workers):
                raise SandboxError("no fork server could be (re)started; server log: "
                                   + (self._workers[0].log_tail() or "(empty)"))
            busy = [w.deadline for w in self._workers if w.inflight]
            wait = max(0.0, min(busy) - time.monotonic()) if busy else 30.0
            self._pump(wait, results, jobs, queue, wake_fd)

    def _deadline(self, job: Job) -> float:
        timeout = job.timeout or self.timeout
        return time.monotonic() + timeout + 2.0 + 0.25 * timeout

    def _dispatch(self, worker: ForkServerProcess, queue: deque, jobs: Any, results: Any) -> None:
        index = queue[0]
        job = jobs[index]
        message, frame_size = frame(job, index, self.timeout)
        if worker.inflight and frame_size > self._PIPELINE_MAX_BYTES // 4:  # up to 4 bytes per character
            return
        queue.popleft()
        try:
            worker.send(message)
        except (OSError, ValueError) as exc:
            results[index] = failed(job, f"could not send the job to the fork server ({exc}); it was restarted")
            self._died(worker, results, jobs, queue, f"could not send a job to fork server {worker.index}: {exc}")
            return
        if not worker.inflight:
            worker.deadline = self._deadline(job)
        worker.inflight.append(index)

    def _pump(self, wait: float, results: Any, jobs: Any, queue: deque | None, wake_fd: int | None = None) -> None:
        """Wait up to ``wait`` seconds for server output or death (or ``wake_fd``), and handle what arrived."""
        poller = select.poll()
        by_fd: dict[int, tuple[ForkServerProcess, str]] = {}
        if wake_fd is not None:
            poller.register(wake_fd, select.POLLIN)
        for worker in self._workers:
            if worker.state in ("starting", "up"):
                by_fd[worker.out_fd] = (worker, "out")
                poller.register(worker.out_fd, select.POLLIN)
                if worker.pidfd >= 0:
                    by_fd[worker.pidfd] = (worker, "pidfd")
                    poller.register(worker.pidfd, select.POLLIN)
        for fd, _event in poller.poll(max(0, int(wait * 1000 + 0.999))):
            if fd == wake_fd:
                continue  # the caller's intake reads what woke it
            worker, kind = by_fd[fd]
            if worker.state == "down":
                continue
            if kind == "out":
                self._read(worker, results, jobs, queue)
            elif worker.proc is not None and worker.proc.poll() is not None:
                self._read(worker, results, jobs, queue)  # a result written just before death still counts
                if worker.state != "down":
                    self._died(worker, results, jobs, queue,
                               f"fork server {worker.index} died ({worker.exit_status()})")
        now = time.monotonic()
        for worker in self._workers:
            if worker.inflight and now > worker.deadline:
                self._died(worker, results, jobs, queue, f"fork server {worker.index} did not answer within the "
                           "job's timeout plus grace; it was killed")

    def _read(self, worker: ForkServerProcess, results: Any, jobs: Any, queue: deque | None) -> None:
        try:
            data = os.read(worker.out_fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            data, why = b"", f"broke its output pipe ({exc})"
        else:
            why = "died"
        if not data:
            try:
                worker.proc.wait(timeout=1.0)  # end of output means exit: wait for the status to say how
            except subprocess.TimeoutExpired:
                why = "closed its output"
            self._died(worker, results, jobs, queue, f"fork server {worker.index} {why} ({worker.exit_status()})")
            return
        try:
            messages = worker.reader.feed(data)
        except ValueError as exc:
            self._died(worker, results, jobs, queue, f"fork server {worker.index} sent a corrupt frame: {exc}")
            return
        for message in messages:
            op = message.get("op")
            if op == "ready" and worker.state == "starting":
                worker.layers = message.get("layers", {})
                worker.state, worker.failed_starts = "up", 0
            elif op == "result" and worker.inflight and message.get("id") == worker.inflight[0]:
                index = worker.inflight.popleft()
                results[index] = to_result(message, jobs[index])
                if worker.inflight and jobs is not None:
                    worker.deadline = self._deadline(jobs[worker.inflight[0]])

    def _died(self, worker: ForkServerProcess, results: Any, jobs: Any, queue: deque | None, why: str) -> None:
        """Restart ``worker``; its running job gets an ``error`` result, the jobs queued behind it go back."""
        inflight = list(worker.inflight)
        worker.inflight.clear()
        if worker.state == "starting":
            worker.failed_starts += 1
        self._restart(worker, why)
        if inflight and results is not None and jobs is not None:
            running, waiting = inflight[0], inflight[1:]
            tail = worker.log_tail(600)
            results[running] = failed(jobs[running], f"{why}; the job did not finish and the server was restarted"
                                       + (f". Server log: {tail}" if tail else ""))
            if queue is not None:
                queue.extendleft(reversed(waiting))

    def _restart(self, worker: ForkServerProcess, why: str) -> None:
        logger.warning("rlvr sandbox: %s; restarting it", why)
        worker.stop(graceful=False)
        if self._closed:
            return
        if worker.failed_starts >= 3:
            logger.error("rlvr sandbox: fork server %d failed to start 3 times; giving up on it: %s",
                         worker.index, worker.log_tail())
            return
        self.restarts += 1
        worker.start()

    # -- introspection and shutdown ----------------------------------------------------------------------------
    def server_pids(self) -> list[int]:
        """Process ids of the running fork servers (of their ``bwrap`` parents when wrapped)."""
        return [w.proc.pid for w in self._workers if w.proc is not None]

    def close(self) -> None:
        """Stop every fork server and delete the sandbox's folder; submitted jobs not yet done fail. Idempotent."""
        with self._stream_lock:
            if self._closed:
                return
            self._closed = True
            stream = self._stream
        if stream is not None:
            stream.close()
        with self._lock:
            for worker in self._workers:
                worker.stop()
            self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

