"""The collector at a process's start and exit (``rlvr/startup.py``), each in a fresh Python process: imports run
with the collector paused and their objects frozen after; at exit, late garbage is still finalized and the rest is
left to the operating system."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# An object in a reference cycle that says when it is finalized.
_CYCLE = """
class Cycle:
    def __init__(self, name):
        self.name, self.me = name, self
    def __del__(self):
        print("finalized", self.name, flush=True)
"""


def python(code: str, tmp_path: Path) -> list[str]:
    """Run ``code`` in a fresh interpreter (this checkout's rlvr, ``tmp_path`` on the path); its output lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(tmp_path)])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_modules_are_imported_with_the_collector_paused_then_frozen_and_it_is_left_as_it_was(tmp_path):
    (tmp_path / "probe_a.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    (tmp_path / "probe_b.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    out = python("""
        import gc, sys
        from rlvr import startup
        frozen = gc.get_freeze_count()
        startup.import_modules("probe_a")
        print(sys.modules["probe_a"].COLLECTING, gc.isenabled(), gc.get_freeze_count() > frozen)
        frozen = gc.get_freeze_count()
        startup.import_modules("probe_a")  # imported already: nothing frozen
        print(gc.get_freeze_count() == frozen)
        gc.disable()
        startup.import_modules("probe_b")
        print(sys.modules["probe_b"].COLLECTING, gc.isenabled())
    """, tmp_path)
    assert out == ["False True True", "True", "False False"]


def test_an_import_that_fails_leaves_the_collector_on(tmp_path):
    (tmp_path / "broken.py").write_text("raise ImportError('no such thing')\n")
    out = python("""
        import gc
        from rlvr import startup
        try:
            startup.import_modules("broken")
        except ImportError as exc:
            print(exc, gc.isenabled())
    """, tmp_path)
    assert out == ["no such thing True"]


def test_at_exit_late_garbage_is_finalized_and_what_modules_hold_is_left_to_the_operating_system(tmp_path):
    program = _CYCLE + """
lost = Cycle("late garbage")
del lost  # unreachable, not yet collected
kept = Cycle("held by a module")
print("end")
"""
    plain = python(program, tmp_path)
    assert plain[0] == "end" and sorted(plain[1:]) == ["finalized held by a module", "finalized late garbage"]
    assert python("import rlvr\n" + program, tmp_path) == ["end", "finalized late garbage"]


def test_a_process_that_loaded_triton_exits_without_leak_reports(tmp_path):
    # triton's bindings (nanobind) report every object of theirs still alive at exit; transformers imports triton
    # wherever it is installed (the dev extra), so such a process runs the last collection after all.
    pytest.importorskip("triton", reason="triton is not installed (the dev extra on x86-64 Linux has it)")
    code = ("from rlvr import startup\nstartup.import_modules('transformers.models.llama.modeling_llama')\n"
            "import triton._C.libtriton\nprint('end')\n")  # objects frozen after the imports, as a command has
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "end\n", done.stderr[-2000:]
    assert "leaked" not in done.stderr, done.stderr[-2000:]
