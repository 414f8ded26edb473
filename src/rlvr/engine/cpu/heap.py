"""The C heap of a process with a CPU engine: glibc's allocator told to reuse large freed blocks instead of mapping
fresh pages for every one, and to hand the free pages back to the system after each training call.

A CPU trainer's forward and backward on a real model allocate far more than they keep, in tensors of tens of MB.
glibc serves every block over 32 MB (and, on a thread other than the main one, every block its 64 MB heaps cannot
hold) with a fresh ``mmap`` and unmaps it when freed, so each page of each tensor is faulted in and zeroed by the
kernel before the first write.

``keep_freed_blocks`` (an ``Engine`` on the CPU paths calls it before its worker thread starts) sets one arena for every
thread (``M_ARENA_MAX=1``: the main heap, which grows without the 64 MB limit), no ``mmap`` for large blocks
(``M_MMAP_MAX=0``) and no trimming of the heap's top on each ``free`` (``M_TRIM_THRESHOLD``), so a freed block is reused
by the next one that fits. ``release_free_pages`` (after loading a model and after each ``forward`` and
``forward_backward``) returns the free pages anywhere in the heap (``malloc_trim(0)``), so between calls the process
holds what is live, not its high-water mark. What it costs: during a call the heap also holds the holes between live
blocks, so the peak grows (what it bought and cost, measured: ``docs/performance.md``, "The C heap").

The numerics policy's ``heap=system`` (``rlvr.numerics``: the ``heap`` config key or ``RLVR_HEAP``) keeps glibc's
defaults. On a C library other than glibc (macOS, musl) nothing changes.

Not here: the engine's threads (``cores.py``), torch's own allocator (a CPU tensor's memory comes from ``malloc``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import threading

from rlvr.numerics import active

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # mallopt parameters, glibc's malloc.h
TRIM_THRESHOLD = 1 << 30
"""Free bytes at the heap's top before ``free`` gives them back on its own (``release_free_pages`` does instead)."""

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None  # set once the settings are made


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_freed_blocks(setting: str | None = None) -> bool:
    """Make this process's ``malloc`` reuse large freed blocks (the module docstring); True where it does (glibc,
    and ``setting``, the policy's ``heap``, is not ``system``; None: ``rlvr.numerics.active()``'s). Threads started
    before the first call keep the arenas they have. Idempotent.
    """
    global _libc
    with _lock:
        if _libc is not None:
            return True
        setting = setting or active().heap
        libc = _glibc() if setting != "system" else None
        if libc is None:
            return False
        done = [libc.mallopt(param, value) for param, value in
                ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))]
        if not all(done):
            logger.warning("rlvr: glibc refused a malloc setting (results %s, in the order arena count, mmap count, "
                           "trim threshold); large freed blocks may not be reused, and the heap is not trimmed", done)
            return False
        _libc = libc
        return True


def release_free_pages() -> None:
    """Give the heap's free pages back to the system (after ``keep_freed_blocks``; else nothing to do)."""
    if _libc is not None:
        _libc.malloc_trim(0)
