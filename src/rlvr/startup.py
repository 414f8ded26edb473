"""The Python garbage collector at an rlvr process's start and exit.

torch, transformers and tinker leave about 400,000 long-lived objects behind their imports (a train command's
process). Two things about them cost a fresh process time and buy nothing:

- **Collections during the imports.** Each full collection walks every object made so far, and the imports trigger a few
  of them as the heap grows (``docs/performance.md``, "Start-up and exit"); they find nothing to free, since every
  module's objects are still referenced. ``import_modules`` imports with the collector paused, then freezes what is
  alive (``gc.freeze``: moved out of the collector's generations), so later full collections during the run skip those
  objects too.
- **The last collection at exit.** After the exit handlers, the interpreter tears the modules down and its last
  collection deallocates every object one by one, a noticeable part of a short run's process. ``import rlvr`` registers
  an exit handler that collects the young generations (garbage cycles made lately are still finalized) and then freezes
  what is left, so those objects are left to the operating system, which takes the whole process back at once. Exit
  handlers registered later (Ray's shutdown, weakref finalizers, a tracker's close) still run before it; what is lost is
  the finalization of older objects in reference cycles at exit, which Python does not promise anyway. rlvr writes each
  file whole (``fileio``), or flushes each line as it appends it (``metrics.jsonl``), never relying on exit.

Not here: threads and cores (``engine/cores.py``), what a stop signal does (``app/run.py``, ``cli.py``).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import sys


def import_modules(*names: str) -> None:
    """Import ``names`` with the collector paused, then freeze every object alive (see the module docstring); the
    collector is left as it was (enabled or not). Where all of them are imported already (a long-lived process, such
    as a test run, calling a command in-process), nothing is done: what it holds is not frozen."""
    if all(name in sys.modules for name in names):
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def skip_the_last_collection() -> None:
    """At exit, collect the young garbage, then freeze the objects left, so the interpreter leaves them to the
    operating system (see the module docstring); registered once however many times it is called."""
    atexit.unregister(_leave_to_the_operating_system)
    atexit.register(_leave_to_the_operating_system)


def _leave_to_the_operating_system() -> None:
    if "triton._C.libtriton" in sys.modules:
        gc.unfreeze()  # triton's nanobind bindings print each object left alive at exit as a leak: let the last
        return  # collection take every object, those frozen after the imports too
    gc.collect(1)  # cycles that became garbage lately (a run's last objects) are still finalized: a few milliseconds
    gc.freeze()
