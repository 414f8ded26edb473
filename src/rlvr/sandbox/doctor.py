"""``rlvr sandbox doctor``: which protection layers are active here, checked by running hostile probes.

What it is: :func:`doctor` starts a one-worker :class:`~rlvr.sandbox.Sandbox`, reads the layers its fork
server prepared (Landlock, seccomp, privilege drop, rlimits, bwrap, pidfd, subreaper), then runs small
probe jobs that try what the layers should stop -- write outside the job folder, fork, open a TCP
connection to a loopback listener, connect to a world-writable Unix socket in the temporary folder, signal
the fork server, exceed the memory limit -- and records whether each was blocked. :func:`format_doctor_report`
turns that into text for the CLI.

What it is not: a benchmark or a test suite; it takes about a second and changes nothing on the machine
(the listeners and the probe's target path are its own and are removed).
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import socket
import sys
import tempfile

from rlvr.errors import SandboxError

_LAYER_ORDER = ("landlock", "seccomp", "privileges", "bwrap", "rlimits", "disk", "pidfd", "subreaper")


def _probes(listener_port: int, outside_path: str, unix_path: str) -> dict[str, tuple[str, str]]:
    """name -> (code defining ``probe()`` returning True when the attempt was blocked, what it tries)."""
    def attempt(body: str) -> str:
        return "def probe():\n    try:\n" + "".join(f"        {line}\n" for line in body.splitlines()) + \
            "    except (OSError, MemoryError):\n        return True\n    return False\n"

    return {
        "probe.filesystem": (attempt(f"open({outside_path!r}, 'w').write('x')"),
                             "write a file outside the job folder"),
        "probe.process": (attempt("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)"),
                          "fork a child process"),
        "probe.network": (attempt(f"import socket\nsocket.create_connection(('127.0.0.1', {listener_port}), 1)"),
                          "connect to a TCP listener on 127.0.0.1"),
        "probe.unix": (attempt(f"import socket\nsocket.socket(socket.AF_UNIX).connect({unix_path!r})"),
                       "connect to a world-writable Unix socket in the temporary folder"),
        "probe.signal": (attempt("import os\nos.kill(os.getppid(), 0)"), "signal the fork server"),
        "probe.memory": (attempt("block = bytearray(8 << 30)"), "allocate 8 GiB"),
        "probe.uid": ("import os\ndef probe():\n    return os.getuid() != 0\n", "run as root"),
    }


def doctor() -> dict[str, str]:
    """Report each protection layer (``"active: ..."`` or ``"missing: ..."``) and each probe's outcome.

    Keys: ``python``, ``kernel``, the layers (``landlock``, ``seccomp``, ``privileges``, ``bwrap``,
    ``rlimits``, ``pidfd``, ``subreaper``), the probes (``probe.*``: ``"blocked"`` or ``"NOT BLOCKED"``) and
    ``verdict``.
    """
    from rlvr.sandbox.executor import Sandbox

    report = {"python": f"{sys.version.split()[0]} at {os.path.realpath(sys.executable)}",
              "kernel": f"{platform.system()} {platform.release()} ({platform.machine()})"}
    outside = os.path.join(tempfile.gettempdir(), f"rlvr-doctor-{secrets.token_hex(6)}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    unix_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_folder = tempfile.mkdtemp(prefix="rlvr-doctor-")
    unix_path = os.path.join(unix_folder, "probe.sock")
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        os.chmod(unix_folder, 0o777)  # what a D-Bus bus or an X server offers: any uid may connect
        unix_listener.bind(unix_path)
        os.chmod(unix_path, 0o777)
        unix_listener.listen(1)
        unix_listener.setblocking(False)
        with Sandbox(num_workers=1, timeout=5.0, memory_mb=512) as sandbox:
            for name in _LAYER_ORDER:
                layer = sandbox.layers.get(name)
                if layer is not None:
                    report[name] = f"{'active' if layer['active'] else 'missing'}: {layer['detail']}"
            probes = _probes(listener.getsockname()[1], outside, unix_path)
            results = sandbox.run_many([{"code": code, "tests": ["assert probe()"]} for code, _ in probes.values()])
        for (name, (_, what)), result in zip(probes.items(), results, strict=True):
            if result.status not in ("ok", "failed"):
                report[name] = f"inconclusive ({result.status}): {result.stderr_tail.strip()[-200:]}"
            else:
                report[name] = f"{'blocked' if result.passed else 'NOT BLOCKED'}: {what}"
        if os.path.exists(outside):
            report["probe.filesystem"] = f"NOT BLOCKED: a job wrote {outside}"
        try:
            listener.accept()[0].close()
            report["probe.network"] = "NOT BLOCKED: a job connected to a loopback listener"
        except BlockingIOError:
            pass
        try:
            unix_listener.accept()[0].close()
            report["probe.unix"] = f"NOT BLOCKED: a job connected to {unix_path}"
        except BlockingIOError:
            pass
    except SandboxError as exc:
        report["sandbox"] = f"cannot start: {exc}"
    finally:
        listener.close()
        unix_listener.close()
        shutil.rmtree(unix_folder, ignore_errors=True)
        if os.path.exists(outside):
            os.unlink(outside)
    unblocked = [k for k, v in report.items() if k.startswith("probe.") and not v.startswith("blocked")]
    missing = [k for k in _LAYER_ORDER if report.get(k, "").startswith("missing") and k != "bwrap"]
    if "sandbox" in report:
        report["verdict"] = "the sandbox cannot run here"
    elif unblocked:
        report["verdict"] = f"WEAK: {', '.join(unblocked)} not blocked; do not run untrusted code here"
    elif missing:
        report["verdict"] = f"usable with reduced protection (missing: {', '.join(missing)})"
    else:
        report["verdict"] = "all layers active and every probe blocked"
    return report


def format_doctor_report(report: dict[str, str] | None = None) -> str:
    """Text for ``rlvr sandbox doctor``: one aligned line per key of :func:`doctor`'s report."""
    if report is None:
        report = doctor()
    width = max(len(key) for key in report)
    lines = ["rlvr sandbox doctor", ""]
    lines += [f"  {key.ljust(width)}  {value}" for key, value in report.items()]
    return "\n".join(lines) + "\n"


def doctor_ok(report: dict[str, str]) -> bool:
    """Whether the report shows a sandbox that runs and blocks every probe."""
    return "sandbox" not in report and not report.get("verdict", "").startswith("WEAK")
