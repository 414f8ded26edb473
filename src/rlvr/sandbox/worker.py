"""One fork server process as the trainer sees it: start, send, stop, and what state it is in.

What it is: :class:`ForkServerProcess`, a small wrapper around the ``subprocess.Popen`` of one fork server
(its pipes, its pidfd, its frame decoder, the jobs sent to it) used by ``executor``'s pool.
What it is not: the pool's scheduling, restarts or results (``executor``), or the server itself (``server``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import deque
from typing import Any

from rlvr.sandbox import protocol


class ForkServerProcess:
    """One fork server process, its pipes and pidfd, and the jobs sent to it (the first one is running)."""

    def __init__(self, index: int, argv: list[str], log_path: str) -> None:
        self.index, self.argv, self.log_path = index, argv, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd = -1
        self.reader = protocol.FrameReader()
        self.state = "down"  # down -> starting -> up
        self.inflight: deque[int] = deque()  # job indices sent, in order; the first one is running
        self.deadline = 0.0  # for the running job
        self.layers: dict[str, dict[str, Any]] = {}
        self.failed_starts = 0

    def start(self) -> None:
        """Launch the server (stderr to its log file, empty environment, own session); it is then "starting"."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env={}, close_fds=True, start_new_session=True, cwd="/")
        os.set_blocking(self.proc.stdout.fileno(), False)
        try:
            self.pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self.pidfd = -1
        self.reader = protocol.FrameReader()
        self.state = "starting"

    @property
    def out_fd(self) -> int:
        """The non-blocking read end of the server's stdout, where its frames arrive."""
        return self.proc.stdout.fileno()

    def send(self, message: dict[str, Any]) -> None:
        """Write one frame to the server's stdin (raises ``OSError`` if the server is gone)."""
        protocol.write_frame(self.proc.stdin.fileno(), message)

    def exit_status(self) -> str:
        """How the server ended, in words, or "still running"."""
        code = self.proc.poll() if self.proc else None
        if code is None:
            return "still running"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"

    def log_tail(self, limit: int = 1500) -> str:
        """The end of the server's stderr log, for error messages."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(max(0, handle.seek(0, os.SEEK_END) - limit))
                return handle.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def stop(self, graceful: bool = True) -> None:
        """End the server: close its stdin (it exits), then SIGKILL its process group if it lingers."""
        proc, self.proc = self.proc, None
        self.state = "down"
        self.inflight.clear()
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=1.0 if graceful else 0.0)
        except subprocess.TimeoutExpired:
            pass
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        proc.stdout.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def shutdown(workers: list[ForkServerProcess], root: str) -> None:
    """Kill every server and delete the pool's folder (also run by the pool's finalizer at exit)."""
    for worker in workers:
        worker.stop(graceful=False)
    shutil.rmtree(root, ignore_errors=True)
