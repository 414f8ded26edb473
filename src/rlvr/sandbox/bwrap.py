"""The optional outer layer: run each fork server inside bubblewrap (``bwrap``) when it works here.

What it is: finding ``bwrap``, checking once per process that it can create its namespaces on this machine
(AppArmor's ``restrict_unprivileged_userns`` and container runtimes often forbid them), and building the
command line that wraps a fork server: a new user namespace in which the server is uid/gid 65534 with no
capabilities, new pid/ipc/uts/cgroup namespaces, no network at all (``--unshare-net``: only a loopback
device that nothing listens on), read-only binds of the system library folders and the interpreter only, a
private, size-capped ``/tmp``, a fresh ``/proc`` that shows only the sandbox's own processes, a cleared environment, and
``--die-with-parent``.

What it is not: required. Without ``bwrap`` the sandbox relies on rlimits, Landlock, seccomp and the
privilege drop, which each fork server applies per job either way (inside bwrap too).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

#: Where a bwrap-wrapped server keeps job folders and output files (its private tmpfs).
INNER_ROOT = "/tmp/rlvr-sandbox"
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")


def find() -> str | None:
    """Absolute path of ``bwrap``, or ``None``."""
    return shutil.which("bwrap", path=os.environ.get("PATH", "") + os.pathsep + "/usr/bin:/bin:/usr/local/bin")


def command(bwrap: str, read_only: list[str], jobs_bytes: int | None = None, out_bytes: int | None = None
            ) -> list[str]:
    """The ``bwrap`` arguments (up to and including ``--``) for a server that needs ``read_only`` paths.

    ``jobs_bytes`` caps the private ``/tmp`` that holds the job folders; ``out_bytes`` caps a second tmpfs
    for the jobs' stdout and stderr files, so a job that fills its folder still gets its traceback back.
    """
    args = [bwrap, "--die-with-parent", "--new-session", "--clearenv", "--unshare-all", "--unshare-user",
            "--unshare-net", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_FILES:
        args += ["--ro-bind-try", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if jobs_bytes is not None:
        args += ["--size", str(jobs_bytes)]
    args += ["--tmpfs", "/tmp"]
    if out_bytes is not None:
        args += ["--size", str(out_bytes), "--tmpfs", f"{INNER_ROOT}/out"]
    # After the private /tmp, so that code checked out or installed under /tmp stays visible (bound over it).
    covered = [p for p in _SYSTEM_DIRS if not os.path.islink(p)]
    for path in sorted({os.path.realpath(p) for p in read_only if os.path.exists(p)}):
        if not any(path == c or path.startswith(c + os.sep) for c in covered):
            args += ["--ro-bind", path, path]
            covered.append(path)
    args += ["--chdir", "/tmp", "--"]
    return args


@functools.cache
def probe(bwrap: str | None, python: str, read_only: tuple[str, ...]) -> tuple[bool, str]:
    """Whether wrapping works here: ``(True, version)`` or ``(False, why)``. Cached per process."""
    if bwrap is None:
        return False, "bwrap is not installed (optional: apt-get install bubblewrap)"
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        done = subprocess.run([*command(bwrap, list(read_only)), python, "-I", "-S", "-c", "pass"],
                              capture_output=True, text=True, timeout=30, env={}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{bwrap} could not run: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return False, (f"{bwrap} is installed but cannot create its namespaces here ({why}); an AppArmor or "
                       "container policy forbids unprivileged user namespaces")
    return True, version or "bwrap"


def interpreter_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Folders a wrapped server must see: the interpreter, its standard library, the sandbox's own code."""
    paths = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.abspath(__file__))}
    paths.update(extra)
    return sorted(paths)
