"""Loop checkpoints: which training state to resume from, and the loop state that goes with it.

Each checkpoint is a ``save_state`` (weights, AdamW, RNG; written atomically by the engine) plus one JSON line in the
run folder's ``checkpoints.jsonl``: the step to continue from, the state path, the loop's RNG. The line is written
only after the state is complete, with flush and fsync, so a process killed mid-checkpoint leaves at worst a torn
last line, which ``last_checkpoint`` skips (the run resumes from the previous checkpoint) and the next
``record_checkpoint`` cuts off before it appends (so the new entry starts a line of its own). A supervised warm-up
before RL keeps its own checkpoints the same way, in ``warmup_checkpoints.jsonl``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.fileio import append_jsonl, read_jsonl

FILENAME = "checkpoints.jsonl"
WARMUP = "warmup_checkpoints.jsonl"
"""The supervised warm-up's checkpoints (``step`` = warm-up steps done), apart from the RL loop's."""


def record_checkpoint(run_dir: Path, entry: dict[str, Any], filename: str = FILENAME) -> None:
    """Append ``entry`` to ``checkpoints.jsonl`` (or ``filename``) durably (a torn last line from a killed write is
    cut off first)."""
    append_jsonl(Path(run_dir) / filename, entry, durable=True)


def last_checkpoint(run_dir: Path, filename: str = FILENAME) -> dict[str, Any] | None:
    """The newest complete entry of ``checkpoints.jsonl`` (or ``filename``), or None when there is none."""
    path = Path(run_dir) / filename
    if not path.exists():
        return None
    entries = read_jsonl(path, bad_lines="skip")
    return entries[-1] if entries else None
