"""Shared fixtures for the sandbox tests: one warm pool for the session, a check that it survived, host sockets."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from rlvr.sandbox import Sandbox


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """Two fork servers without bwrap (so the root privilege drop, Landlock and seccomp are what is tested)."""
    with Sandbox(num_workers=2, timeout=2.0, memory_mb=256, disk_mb=64, use_bwrap=False) as pool:
        yield pool


@pytest.fixture
def survives(sandbox: Sandbox) -> Callable[[], None]:
    """Call at the end of a hostile test: the same fork servers are alive, nothing restarted, jobs still run."""
    pids, restarts = sandbox.server_pids(), sandbox.restarts

    def check() -> None:
        assert sandbox.server_pids() == pids, "a fork server was replaced"
        assert sandbox.restarts == restarts, "a fork server had to be restarted"
        for pid in pids:
            assert os.path.exists(f"/proc/{pid}"), f"fork server {pid} is gone"
        results = sandbox.run_many([{"code": "def ok():\n    return 1", "tests": ["assert ok() == 1"]}] * 2)
        assert all(r.passed for r in results), [r.stderr_tail for r in results]

    return check


@dataclass
class HostUnixSockets:
    """Unix sockets of the host that anyone may use, as a D-Bus bus, an X server or an agent would offer them."""

    stream_path: str  #: a listening SOCK_STREAM socket file, mode 0o777, in a 0o777 folder of the temp folder
    datagram_path: str  #: a bound SOCK_DGRAM socket file beside it, mode 0o777
    abstract_name: str  #: a listening SOCK_STREAM socket in the abstract namespace, as Python spells it ("\\0...")
    _sockets: list[socket.socket] = field(default_factory=list)

    def arrivals(self) -> list[str]:
        """What reached the host so far: one entry per accepted connection or received datagram."""
        seen = []
        for sock in self._sockets:
            while True:
                try:
                    if sock.type == socket.SOCK_STREAM:
                        sock.accept()[0].close()
                        seen.append(f"connection to {sock.getsockname()!r}")
                    else:
                        seen.append(f"datagram {sock.recv(64)!r} to {sock.getsockname()!r}")
                except BlockingIOError:
                    break
        return seen


@pytest.fixture
def host_unix_sockets() -> Iterator[HostUnixSockets]:
    """Fresh host sockets for one test, closed and removed after it."""
    folder = tempfile.mkdtemp(prefix="rlvr-host-sockets-")
    os.chmod(folder, 0o777)
    host = HostUnixSockets(os.path.join(folder, "stream.sock"), os.path.join(folder, "datagram.sock"),
                           f"\0rlvr-host-{secrets.token_hex(6)}")
    try:
        for kind, address in ((socket.SOCK_STREAM, host.stream_path), (socket.SOCK_DGRAM, host.datagram_path),
                              (socket.SOCK_STREAM, host.abstract_name)):
            sock = socket.socket(socket.AF_UNIX, kind)
            host._sockets.append(sock)
            sock.bind(address)
            if not address.startswith("\0"):
                os.chmod(address, 0o777)
            if kind == socket.SOCK_STREAM:
                sock.listen(8)
            sock.setblocking(False)
        yield host
    finally:
        for sock in host._sockets:
            sock.close()
        shutil.rmtree(folder, ignore_errors=True)
