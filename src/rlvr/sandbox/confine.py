"""Per-process confinement steps that are not Landlock or seccomp: rlimits, privilege drop, process hygiene.

What it is: small standard-library functions (the fork server loads this file by path) that the fork server
and each forked job call:

* :func:`set_rlimits` -- CPU seconds, address space, file size, open files, no core dumps and, where it means
  something, a process count, with soft limit equal to hard limit so an unprivileged job cannot raise them;
* :func:`drop_privileges` -- a job forked by a root server becomes an unprivileged uid (``nobody`` by
  default) with no supplementary groups and no capabilities, except ``CAP_DAC_READ_SEARCH`` when the
  interpreter lives where that uid cannot read (e.g. pyenv under ``/root``) -- then reads stay confined by
  Landlock to the interpreter and system folders;
* :func:`set_parent_death_signal`, :func:`become_subreaper`, :func:`children` and :func:`kill_children` --
  a job dies with its fork server, and processes a job leaves behind are re-parented to the fork server,
  which kills them after every job.

What it is not: a policy on files, sockets or system calls (``landlock``, ``seccomp``), nor the decision of
which steps apply (``server``).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_PR_SET_CHILD_SUBREAPER = 36
_CAP_DAC_READ_SEARCH = 2
_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
# Resolved once here, in the fork server: a symbol lookup in each job would cost more than the call.
_libc_prctl = _libc.prctl
_libc_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc_capset = _libc.capset


def _prctl(option: int, arg: int) -> None:
    if _libc_prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def set_rlimits(limits: dict[str, int | None]) -> None:
    """Apply ``limits`` (keys ``cpu_s``, ``memory_bytes``, ``file_bytes``, ``open_files``, ``processes``).

    A value of ``None`` leaves that limit as it is. Core dumps are always disabled.
    """
    table = {
        "cpu_s": resource.RLIMIT_CPU,
        "memory_bytes": resource.RLIMIT_AS,
        "file_bytes": resource.RLIMIT_FSIZE,
        "open_files": resource.RLIMIT_NOFILE,
        "processes": resource.RLIMIT_NPROC,
    }
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, which in table.items():
        value = limits.get(key)
        if value is None:
            continue
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and os.geteuid() != 0:
            value = min(value, hard)
        if which == resource.RLIMIT_CPU:  # SIGXCPU at the soft limit, SIGKILL one second later
            resource.setrlimit(which, (value, value + 1))
        else:
            resource.setrlimit(which, (value, value))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_HEADER = _CapHeader(_CAPABILITY_VERSION_3, 0)
_CAP_READ_SEARCH_ONLY = (_CapData * 2)(_CapData(1 << _CAP_DAC_READ_SEARCH, 1 << _CAP_DAC_READ_SEARCH, 0))


def _keep_only_read_search() -> None:
    if _libc_capset(ctypes.byref(_CAP_HEADER), _CAP_READ_SEARCH_ONLY) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset(CAP_DAC_READ_SEARCH): {os.strerror(err)}")


def drop_privileges(uid: int, gid: int, keep_read_search: bool = False) -> None:
    """Become ``uid``/``gid`` with no supplementary groups; needs root. Raises ``OSError`` on failure.

    With ``keep_read_search`` the process keeps ``CAP_DAC_READ_SEARCH`` (read any file, list any folder) and
    no other capability; use it only with Landlock confining reads.
    """
    os.setgroups([])
    if keep_read_search:
        _prctl(_PR_SET_KEEPCAPS, 1)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if keep_read_search:
        _keep_only_read_search()
        _prctl(_PR_SET_KEEPCAPS, 0)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"privilege drop to uid {uid} did not take effect")


def set_parent_death_signal(expected_parent: int) -> None:
    """Get SIGKILL when the parent dies; exit at once if it already died (the race prctl cannot cover)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(137)


def become_subreaper() -> None:
    """Make orphaned descendants re-parent to this process rather than to init."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def children() -> list[int] | None:
    """Pids of this (single-threaded) process's children, or ``None`` where /proc cannot tell."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return None


def kill_children(rounds: int = 50) -> int:
    """SIGKILL and reap every child (each one is a leftover of a finished job); return how many were found.

    Repeats until no child is left, since a leftover may fork while it is being killed (at most ``rounds``).
    """
    found = 0
    for _ in range(rounds):
        pids = children()
        if not pids:
            break
        found += len(pids)
        for pid in pids:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in pids:  # SIGKILL cannot be caught: each dies promptly, and is reaped here
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        reap()
    return found


def reap() -> None:
    """Reap every child that has exited, without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 14, 1 << 18


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def private_tmpfs(path: str, size_bytes: int) -> None:
    """Mount a tmpfs of ``size_bytes`` on ``path`` in a new, private mount namespace (needs CAP_SYS_ADMIN).

    Only this process and its children see the mount; it disappears with them. Jobs whose folders live
    there share ``size_bytes`` of disk, enforced by the kernel (writes fail with ENOSPC).
    """
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "mount(/, MS_PRIVATE)")
    options = f"size={size_bytes},mode=0711".encode()
    _check(_libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), options),
           f"mount(tmpfs, {path})")


def used_bytes(path: str) -> int:
    """Bytes in use on the filesystem holding ``path`` (``statvfs``)."""
    stats = os.statvfs(path)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def unreadable_for(uid: int, gid: int, paths: list[str]) -> list[str]:
    """Which of ``paths`` ``uid``/``gid`` cannot list, tested in a short-lived forked child (needs root)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            try:
                drop_privileges(uid, gid)
            except OSError as exc:
                os.write(write_end, b"\0" + str(exc).encode())
                os._exit(0)
            bad = []
            for path in paths:
                try:
                    if os.path.isdir(path):
                        os.listdir(path)
                    else:
                        open(path, "rb").close()
                except OSError:
                    bad.append(path)
            os.write(write_end, "\n".join(bad).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    if data.startswith(b"\0"):
        raise OSError(f"cannot become uid {uid}: {data[1:].decode(errors='replace')}")
    return [p for p in data.decode().split("\n") if p]


def count_tasks_of_uid(uid: int) -> int:
    """How many tasks (processes and threads) the real uid ``uid`` has now, from /proc; 0 if unreadable."""
    count = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as handle:
                fields = dict(line.split(b":", 1) for line in handle.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                count += int(fields.get(b"Threads", b"1").strip())
        except (OSError, KeyError, ValueError):
            continue
    return count
