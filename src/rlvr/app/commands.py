"""The ``rlvr`` commands printed for a person to copy (resume a run, evaluate it, train from a state), spelled the
way they ran rlvr, so that a pasted line works in the shell and folder they ran it from.

    user_command("resume", "runs/my run")   # "./rlvr resume 'runs/my run'" after ./rlvr train, "rlvr resume ..."
                                            # when the installed rlvr is on PATH

How rlvr was invoked: ``$RLVR_COMMAND``, which the ``./rlvr`` wrapper of a clone exports as it was called
(``./rlvr``, ``../clone/rlvr``, a full path); else ``rlvr`` when the ``rlvr`` on PATH is the running executable;
else the running executable's path as given (``.venv/bin/rlvr``); else (``python -m``, a library call) ``rlvr``.
Every part is shell-quoted. Printing them whole, never wrapped, is the console's part (``soft_wrap=True``).

Not here: what the commands do (``cli.py``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["program", "user_command"]

ENV = "RLVR_COMMAND"
"""The environment variable naming how the ``./rlvr`` wrapper was invoked."""


def program() -> str:
    """The command that runs rlvr, as the person typed it (see the module docstring); unquoted."""
    told = os.environ.get(ENV, "").strip()
    if told:
        return told
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "rlvr":
        on_path = shutil.which("rlvr")
        if on_path and Path(on_path).resolve() == Path(argv0).resolve():
            return "rlvr"
        return argv0
    return "rlvr"


def user_command(*args: str) -> str:
    """``rlvr ARGS...`` as a line to paste: the program as the person ran it, then ``args``, each shell-quoted."""
    return " ".join(shlex.quote(part) for part in (program(), *map(str, args)))
