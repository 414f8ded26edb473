"""The engine's C kernels, compiled for this machine on first use and cached.

Each kernel is one C file in this package (with the shared headers here, ``*.h``), built with
``-O3 -march=native -fopenmp`` by ``$CC`` (else ``cc``) into ``$RLVR_HOME/kernels/``: a fraction of a second, once
per machine, compiler and source. A library is written atomically (a finished file or none) and named by a hash of
its source, headers, compiler, flags and this CPU's model and flags (``-march=native`` code is for this CPU only,
and a VM may hide some of a model's instructions). The kernels run on torch's own OpenMP threads.

Which kernels there are and how they are checked: ``fused_attention.py`` (decode attention) and ``amx_linear.py``
(float32 products on AMX).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from rlvr.engine.models.load import rlvr_home
from rlvr.fileio import atomic_file

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
HERE = Path(__file__).parent


@functools.cache
def cpu() -> tuple[str, frozenset[str]]:
    """This CPU's model name and flags, from /proc/cpuinfo (empty where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "", frozenset()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return model, frozenset(flags)


def compiler(needs: str, has: bool) -> str:
    """The C compiler to build with, on x86-64 Linux where ``has`` (the CPU features a kernel needs, described by
    ``needs``); RuntimeError naming what this machine lacks."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"it needs Linux on x86-64, this is {platform.system()} on {platform.machine()}")
    if not has:
        raise RuntimeError(f"this CPU lacks {needs} (see the flags in /proc/cpuinfo)")
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    return found


def build(source: str, cc: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """The compiled library of ``source`` (a C file of this package) by ``cc``, built now if not yet. Raises
    RuntimeError with what the compiler said. ``extra_flags`` go after the usual ones (``("-mno-avx512f",)``
    builds AVX2 code on an AVX-512 machine, as the tests do)."""
    path = HERE / source
    flags = [*FLAGS, *extra_flags]
    texts = [path.read_bytes(), *(header.read_bytes() for header in sorted(HERE.glob("*.h")))]
    model, cpu_flags = cpu()
    machine = " ".join([model, *sorted(cpu_flags)])
    key = hashlib.sha256(b"\0".join([*texts, " ".join([cc, *flags]).encode(), machine.encode()])).hexdigest()[:16]
    folder = rlvr_home() / "kernels"
    library = folder / f"{path.stem}-{key}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(library, mode=0o755) as built:  # another process building the same library writes the same
        try:
            done = subprocess.run([cc, *flags, str(path), "-o", str(built), "-lm"], capture_output=True, text=True,
                                  timeout=300)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"{cc} took over 300 s") from error
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
    return library


def checked(bind: Callable[[], Callable], self_check: Callable[[Callable], None], logger: logging.Logger,
            what: str) -> Callable | None:
    """The C function ``bind()`` loads, once ``self_check`` has accepted it, or None where it cannot build, load or
    pass here (the reason logged to ``logger`` as "``what`` unavailable"): how a kernel with a fallback is loaded."""
    try:
        function = bind()
        self_check(function)
    except (RuntimeError, OSError) as error:
        logger.info("%s unavailable (%s)", what, error)
        return None
    return function
