"""Script jobs inside the fork server: a whole program run as ``python main.py`` would run it.

What it is: standard-library-only functions the fork server uses for a ``{"mode": "script"}`` job (it loads this
file by path, as it loads ``harness``): in the forked job, :func:`stdin_fd` gives it its stdin and :func:`stage`
writes its files and its program into its folder (after Landlock, as the job's own uid, so a file can land nowhere
else); :func:`run` then runs the program as the main module and exits with its status, as the interpreter would.
After the job, :func:`outcome` turns how it ended into a status and a return code, and :func:`read_head` and
:func:`fetch` read its output and the files asked back.

What it is not: a test harness. Nothing here is secret or integrity-checked: the program's exit status *is* its
result, as for SandboxFusion's ``/run_code``, so a program that exits 0 without doing its work has simply chosen to.
"""

from __future__ import annotations

import base64
import os
import posixpath
import signal
import stat
import sys
import traceback
from typing import NoReturn

#: What a script job's status can be; mirrors ``rlvr.sandbox.result.SCRIPT_STATUSES``.
FINISHED, TIMEOUT, ERROR = "finished", "timeout", "error"


def safe_path(job_dir: str, path: str) -> str:
    """``path`` joined to ``job_dir``, refusing one that would leave it (the parent checked it too)."""
    normal = posixpath.normpath(path)
    if not path or "\0" in path or posixpath.isabs(path) or normal in (".", "..") or normal.startswith("../"):
        raise ValueError(f"file name {path!r} is not a relative path inside the job folder")
    return os.path.join(job_dir, normal)


def stdin_fd(data: str | None) -> int:
    """A descriptor to read ``data`` (base64 of the stdin bytes; None: nothing) from, positioned at its start."""
    if not data:
        return os.open("/dev/null", os.O_RDONLY)
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    view = memoryview(base64.b64decode(data))
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def stage(job: dict, job_dir: str) -> str:
    """Write the job's files and its program into ``job_dir``; the program's path. Run in the job, confined."""
    for name, encoded in job.get("files", {}).items():
        target = safe_path(job_dir, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(base64.b64decode(encoded))
    program = os.path.join(job_dir, job["script_name"])
    with open(program, "w", encoding="utf-8", errors="surrogatepass") as handle:
        handle.write(job["code"])
    return program


def run(code: str, program: str) -> NoReturn:
    """Run ``code`` (read from ``program``) as ``python program`` would, then exit with its status.

    ``__name__`` is ``"__main__"`` in a fresh module registered as ``sys.modules["__main__"]``; ``sys.argv`` is
    ``[program]`` and the program's folder is first on ``sys.path``. ``SystemExit`` gives the status as the
    interpreter does (None: 0, an int: itself, anything else: printed, 1); an uncaught exception prints its
    traceback and gives 1. Non-daemon threads are joined and ``atexit`` functions run before the exit.
    """
    import atexit
    import types

    exit_, stderr_write = os._exit, os.write
    status = 0
    module = types.ModuleType("__main__")
    module.__file__ = program
    sys.modules["__main__"] = module
    sys.argv = [program]
    sys.path.insert(0, os.path.dirname(program))
    try:
        exec(compile(code, program, "exec"), module.__dict__)
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:
        _print_exception(exc)
        status = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:
        _print_exception(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            try:
                stderr_write(2, b"[sandbox] the program's output could not be flushed\n")
            except OSError:
                pass
    exit_(status & 0xFF)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _print_exception(exc: BaseException) -> None:
    try:  # tb_next: leave out this module's own frame, as the interpreter shows only the program's
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
    except BaseException:
        pass


def outcome(how: str, wait_status: int, cpu_s: float, timeout: float, disk_limit: int | None
            ) -> tuple[str, int | None, list[str]]:
    """The job's status, return code (``subprocess``'s convention: -N for signal N) and ``[sandbox]`` notes.

    ``how`` is how supervision ended: ``exited``, ``timeout``, ``disk`` (watchdog) or ``abort`` (trainer gone).
    """
    if how == "abort":
        return ERROR, None, ["the trainer went away while the program ran; it was killed"]
    if how == "timeout":
        return TIMEOUT, None, [f"wall-clock timeout after {timeout:g} s; the program's process group was killed"]
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_s >= timeout):
        return TIMEOUT, None, [f"timeout: CPU time limit of {timeout:g} s exceeded"]
    if how == "disk":
        return FINISHED, -signal.SIGKILL, [f"the program wrote more than {(disk_limit or 0) >> 20} MiB to disk and "
                                           "was killed"]
    if signum is not None:
        return FINISHED, -signum, [f"the program was killed by signal {signal.Signals(signum).name}"]
    return FINISHED, os.WEXITSTATUS(wait_status), []


def read_head(path: str, limit: int) -> str:
    """The first ``limit`` bytes of a file as text (bad UTF-8 replaced; "" if missing)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def fetch(job_dir: str, names: list[str], limit: int) -> tuple[dict[str, str], list[str]]:
    """The named regular files of the finished job's folder, base64-encoded, at most ``limit`` bytes in all, and
    notes on what was left out. Run after the job and everything it left behind were killed, so nothing changes
    the folder meanwhile; a name that resolves outside it (a symbolic link to /etc, say) is refused."""
    found: dict[str, str] = {}
    notes: list[str] = []
    root = os.path.realpath(job_dir)
    left = limit
    for name in names:
        try:
            path = os.path.realpath(safe_path(job_dir, name))
        except ValueError as exc:
            notes.append(f"fetch_files: {exc}")
            continue
        if not path.startswith(root + os.sep):
            notes.append(f"fetch_files: {name!r} leads outside the job folder; not returned")
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # missing, as SandboxFusion leaves it out
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read(left + 1)
        finally:
            os.close(fd)
        if len(data) > left:
            notes.append(f"fetch_files: {name!r} and what follows pass the {limit >> 20} MiB limit; not returned")
            break
        left -= len(data)
        found[name] = base64.b64encode(data).decode("ascii")
    return found, notes
