"""The optional bubblewrap layer, checked on its own (Landlock and seccomp off), where ``bwrap`` works."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlvr.errors import SandboxError
from rlvr.sandbox import Sandbox
from rlvr.sandbox import bwrap as bwrap_module

if TYPE_CHECKING:
    from conftest import HostUnixSockets


def _bwrap_works() -> tuple[bool, str]:
    return bwrap_module.probe(bwrap_module.find(), os.path.realpath(sys.executable),
                              tuple(bwrap_module.interpreter_paths()))


@pytest.fixture(scope="module")
def wrapped() -> Iterator[Sandbox]:
    works, why = _bwrap_works()
    if not works:
        pytest.skip(f"bwrap is not usable here: {why}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Landlock and seccomp are off on purpose: only bwrap is tested
        pool = Sandbox(num_workers=1, timeout=2.0, use_bwrap=True, use_landlock=False, use_seccomp=False)
    with pool:
        yield pool


def test_wrapped_server_runs_jobs(wrapped: Sandbox) -> None:
    assert wrapped.layers["bwrap"]["active"]
    assert wrapped.run("def f():\n    return 2\n", ["assert f() == 2"]).passed


def test_read_only_paths_under_tmp_stay_visible() -> None:
    # rlvr checked out or installed under /tmp: its code must be bound over the private /tmp, not hidden by it.
    works, why = _bwrap_works()
    if not works:
        pytest.skip(f"bwrap is not usable here: {why}")
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        script = Path(folder).resolve() / "server.py"
        script.write_text("print('reached')\n")
        argv = bwrap_module.command(bwrap_module.find(), [*bwrap_module.interpreter_paths(), str(script.parent)])
        done = subprocess.run([*argv, os.path.realpath(sys.executable), "-I", "-S", str(script)],
                              capture_output=True, text=True, timeout=30, env={})
    assert done.returncode == 0 and done.stdout == "reached\n", done.stderr


def test_wrapped_job_has_no_network(wrapped: Sandbox) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        result = wrapped.run("import socket", [f"socket.create_connection(('127.0.0.1', {port}), timeout=0.5)"])
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            listener.accept()
    assert not result.passed


def test_wrapped_job_cannot_reach_host_unix_sockets(wrapped: Sandbox, host_unix_sockets: HostUnixSockets) -> None:
    """Seccomp off: the private /tmp hides the socket files and the network namespace the abstract socket."""
    code = "import socket\n"
    tests = [f"socket.socket(socket.AF_UNIX).connect({host_unix_sockets.stream_path!r})",
             f"socket.socket(socket.AF_UNIX).connect({host_unix_sockets.abstract_name!r})",
             f"socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'x', {host_unix_sockets.datagram_path!r})"]
    result = wrapped.run(code, tests)
    assert host_unix_sockets.arrivals() == []
    assert result.num_passed == 0, result.stderr_tail


def test_wrapped_job_sees_neither_the_hosts_tmp_nor_its_home(wrapped: Sandbox) -> None:
    markers = [os.path.join(folder, f"rlvr-bwrap-marker-{secrets.token_hex(4)}")
               for folder in ("/tmp", os.path.expanduser("~"))]
    for marker in markers:
        open(marker, "w").close()
    try:
        result = wrapped.run("import os", [f"assert os.path.exists({marker!r})" for marker in markers])
        assert result.num_passed == 0, result.stderr_tail
    finally:
        for marker in markers:
            os.unlink(marker)


def test_wrapped_job_sees_only_sandbox_processes(wrapped: Sandbox) -> None:
    result = wrapped.run("import os\nPIDS = [p for p in os.listdir('/proc') if p.isdigit()]",
                         [f"assert str({os.getpid()}) in PIDS", "assert len(PIDS) > 10"])
    assert result.num_passed == 0, result.stderr_tail


def test_wrapped_job_runs_as_uid_65534_without_root_anywhere(wrapped: Sandbox) -> None:
    result = wrapped.run("import os", ["assert os.getuid() == 65534", "os.setuid(0)"])
    assert result.num_passed == 1


def test_requiring_bwrap_where_it_cannot_work_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bwrap_module, "find", lambda: None)
    with pytest.raises(SandboxError, match="bwrap"):
        Sandbox(num_workers=1, use_bwrap=True)
