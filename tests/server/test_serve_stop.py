"""``rlvr serve`` stops cleanly: SIGTERM or Ctrl-C end it (no new connections, the requests in flight answered) with
128 + the signal, nothing left listening."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # rlvr serve in fresh processes

SRC = Path(__file__).resolve().parents[2] / "src"
API_KEY = "tml-test-key-0123456789"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(port: int) -> subprocess.Popen:
    env = {**os.environ, "RLVR_API_KEY": API_KEY, "PYTHONPATH": os.pathsep.join([str(SRC),
                                                                                  os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until_serving(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "rlvr serve did not start"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_server_and_nothing_is_left_listening(sig, code):
    port = _free_port()
    process = serve(port)
    wait_until_serving(process, port)
    process.send_signal(sig)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == code, output  # 128 + the signal
    assert "Shutting down" in output and "Traceback" not in output and "Aborted" not in output, output
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
