"""A seccomp filter for sandboxed jobs, built with libseccomp through ``ctypes`` and loaded per job.

What it is: the system-call policy of a job, standard library only (the fork server loads this file by path). The
fork server builds the filter once with libseccomp and exports it as classic BPF; each forked job patches its own
pid into the program (for "signals only to itself") and loads it with ``prctl(PR_SET_SECCOMP)``, so libseccomp never
runs in the job and building costs nothing per job. The filter allows everything except:

* process creation other than threads: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (EPERM), ``clone3``
  (ENOSYS, so the C library falls back to ``clone``, which the filter can inspect); ``execve``, ``execveat``;
* every socket with an address: ``socket`` entirely (no network, no host Unix sockets by path or abstract name), and
  ``socketpair`` other than ``AF_UNIX`` stream or seqpacket (a datagram end could still ``sendto`` a socket file);
* signals to anyone but itself (``kill``, ``tgkill``, ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo``; ``tkill`` and the
  ``pidfd_*`` calls entirely);
* other processes and namespaces: ``ptrace``, ``process_vm_readv/writev``, ``kcmp``, ``mount`` and the new mount API,
  ``unshare``, ``setns``, ``chroot``, ``pivot_root``;
* kernel attack surface: ``bpf``, ``io_uring_*`` (ENOSYS), ``keyctl``/``add_key``/``request_key``,
  ``perf_event_open``, ``userfaultfd``, ``open_by_handle_at``, module and kexec calls;
* raising resource limits (``setrlimit``, ``prlimit64`` with a new limit); system calls of another ABI kill.

What it is not: a filesystem policy (Landlock's), nor a limit on memory or CPU (rlimits). Without libseccomp the
sandbox runs without this layer, and warns.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_KILL_PROCESS = 0x80000000
_SCMP_FLTATR_ACT_BADARCH = 2
_CMP_NE = 1
_CMP_MASKED_EQ = 7
_CLONE_THREAD = 0x00010000
_AF_UNIX = 1
_SOCK_TYPE_MASK = 0xF  # the type argument of socketpair also carries SOCK_NONBLOCK and SOCK_CLOEXEC
_SOCK_DGRAM = 2
_SOCK_RAW = 3
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

#: Stands for "this job's pid" in the exported program; above any real pid (pid_max is at most 2**22).
_PID_PLACEHOLDER = 0x3A5C_F00D


def _errno(value: int) -> int:
    return 0x00050000 | (value & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_EPERM = _errno(errno.EPERM)
_ENOSYS = _errno(errno.ENOSYS)
_SELF = object()  # marker: "the job's own pid"

#: (syscall, action, [(arg index, comparison, value)]) -- the action applies when every comparison holds.
_RULES: list[tuple[str, int, list[tuple[int, int, object]]]] = [
    ("fork", _EPERM, []),
    ("vfork", _EPERM, []),
    ("clone", _EPERM, [(0, _CMP_MASKED_EQ, (_CLONE_THREAD, 0))]),
    ("clone3", _ENOSYS, []),
    ("execve", _EPERM, []),
    ("execveat", _EPERM, []),
    ("socket", _EPERM, []),
    ("socketpair", _EPERM, [(0, _CMP_NE, _AF_UNIX)]),
    ("socketpair", _EPERM, [(1, _CMP_MASKED_EQ, (_SOCK_TYPE_MASK, _SOCK_DGRAM))]),
    ("socketpair", _EPERM, [(1, _CMP_MASKED_EQ, (_SOCK_TYPE_MASK, _SOCK_RAW))]),
    ("kill", _EPERM, [(0, _CMP_NE, _SELF)]),
    ("tgkill", _EPERM, [(0, _CMP_NE, _SELF)]),
    ("rt_sigqueueinfo", _EPERM, [(0, _CMP_NE, _SELF)]),
    ("rt_tgsigqueueinfo", _EPERM, [(0, _CMP_NE, _SELF)]),
    ("setrlimit", _EPERM, []),
    ("prlimit64", _EPERM, [(2, _CMP_NE, 0)]),
    *[(name, _ENOSYS, []) for name in ("io_uring_setup", "io_uring_enter", "io_uring_register")],
    *[
        (name, _EPERM, [])
        for name in (
            "tkill", "pidfd_send_signal", "pidfd_open", "pidfd_getfd", "ptrace", "process_vm_readv",
            "process_vm_writev", "process_madvise", "kcmp", "mount", "umount2", "mount_setattr", "move_mount",
            "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "unshare", "setns", "chroot", "pivot_root",
            "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "name_to_handle_at",
            "open_by_handle_at", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
            "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm", "personality",
            "fanotify_init", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
            "setdomainname", "vhangup",
        )
    ],
]


def _load_library() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        errors = [str(exc)]
    # Only now: ctypes.util imports subprocess and tempfile, hence threading and random, whose after-fork
    # hooks would then run in every job.
    from ctypes.util import find_library

    name = find_library("seccomp")
    if name:
        try:
            return ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError("libseccomp is not installed (apt-get install libseccomp2 / dnf install libseccomp); "
                  + "; ".join(errors))


class Filter:
    """A seccomp program built once (in the fork server) and loaded in each forked job.

    ``Filter()`` raises ``OSError`` naming the cause when libseccomp is missing or rejects a rule.
    """

    def __init__(self) -> None:
        lib = _load_library()
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgCmp)]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_version.restype = ctypes.POINTER(_Version)
        version = lib.seccomp_version().contents
        self.version = f"{version.major}.{version.minor}.{version.micro}"
        ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
        if not ctx:
            raise OSError("seccomp_init failed")
        try:
            if lib.seccomp_attr_set(ctx, _SCMP_FLTATR_ACT_BADARCH, _SCMP_ACT_KILL_PROCESS) != 0:
                raise OSError("seccomp_attr_set(ACT_BADARCH) failed")
            self.denied: list[str] = []
            for name, action, conditions in _RULES:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number < 0:
                    continue  # not a system call on this architecture (fork on arm64, iopl off x86)
                cmps = (_ArgCmp * max(1, len(conditions)))()
                for i, (arg, op, value) in enumerate(conditions):
                    a, b = value if isinstance(value, tuple) else (_PID_PLACEHOLDER if value is _SELF else value, 0)
                    cmps[i] = _ArgCmp(arg, op, a, b)
                rc = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), cmps)
                if rc != 0:
                    raise OSError(-rc, f"seccomp_rule_add({name}) failed: {os.strerror(-rc)}")
                if name not in self.denied:
                    self.denied.append(name)
            self.program = self._export(lib, ctx)
        finally:
            lib.seccomp_release(ctx)
        self._pid_slots = [i for i in range(0, len(self.program), 8)
                           if struct.unpack_from("=I", self.program, i + 4)[0] == _PID_PLACEHOLDER]
        if not self._pid_slots:
            raise OSError("the exported seccomp program has no slot for the job's pid; libseccomp changed its output")
        libc = ctypes.CDLL(None, use_errno=True)
        self._prctl = libc.prctl
        self._prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        # The program lives in a ctypes buffer prepared here; a job only patches its pid into it.
        self._buffer = ctypes.create_string_buffer(self.program, len(self.program))
        self._view = memoryview(self._buffer).cast("B")
        self._fprog = _SockFprog(len(self.program) // 8, ctypes.addressof(self._buffer))
        self._fprog_ref = ctypes.byref(self._fprog)

    @staticmethod
    def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
        fd = os.memfd_create("rlvr-seccomp", os.MFD_CLOEXEC)
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc != 0:
                raise OSError(-rc, f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)

    def apply(self) -> None:
        """Load the filter into the calling process, for its own pid. Raises ``OSError`` on failure.

        Must be called while the process has a single thread (right after fork): a filter applies to the
        calling thread and the threads it creates afterwards.
        """
        pid = os.getpid()
        for slot in self._pid_slots:
            struct.pack_into("=I", self._view, slot + 4, pid)
        if self._prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        if self._prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog_ref, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
