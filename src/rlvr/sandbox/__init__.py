"""A sandbox for code rewards: run untrusted Python programs against their tests, safely and fast.

Code-generation RL scores a policy by running the code it wrote against tests. ``Sandbox`` runs such
programs in a pool of warm fork servers, without root, Docker or network::

    from rlvr.sandbox import Sandbox

    with Sandbox(num_workers=4, timeout=5.0, memory_mb=512) as sandbox:   # before loading the model
        result = sandbox.run("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(0, 0) == 0"])
        result.passed, result.num_passed, result.status        # True, 2, "ok"
        results = sandbox.run_many([{"code": ..., "tests": [...]}, ...])

``python -m rlvr.sandbox doctor`` (``rlvr sandbox doctor``) reports which layers are active on a machine. Whole
programs run as :class:`ScriptJob` (``sandbox.run_scripts``; exit status and output, no tests), ``sandbox.submit``
queues one job from any thread, and ``rlvr sandbox serve`` (``fusion``) answers SandboxFusion's ``/run_code`` with them.

Layers, per job (a forked child of a fork server; see ``server``)
    new session and process group; rlimits (CPU seconds, address space, file size -- stdout and stderr go
    to capped files --, open files, no core dumps, a process count where meaningful); a private folder
    whose total size is capped (a private tmpfs when root, bwrap's sized tmpfs, else a watchdog);
    when running as root, the uid ``nobody`` with no groups and no capabilities; Landlock (read-only
    interpreter and system folders, read-write job folder, no TCP, no signals or abstract sockets outside
    the job) when the kernel has it; a seccomp filter (no fork/exec, no ``socket()`` at all -- only stream
    and seqpacket ``socketpair()``, which have no address --, signals only to itself, no
    ptrace/mount/namespaces/bpf/io_uring/keyctl, no raising rlimits) when libseccomp is installed;
    optionally each fork server inside ``bwrap`` (user/pid/net namespaces, read-only binds, private
    /tmp). The server enforces the wall-clock timeout on a pidfd, kills the job's process group,
    reaps it, and -- being a child subreaper -- kills anything the job left behind. Missing layers are
    warned about once per process and shown by the doctor.

Threat model
    Covered: a program that loops, sleeps, allocates without bound, forks without end, writes huge
    output, fills the disk, writes outside its folder (/etc, the home folder, other jobs' folders), opens
    network connections or DNS lookups, connects or sends to the host's Unix sockets (socket files such as
    a D-Bus bus, an X server, an ssh agent or a container runtime, even world-writable or owned by the
    job's own uid, and abstract ones), reads the trainer's secrets through /proc, signals or kills its
    fork server, the trainer or its own process group, raises its rlimits, daemonises to outlive the job,
    or closes or floods the report pipe -- each is stopped or contained, the fork server survives (or is
    restarted) and the next job runs. A program also cannot *pass* by ending early (``sys.exit(0)``,
    ``os._exit(0)``, a signal), by printing a success marker, by patching ``builtins``/``os``/``sys`` or
    the harness module, by installing trace hooks, or by writing made-up reports to its file descriptors:
    each test's pass is counted only when the fork server receives that test's 16-byte secret, fresh for
    every job, and the job is ``ok`` only with the end secret and exit status 0 (see ``harness``).

    Not covered:

    1. The tests run in the same interpreter as the untrusted code, after it, so a program written
       against this harness can still find the secrets in its own memory (frame locals, ``gc``,
       ``ctypes``) and forge passes. Closing that needs test verdicts computed outside the untrusted
       process, which MBPP-style ``assert`` tests do not allow.
    2. Weak tests: an object whose ``__eq__`` always returns True passes ``assert f(x) == y``. Only
       ``passed`` and ``num_passed`` are integrity-checked; a program can choose how it fails (time out,
       exhaust memory, die), so statuses other than ``ok`` are diagnostics, not rewards.
    3. Kernel exploits through the system calls seccomp allows, and side channels.
    4. What a missing layer would have stopped. Without Landlock an unprivileged job can read what its
       uid can read, /proc/<pid>/environ of the trainer included, and a root job that keeps
       CAP_DAC_READ_SEARCH (interpreter under /root) can read every file; without seccomp a job can fork
       (bounded by RLIMIT_NPROC where meaningful, the process-group kill and the subreaper sweep), use the
       network without Landlock ABI 4 (UDP and DNS even with it), and connect or send to any Unix socket
       file its uid may write, unless bwrap hides it (the Landlock policy scopes only abstract sockets,
       from ABI 6; it does not use the newer right over socket files); without both, a job can read a
       concurrent job's folder if it learns its random name.
    5. Disk use of an unprivileged sandbox without bwrap is policed by a watchdog that looks every 10 ms,
       so a fast writer overshoots ``disk_mb`` by what it writes meanwhile (tens of MiB); root and bwrap
       get a kernel-enforced tmpfs size instead.
    6. Under bwrap, ``--die-with-parent`` kills the fork servers when the *thread* that created the
       Sandbox exits: create it in a long-lived thread.
"""

from rlvr.sandbox.backend import SandboxBackend
from rlvr.sandbox.doctor import doctor, format_doctor_report
from rlvr.sandbox.executor import DEFAULT_PRELOAD, Sandbox
from rlvr.sandbox.result import (
    SCRIPT_STATUSES,
    STATUSES,
    SandboxJob,
    SandboxResult,
    ScriptJob,
    ScriptResult,
    ScriptStatus,
    Status,
)

__all__ = [
    "DEFAULT_PRELOAD",
    "SCRIPT_STATUSES",
    "STATUSES",
    "Sandbox",
    "SandboxBackend",
    "SandboxJob",
    "SandboxResult",
    "ScriptJob",
    "ScriptResult",
    "ScriptStatus",
    "Status",
    "doctor",
    "format_doctor_report",
]
