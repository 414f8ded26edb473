"""Landlock through ``ctypes``: confine a forked job to read-only system paths and one read-write folder.

What it is: a thin, standard-library-only binding to the three Landlock system calls
(``landlock_create_ruleset``, ``landlock_add_rule``, ``landlock_restrict_self``) and the policy the sandbox
applies with them. The fork server loads this file by path (it runs with ``python -I -S``), prepares a
:class:`Policy` once (probing the ABI, opening the read-only paths with ``O_PATH``) and each forked job calls
:meth:`Policy.apply` with its own folder. The policy:

* filesystem: read (files and directory listings, no execute) beneath the interpreter's and the system's
  library folders; read, write, create and remove beneath the job's folder; read and write on ``/dev/null``;
  nothing else -- not ``/proc`` (so no ``/proc/<pid>/environ``), not ``/tmp``, not the home folder;
* network (ABI 4+): no TCP ``bind`` or ``connect`` at all;
* scoping (ABI 6+): no signals to processes outside the job's domain, no connecting to abstract Unix sockets
  created outside it.

What it is not: a complete sandbox. Landlock does not limit memory, CPU, process creation or system calls
other than the ones it mediates; those are the rlimits' and seccomp's jobs. It does nothing on a kernel
without Landlock (before 5.13, or booted without it in ``lsm=``): :func:`abi_version` then reports 0 and the
reason, and the sandbox warns.
"""

from __future__ import annotations

import ctypes
import os
import sys

# System call numbers: Landlock came after the unification of syscall tables, so they are the same on every
# architecture Linux supports.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, with the ABI that introduced them.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_FS_ABI1 = (1 << 13) - 1
_FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_ONLY = FS_READ_FILE | FS_READ_DIR

#: System folders a Python job may read. Secrets do not live here; ``/etc`` is left out on purpose (with the
#: few harmless files below instead) because a root job that keeps CAP_DAC_READ_SEARCH could read /etc/shadow.
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin")
SYSTEM_READ_FILES = (
    "/etc/localtime", "/etc/hosts", "/etc/nsswitch.conf", "/etc/mime.types", "/etc/passwd", "/etc/group",
    "/dev/urandom",
)
DEVICE_RW_FILES = ("/dev/null", "/dev/zero")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
# One prototype per call shape, built once, so a job passes plain ints and pointers (no per-call wrapping).
_create_ruleset = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32,
                                   use_errno=True)(("syscall", _libc))
_add_rule = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                             ctypes.c_uint32, use_errno=True)(("syscall", _libc))
_restrict_self = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_uint32,
                                  use_errno=True)(("syscall", _libc))
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _raise_errno(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def abi_version() -> tuple[int, str]:
    """Return ``(abi, reason)``: the kernel's Landlock ABI (0 when unavailable) and, when 0, why."""
    if not sys.platform.startswith("linux"):
        return 0, f"Landlock is Linux-only (this is {sys.platform})"
    abi = _create_ruleset(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    if abi > 0:
        return int(abi), ""
    err = ctypes.get_errno()
    if err == 38:  # ENOSYS
        return 0, "the kernel has no Landlock system calls (Linux < 5.13 or CONFIG_SECURITY_LANDLOCK=n)"
    if err == 95:  # EOPNOTSUPP
        return 0, "Landlock is built in but not enabled at boot (add 'landlock' to the lsm= kernel parameter)"
    return 0, f"landlock_create_ruleset failed: {os.strerror(err)}"


def _handled(abi: int) -> tuple[int, int, int, int]:
    """Return (fs, net, scoped, attr_size) for an ABI version."""
    fs = _FS_ABI1
    if abi >= 2:
        fs |= FS_REFER
    if abi >= 3:
        fs |= FS_TRUNCATE
    if abi >= 5:
        fs |= FS_IOCTL_DEV
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    return fs, net, scoped, size


def describe(abi: int) -> str:
    """One line naming what an ABI version lets the policy enforce."""
    if abi <= 0:
        return "unavailable"
    parts = ["filesystem"]
    if abi >= 4:
        parts.append("TCP bind/connect")
    if abi >= 6:
        parts.append("signal and abstract-socket scoping")
    return f"ABI {abi} ({', '.join(parts)})"


def interpreter_read_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Folders holding this interpreter and its standard library, plus ``extra``, that exist."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p)
    paths.update(extra)
    return sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})


def _outermost(paths: list[str]) -> list[str]:
    """Existing ``paths`` with symlinks resolved, without those inside another one (fewer rules per job)."""
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    kept: list[str] = []
    for path in real:
        if not any(path.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(path)
    return kept


class Policy:
    """A Landlock policy prepared in the fork server and applied in each forked job.

    Construction probes the ABI and opens every read-only path once (``O_PATH``), so a job only creates a
    ruleset, adds these rules plus its own folder, and restricts itself: a handful of system calls.
    """

    def __init__(self, read_paths: list[str]) -> None:
        self.abi, self.reason = abi_version()
        self.fs, self.net, self.scoped, self._size = _handled(self.abi) if self.abi else (0, 0, 0, 0)
        self._rules: list[_PathBeneathAttr] = []  # one per O_PATH descriptor opened here
        self.read_paths: list[str] = []
        if not self.abi:
            return
        self._attr = _RulesetAttr(self.fs, self.net, self.scoped)
        self._job_rule = _PathBeneathAttr(self.fs, -1)
        for path in _outermost([*read_paths, *SYSTEM_READ_PATHS, *SYSTEM_READ_FILES]):
            self._add_path(path, READ_ONLY)
        for path in DEVICE_RW_FILES:
            self._add_path(path, FS_READ_FILE | FS_WRITE_FILE)

    @property
    def active(self) -> bool:
        """Whether the kernel supports Landlock, so :meth:`apply` confines."""
        return self.abi > 0

    def _add_path(self, path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # a system folder this distribution does not have
        if not os.path.isdir(path):
            access &= _FILE_ONLY_RIGHTS
        self._rules.append(_PathBeneathAttr(access & self.fs, fd))
        self.read_paths.append(path)

    def apply(self, job_dir: str) -> None:
        """Restrict the calling process (and its future threads) to the policy plus ``job_dir`` read-write.

        Sets ``PR_SET_NO_NEW_PRIVS`` (Landlock requires it without CAP_SYS_ADMIN). Raises ``OSError`` if any
        step fails: a job must not run half-confined.
        """
        ruleset = _create_ruleset(_SYS_CREATE_RULESET, ctypes.addressof(self._attr), self._size, 0)
        if ruleset < 0:
            _raise_errno("landlock_create_ruleset")
        job_fd = os.open(job_dir, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
        try:
            self._job_rule.parent_fd = job_fd
            for rule in [*self._rules, self._job_rule]:
                if _add_rule(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.addressof(rule), 0) < 0:
                    _raise_errno("landlock_add_rule")
            if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                _raise_errno("prctl(PR_SET_NO_NEW_PRIVS)")
            if _restrict_self(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
                _raise_errno("landlock_restrict_self")
        finally:
            os.close(job_fd)
            os.close(ruleset)
