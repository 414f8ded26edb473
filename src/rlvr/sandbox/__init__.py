"""A sandbox for code rewards: run untrusted Python programs against their tests, safely and fast.

Code-generation RL scores a policy by running the code it wrote against tests. ``Sandbox`` runs such
programs in a pool of warm fork servers, without root, Docker or network::

    from rlvr.sandbox import Sandbox

    with Sandbox(num_workers=4, timeout=5.0, memory_mb=512) as sandbox:   # before loading the model
        result = sandbox.run("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(0, 0) == 0"])
        result.passed, result.num_passed, result.status        # True, 2, "ok"
        results = sandbox.run_many([{"code": ..., "tests": [...]}, ...])

Whole programs run as :class:`ScriptJob` (``sandbox.run_scripts``: exit status and output, no tests),
``sandbox.submit`` queues one job from any thread, and ``rlvr sandbox serve`` (``fusion``) answers SandboxFusion's
``/run_code`` with them. ``rlvr sandbox doctor`` shows which layers are active; a missing one is warned about once.

Contract: each job runs in a forked child of a fork server (``server``) under rlimits, in a private size-capped
folder, as ``nobody`` when root, under Landlock and seccomp where the machine has them and optionally in ``bwrap``,
with a wall-clock timeout that kills its process group and everything it left behind. A program that loops,
allocates, forks, floods output, fills the disk, writes outside its folder, reaches the network or the host's
sockets, or signals the trainer is stopped or contained, and the next job runs. A test passes only when the fork
server receives that test's fresh secret (``harness``), so ending early, printing markers or patching builtins never
passes. Not covered: a program that reads the secrets from its own memory, weak tests, kernel exploits, and what a
missing layer would have stopped. The layers and the whole threat model: ``docs/sandbox.md``.
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
