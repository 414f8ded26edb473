"""A run folder's checkpoint lists as files: where the states live, which entry a resume starts from, which states
are kept. The run record (``run_record.py``) is their one writer: it saves a state through a training client and
records it here as a typed entry; these functions read and write the plain JSON lines.

Each checkpoint is a ``save_state`` (weights, AdamW, RNG; written atomically by the engine) plus one JSON line in the
run folder's ``checkpoints.jsonl``: the step to continue from, the state path, the loop's RNG. The line is written
only after the state is complete, with flush and fsync, so a process killed mid-checkpoint leaves at worst a torn
last line, which ``last_checkpoint`` skips (the run resumes from the previous checkpoint) and the next
``record_checkpoint`` cuts off before it appends (so the new entry starts a line of its own). A supervised warm-up
before RL keeps its own checkpoints the same way, in ``warmup_checkpoints.jsonl``.

The states live in the run folder (``checkpoints/weights/<name>``, :func:`own_checkpoints`), so deleting the folder
frees them; their ``rlvr://`` paths keep resolving through ``$RLVR_HOME`` (``rlvr.home``). :func:`prune_checkpoints`
keeps the last ``keep`` of them and every final one, and never the newest, which a resume starts from. Runs from
before run folders owned their checkpoints keep them under ``$RLVR_HOME/checkpoints``; they load and resume as
before, and pruning leaves them alone (it deletes only what the run folder holds).

Not here: what an entry holds and which kinds there are (``run_record.Checkpoint``), what a state holds
(``rlvr.engine.checkpoint``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.errors import CheckpointError
from rlvr.fileio import append_jsonl, read_jsonl, remove_folder
from rlvr.home import folder_size, link_run, resolve, run_copy

FILENAME = "checkpoints.jsonl"
WARMUP = "warmup_checkpoints.jsonl"
"""The supervised warm-up's checkpoints (``step`` = warm-up steps done), apart from the RL loop's."""


def record_checkpoint(run_dir: Path, entry: dict[str, Any], filename: str = FILENAME) -> None:
    """Append ``entry`` to ``checkpoints.jsonl`` (or ``filename``) durably (a torn last line from a killed write is
    cut off first)."""
    append_jsonl(Path(run_dir) / filename, entry, durable=True)


def last_checkpoint(run_dir: Path, filename: str = FILENAME) -> dict[str, Any] | None:
    """The newest complete entry of ``checkpoints.jsonl`` (or ``filename``), or None when there is none. Its
    ``state_path`` is one that loads: the recorded path, or the run folder's own copy of it when the folder moved or
    ``$RLVR_HOME`` changed since."""
    entries = read_checkpoints(run_dir, filename)
    if not entries:
        return None
    entry = entries[-1]
    return {**entry, "state_path": loadable_path(run_dir, entry["state_path"])}


def read_checkpoints(run_dir: Path, filename: str = FILENAME) -> list[dict[str, Any]]:
    """The complete entries of ``checkpoints.jsonl`` (or ``filename``), oldest first (none: no file yet)."""
    path = Path(run_dir) / filename
    return read_jsonl(path, bad_lines="skip") if path.exists() else []


def loadable_path(run_dir: Path, state_path: str) -> str:
    """``state_path`` as recorded in ``run_dir``'s checkpoints, or the run folder's own copy of it when the recorded
    one no longer loads (the folder moved, or ``$RLVR_HOME`` changed)."""
    moved = run_copy(run_dir, state_path)
    if moved is not None and not (resolve(state_path) / "rlvr.json").exists():
        return str(moved)
    return state_path


def own_checkpoints(run_dir: Path, training_client: Any) -> None:
    """Have the run folder hold what ``training_client`` saves (``<run_dir>/checkpoints``), under the same
    ``rlvr://`` paths; call it before the client's first ``save_state``."""
    link_run(training_client.model_id, run_dir)


def prune_checkpoints(run_dir: Path, keep: int, filename: str = FILENAME) -> list[str]:
    """Delete the states of ``checkpoints.jsonl`` (or ``filename``) entries but the last ``keep`` and the final ones
    (``"final": true``), among those the run folder holds; ``keep=0`` keeps all. The newest entry, the one a resume
    starts from, is always kept. Returns the state paths deleted."""
    path = Path(run_dir) / filename
    if keep <= 0 or not path.exists():
        return []
    entries = read_jsonl(path, bad_lines="skip")
    paths = list(dict.fromkeys(e["state_path"] for e in entries))  # each state once, oldest first
    final = {e["state_path"] for e in entries if e.get("final")}
    kept = set(paths[-max(keep, 1):]) | final
    owned = Path(run_dir).resolve()
    deleted = []
    for state_path in paths:
        folder = resolve(state_path)
        if state_path in kept or not folder.is_dir() or not folder.resolve().is_relative_to(owned):
            continue
        remove_folder(folder.resolve())
        deleted.append(state_path)
    return deleted


def disk_use(run_dir: Path) -> int:
    """Bytes the run holds: its folder, and the states of older runs' checkpoints that live outside it."""
    run_dir = Path(run_dir)
    total = folder_size(run_dir)
    owned = run_dir.resolve()
    for filename in (FILENAME, WARMUP):
        if not (run_dir / filename).exists():
            continue
        for state_path in dict.fromkeys(e.get("state_path") for e in read_jsonl(run_dir / filename, bad_lines="skip")):
            try:
                folder = resolve(state_path).resolve()
            except CheckpointError:  # not a checkpoint path rlvr wrote: nothing to count
                continue
            if folder.is_dir() and not folder.is_relative_to(owned):
                total += folder_size(folder)
    return total
