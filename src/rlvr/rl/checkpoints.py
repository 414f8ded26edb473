"""Loop checkpoints: which training state to resume from, and the loop state that goes with it.

Each checkpoint is a ``save_state`` (weights, AdamW, RNG; written atomically by the engine) plus one JSON line in the
run folder's ``checkpoints.jsonl``: the step to continue from, the state path, the loop's RNG. The line is written
only after the state is complete, with flush and fsync, so a process killed mid-checkpoint leaves at worst a torn
last line, which ``last_checkpoint`` skips: the run resumes from the previous checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILENAME = "checkpoints.jsonl"


def record_checkpoint(run_dir: Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` to ``checkpoints.jsonl`` durably."""
    with open(run_dir / FILENAME, "a") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def last_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete entry of ``checkpoints.jsonl``, or None when there is none."""
    path = run_dir / FILENAME
    if not path.exists():
        return None
    last = None
    for line in path.read_text().splitlines():
        try:
            last = json.loads(line)
        except json.JSONDecodeError:  # a torn line from a killed write: the previous entry stands
            continue
    return last
