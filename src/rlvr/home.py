"""Where rlvr keeps things on disk: ``$RLVR_HOME``, the checkpoint paths ``rlvr://<run>/<kind>/<name>`` and the folders
they name, and the link that makes a run folder own its checkpoints.

Torch-free, so the RL layer (which prunes a run's checkpoints and measures its disk use) and the engine (which writes
and reads checkpoints) share this one definition.

- ``$RLVR_HOME`` (default ``~/.cache/rlvr``) holds ``models/``, ``checkpoints/`` and ``run-index/``.
- ``rlvr://<run>/weights/<name>`` (``tinker://`` is an alias) names ``$RLVR_HOME/checkpoints/<run>/weights/<name>``;
  any other string is a plain folder path.
- A training run's checkpoints live in its run folder: :func:`link_run` makes ``$RLVR_HOME/checkpoints/<run>`` a
  symbolic link to ``<run folder>/checkpoints``, so the ``rlvr://`` paths keep resolving while the files are the run
  folder's (deleting the folder frees them; the dangling link is swept the next time a run is linked). Checkpoints
  saved through the Tinker API by a client that is not a run stay real folders under ``$RLVR_HOME/checkpoints``, as
  do those of runs from before run folders owned them.

- The run index (``$RLVR_HOME/run-index``) remembers every run folder made on this machine, wherever it is
  (``out=``), so ``rlvr runs`` finds them all: one small file per folder, named by a hash of its absolute path and
  written atomically (:func:`index_run`), so two runs starting at once never write the same file, and a run indexed
  twice (resumed) stays one entry. :func:`indexed_runs` reads it, removing the entries of folders deleted since.

Not here: what a checkpoint holds and how it is written (``rlvr.engine.checkpoint``), which checkpoints a run keeps
(``rlvr.rl.checkpoints``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rlvr.errors import CheckpointError
from rlvr.fileio import write_atomic

__all__ = ["KINDS", "SCHEMES", "checkpoint_root", "folder_size", "index_run", "indexed_runs", "link_run", "make_path",
           "resolve", "rlvr_home", "run_copy", "run_index"]

SCHEMES = ("rlvr://", "tinker://")
KINDS = ("weights", "sampler_weights")
RUN_CHECKPOINTS = "checkpoints"
"""The folder inside a run folder that holds its checkpoints (``weights/<name>``)."""


def rlvr_home() -> Path:
    """Where rlvr keeps models and checkpoints: ``$RLVR_HOME``, default ``~/.cache/rlvr``."""
    return Path(os.environ.get("RLVR_HOME", Path.home() / ".cache" / "rlvr")).expanduser()


def checkpoint_root() -> Path:
    return rlvr_home() / "checkpoints"


def run_index() -> Path:
    """The folder of the run index: one ``<hash>.json`` per run folder, ``{"path": <its absolute path>}``."""
    return rlvr_home() / "run-index"


RUN_FILES = ("status.json", "config.yaml", "metrics.jsonl")
"""A folder holding one of these is a run folder (the index forgets a folder that holds none)."""


def index_run(run_dir: str | Path) -> Path:
    """Add ``run_dir`` to the run index (again: no change); returns its entry's file."""
    folder = Path(run_dir).resolve()
    index = run_index()
    index.mkdir(parents=True, exist_ok=True)
    entry = index / f"{hashlib.sha256(str(folder).encode('utf-8', 'surrogateescape')).hexdigest()[:24]}.json"
    return write_atomic(entry, json.dumps({"path": str(folder)}, ensure_ascii=True))


def indexed_runs() -> list[Path]:
    """The run folders in the index, in no order; the entries of folders that no longer exist (or hold no run file)
    are removed, and unreadable entries (not written by :func:`index_run`) skipped."""
    index = run_index()
    folders = []
    for entry in sorted(index.glob("*.json")) if index.is_dir() else []:
        try:
            folder = Path(json.loads(entry.read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if folder.is_dir() and any((folder / name).exists() for name in RUN_FILES):
            folders.append(folder)
        else:
            entry.unlink(missing_ok=True)  # a concurrent reader may have removed it first
    return folders


def make_path(run_id: str, kind: str, name: str) -> str:
    """The ``rlvr://`` path of checkpoint ``name`` of ``run_id``."""
    assert kind in KINDS, kind
    if not name or "/" in name or name.startswith("."):
        raise CheckpointError(f"checkpoint name {name!r} must be non-empty, without '/', and not start with '.'")
    return f"rlvr://{run_id}/{kind}/{name}"


def _parts(path: str) -> list[str] | None:
    """``[run, kind, name]`` of an ``rlvr://`` / ``tinker://`` path, None for a plain path."""
    if not isinstance(path, str) or not path:
        raise CheckpointError(f"checkpoint path must be a non-empty string, got {path!r}")
    for scheme in SCHEMES:
        if path.startswith(scheme):
            parts = path[len(scheme):].split("/")
            if len(parts) != 3 or parts[1] not in KINDS or not all(parts):
                raise CheckpointError(f"checkpoint path {path!r} must look like {scheme}<run>/weights/<name> or "
                                      f"{scheme}<run>/sampler_weights/<name>")
            return parts
    return None


def resolve(path: str) -> Path:
    """The folder a checkpoint path names (it need not exist yet)."""
    parts = _parts(path)
    return checkpoint_root().joinpath(*parts) if parts else Path(path).expanduser()


def run_copy(run_dir: str | Path, path: str) -> Path | None:
    """Where checkpoint ``path`` of the run in ``run_dir`` sits inside that folder (``checkpoints/weights/<name>``),
    whatever ``$RLVR_HOME`` says now: the way to it when the run folder moved or ``$RLVR_HOME`` changed since it was
    saved. None for a plain path or a checkpoint the folder does not hold."""
    parts = _parts(path)
    if parts is None:
        return None
    folder = Path(run_dir) / RUN_CHECKPOINTS / parts[1] / parts[2]
    return folder if folder.is_dir() else None


def link_run(run_id: str, run_dir: str | Path) -> Path:
    """Make ``run_dir`` own the checkpoints of ``run_id``: ``$RLVR_HOME/checkpoints/<run_id>`` becomes a link to
    ``<run_dir>/checkpoints`` (created), so what is saved as ``rlvr://<run_id>/...`` is written there. Links whose run
    folder is gone are removed on the way. Returns the run's checkpoint folder."""
    target = (Path(run_dir) / RUN_CHECKPOINTS).resolve()
    target.mkdir(parents=True, exist_ok=True)
    root = checkpoint_root()
    root.mkdir(parents=True, exist_ok=True)
    link = root / run_id
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return target
    if link.exists() or link.is_symlink():
        raise CheckpointError(f"{link} exists already: run id {run_id!r} has checkpoints of its own, so they cannot "
                              f"move to {target}; save them with a new training client")
    _sweep_dangling(root)
    temp = root / f".{run_id}.link-{os.getpid()}"
    temp.unlink(missing_ok=True)
    temp.symlink_to(target, target_is_directory=True)
    os.replace(temp, link)  # the link appears whole
    return target


def _sweep_dangling(root: Path) -> None:
    """Remove the links of runs whose folder was deleted (nothing else: real folders are other users' checkpoints)."""
    for entry in root.iterdir():
        if entry.is_symlink() and not entry.exists():
            entry.unlink(missing_ok=True)


def folder_size(folder: str | Path) -> int:
    """Bytes of the files under ``folder``, links not followed (0 when it does not exist)."""
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:  # removed meanwhile
                continue
    return total
