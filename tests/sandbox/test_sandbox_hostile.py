"""Hostile programs: each one is contained, the fork servers stay alive, and the next job runs.

Every test asserts an observable effect that would appear if the protection were missing (a file that
exists, a connection that arrives, a process that survives, a job that passes).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from rlvr.sandbox import Sandbox

if TYPE_CHECKING:
    from conftest import HostUnixSockets

Check = Callable[[], None]


def test_infinite_loop_times_out(sandbox: Sandbox, survives: Check) -> None:
    result = sandbox.run("def f():\n    while True:\n        pass\n", ["f()"], timeout=1.0)
    assert (result.status, result.passed) == ("timeout", False)
    assert 0.9 < result.duration_s < 1.6
    assert "timeout" in result.stderr_tail
    survives()


def test_sleep_past_the_timeout_is_killed(sandbox: Sandbox, survives: Check) -> None:
    started = time.monotonic()
    result = sandbox.run("import time\ntime.sleep(60)", ["assert True"], timeout=1.0)
    assert result.status == "timeout"
    assert time.monotonic() - started < 3.0
    survives()


def test_ten_gigabyte_allocation_hits_the_memory_limit(sandbox: Sandbox, survives: Check) -> None:
    result = sandbox.run("block = bytearray(10 * 1024 ** 3)", ["assert len(block) > 0"])
    assert (result.status, result.passed) == ("memory", False)
    assert "MemoryError" in result.stderr_tail
    survives()


def test_gradual_allocation_hits_the_memory_limit(sandbox: Sandbox, survives: Check) -> None:
    code = "def grow():\n    chunks = []\n    while True:\n        chunks.append(bytearray(8 << 20))\n"
    result = sandbox.run(code, ["grow()", "assert True"])
    assert result.status == "memory" and result.num_passed == 1  # the second test still ran
    survives()


def test_fork_bomb_cannot_fork(sandbox: Sandbox, survives: Check) -> None:
    code = (
        "import os\n"
        "forks = 0\n"
        "try:\n"
        "    while True:\n"
        "        os.fork()\n"
        "        forks += 1\n"
        "except OSError:\n"
        "    pass\n"
    )
    result = sandbox.run(code, ["assert forks > 0"], timeout=1.5)
    assert result.status == "failed" and result.num_passed == 0, result.stderr_tail
    survives()


def test_fork_through_raw_syscalls_is_denied(sandbox: Sandbox, survives: Check) -> None:
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "clone_result = libc.syscall(56, 17, 0, 0, 0, 0)  # clone(SIGCHLD): a fork\n"
        "if clone_result == 0:\n"
        "    libc._exit(0)\n"
        "fork_result = libc.syscall(57)\n"
        "if fork_result == 0:\n"
        "    libc._exit(0)\n"
    )
    result = sandbox.run(code, ["assert clone_result > 0", "assert fork_result > 0"])
    assert result.num_passed == 0, result.stderr_tail
    survives()


def test_exec_and_subprocess_are_denied(sandbox: Sandbox, survives: Check) -> None:
    code = "import subprocess\ndef shell():\n    return subprocess.run(['/bin/true']).returncode\n"
    result = sandbox.run(code, ["assert shell() == 0", "import os\nos.execv('/bin/true', ['true'])"])
    assert result.num_passed == 0
    survives()


@pytest.mark.parametrize("target", ["/etc", "home"])
def test_writes_outside_the_job_folder_fail(sandbox: Sandbox, survives: Check, target: str) -> None:
    folder = os.path.expanduser("~") if target == "home" else "/etc"
    path = os.path.join(folder, f"rlvr-sandbox-pwned-{secrets.token_hex(4)}")
    try:
        result = sandbox.run(f"open({path!r}, 'w').write('pwned')", ["assert True"])
        assert not os.path.exists(path), f"the job wrote {path}"
        assert not result.passed and "PermissionError" in result.stderr_tail
    finally:
        if os.path.exists(path):
            os.unlink(path)
    survives()


def test_writes_to_shared_temporary_folders_fail(sandbox: Sandbox, survives: Check) -> None:
    name = f"rlvr-sandbox-pwned-{secrets.token_hex(4)}"
    code = "def attempt(folder):\n    open(folder + '/' + NAME, 'w').write('x')\n    return True\n"
    result = sandbox.run(code, ["assert attempt('/tmp')", "assert attempt('/dev/shm')", "assert attempt('/var/tmp')"],
                         setup_code=f"NAME = {name!r}")
    assert result.num_passed == 0
    assert not any(os.path.exists(os.path.join(d, name)) for d in ("/tmp", "/dev/shm", "/var/tmp"))
    survives()


def test_tcp_to_loopback_is_blocked(sandbox: Sandbox, survives: Check) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"def connect():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
            "    return True\n"
        )
        result = sandbox.run(code, ["assert connect()"])
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            listener.accept()
    assert not result.passed
    survives()


def test_dns_lookups_and_udp_are_blocked(sandbox: Sandbox, survives: Check) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as fake_dns:
        fake_dns.bind(("127.0.0.1", 0))
        port = fake_dns.getsockname()[1]
        code = (
            "import socket\n"
            "def udp():\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"    s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00', ('127.0.0.1', {port}))\n"
            "    return True\n"
            "def lookup():\n"
            "    return len(socket.getaddrinfo('example.com', 80)) > 0\n"
        )
        result = sandbox.run(code, ["assert udp()", "assert lookup()"])
        fake_dns.settimeout(0.3)
        with pytest.raises(socket.timeout):
            fake_dns.recvfrom(512)
    assert result.num_passed == 0
    survives()


def test_unix_stream_sockets_of_the_host_are_unreachable(sandbox: Sandbox, host_unix_sockets: HostUnixSockets,
                                                         survives: Check) -> None:
    """A world-writable socket file in the temp folder (an X server, a D-Bus bus, an agent) and an abstract one."""
    code = (
        "import socket\n"
        "def connect(address):\n"
        "    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    client.connect(address)\n"
        "    client.sendall(b'hi')\n"
        "    return True\n"
    )
    tests = [f"assert connect({host_unix_sockets.stream_path!r})",
             f"assert connect({host_unix_sockets.abstract_name!r})"]
    result = sandbox.run(code, tests)
    assert host_unix_sockets.arrivals() == []
    assert result.num_passed == 0, result.stderr_tail
    survives()


def test_unix_datagram_sockets_of_the_host_are_unreachable(sandbox: Sandbox, host_unix_sockets: HostUnixSockets,
                                                           survives: Check) -> None:
    """Datagrams need no listener: a fresh socket or a socketpair's end can address any socket file it can name."""
    path = host_unix_sockets.datagram_path
    code = "import socket\n"
    tests = [
        f"socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'socket', {path!r})",
        f"a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.sendto(b'pair-sendto', {path!r})",
        f"a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.connect({path!r})\na.send(b'pair-connect')",
        f"a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW)\na.sendto(b'raw-pair', {path!r})",  # a datagram
    ]
    result = sandbox.run(code, tests)
    assert host_unix_sockets.arrivals() == []
    assert result.num_passed == 0, result.stderr_tail
    survives()


def test_a_job_may_use_stream_socketpairs(sandbox: Sandbox) -> None:
    """A socketpair has no address, so it reaches nothing outside the job; asyncio needs one for its event loop."""
    code = (
        "import asyncio, socket\n"
        "def echo(kind):\n"
        "    a, b = socket.socketpair(socket.AF_UNIX, kind)\n"
        "    a.sendall(b'ping')\n"
        "    return b.recv(4)\n"
        "async def answer():\n"
        "    await asyncio.sleep(0)\n"
        "    return 42\n"
    )
    tests = ["assert echo(socket.SOCK_STREAM) == b'ping'", "assert echo(socket.SOCK_SEQPACKET) == b'ping'",
             "assert socket.socketpair()[0].family == socket.AF_UNIX", "assert asyncio.run(answer()) == 42"]
    result = sandbox.run(code, tests)
    assert result.passed, result.stderr_tail


def test_proc_environ_of_the_trainer_and_server_is_unreadable(sandbox: Sandbox, survives: Check) -> None:
    me = os.getpid()
    with open(f"/proc/{me}/environ", "rb") as handle:
        assert handle.read(), "precondition: this process's environment is readable by itself"
    code = (
        "import os\n"
        "def read(pid):\n"
        "    return open(f'/proc/{pid}/environ', 'rb').read() + open(f'/proc/{pid}/cmdline', 'rb').read()\n"
    )
    result = sandbox.run(code, [f"assert read({me})", "assert read(os.getppid())", f"assert os.listdir('/proc/{me}')"])
    assert result.num_passed == 0, result.stderr_tail
    survives()


def test_killing_the_fork_server_fails(sandbox: Sandbox, survives: Check) -> None:
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
    result = sandbox.run(code, ["assert True"])
    assert not result.passed and "PermissionError" in result.stderr_tail
    survives()


def test_killing_the_fork_servers_process_group_fails(sandbox: Sandbox, survives: Check) -> None:
    code = "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)"
    result = sandbox.run(code, ["assert True"])
    assert not result.passed
    survives()


def test_signalling_the_trainer_or_everyone_fails(sandbox: Sandbox, survives: Check) -> None:
    # Signal 0 only checks permission, so this test is harmless even if the protection were missing.
    me = os.getpid()
    result = sandbox.run("import os", [f"os.kill({me}, 0)", "os.kill(-1, 0)", "os.killpg(0, 0)"])
    assert result.num_passed == 0, result.stderr_tail
    survives()


def test_a_job_may_signal_itself(sandbox: Sandbox) -> None:
    code = (
        "import os, signal\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "signal.raise_signal(signal.SIGUSR1)\n"
    )
    assert sandbox.run(code, ["assert got == [1, 1]"]).passed


def test_killing_itself_is_reported_as_killed(sandbox: Sandbox, survives: Check) -> None:
    result = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", ["assert True"])
    assert result.status == "killed" and "SIGKILL" in result.stderr_tail
    survives()


def test_segfault_is_reported_as_killed(sandbox: Sandbox, survives: Check) -> None:
    result = sandbox.run("import ctypes\nctypes.string_at(0)", ["assert True"])
    assert result.status == "killed" and "SIGSEGV" in result.stderr_tail
    survives()


def test_hundred_megabytes_to_stdout_is_capped(sandbox: Sandbox, survives: Check) -> None:
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\nsys.stdout.flush()\n"
    result = sandbox.run(code, ["assert True"], timeout=10.0)
    assert not result.passed and "File too large" in result.stderr_tail
    assert len(result.stdout_tail) <= 4010
    assert result.duration_s < 5.0
    survives()


def test_filling_the_disk_stops_at_the_disk_limit(sandbox: Sandbox, survives: Check) -> None:
    code = (
        "written = 0\n"
        "def fill():\n"
        "    global written\n"
        "    for i in range(10):\n"
        "        with open(f'fill{i}', 'wb') as f:\n"
        "            for _ in range(16):\n"
        "                f.write(bytes(1 << 20))\n"
        "                written += 1\n"
    )
    result = sandbox.run(code, ["fill()", "assert written <= 64 + 32, written"], timeout=10.0)
    assert not result.passed and result.num_passed == 1, result.stderr_tail  # 160 MiB were refused
    survives()


def test_daemonised_child_cannot_be_created(sandbox: Sandbox, survives: Check) -> None:
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        print('daemon', os.getpid(), flush=True)\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
    )
    result = sandbox.run(code, ["assert True"])
    assert "daemon" not in result.stdout_tail and not result.passed
    survives()


def test_raising_rlimits_back_up_fails(sandbox: Sandbox, survives: Check) -> None:
    code = (
        "import resource\n"
        "def unlimit():\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "    return True\n"
        "def big():\n"
        "    return len(bytearray(1 << 30))\n"
    )
    result = sandbox.run(code, ["assert unlimit()", "assert big()",
                                "assert resource.getrlimit(resource.RLIMIT_AS)[1] <= 256 << 20"])
    assert result.num_passed == 1, result.stderr_tail  # only the read-back of the (unchanged) limit passes
    survives()


def test_namespaces_mounts_and_ptrace_are_denied(sandbox: Sandbox, survives: Check) -> None:
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    tests = [  # each call succeeds for an unprivileged process without the seccomp filter
        "assert libc.unshare(0x10000000) == 0",  # CLONE_NEWUSER
        "assert libc.ptrace(0, 0, 0, 0) == 0",  # PTRACE_TRACEME
        "assert libc.syscall(425, 8, ctypes.create_string_buffer(120)) >= 0",  # io_uring_setup
    ]
    result = sandbox.run(code, tests)
    assert result.num_passed == 0, result.stderr_tail
    survives()


def test_runs_as_an_unprivileged_uid(sandbox: Sandbox) -> None:
    result = sandbox.run("import os", ["assert os.getuid() != 0 and os.geteuid() != 0", "assert os.getgroups() == []"])
    assert result.passed, result.stderr_tail


def test_another_jobs_folder_cannot_be_read(sandbox: Sandbox, survives: Check) -> None:
    """Two jobs at once on the two workers: the second searches every job folder it can name."""
    roots = [os.path.join(sandbox._root, f"w{i}", "jobs") for i in range(2)]
    victim = "open('secret.txt', 'w').write('s3cret')\nimport time\ntime.sleep(1.0)"
    thief = (
        "import os, time\n"
        "time.sleep(0.3)\n"
        "def find():\n"
        "    found = []\n"
        f"    for root in {roots!r} + [os.path.dirname(os.getcwd())]:\n"
        "        try:\n"
        "            names = os.listdir(root)\n"
        "        except OSError:\n"
        "            continue\n"
        "        for name in names:\n"
        "            try:\n"
        "                found.append(open(os.path.join(root, name, 'secret.txt')).read())\n"
        "            except OSError:\n"
        "                pass\n"
        "    return found\n"
    )
    victim_result, thief_result = sandbox.run_many([
        {"code": victim, "tests": ["assert True"]},
        {"code": thief, "tests": ["assert 's3cret' in find()"]},
    ])
    assert victim_result.passed
    assert not thief_result.passed
    survives()
