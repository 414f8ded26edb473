"""One checkpoint format: how checkpoints are written atomically and read back (where they live: ``rlvr.home``).

Paths are ``rlvr://<run>/weights/<name>`` (training state: adapter, optimizer, RNG, metadata) and
``rlvr://<run>/sampler_weights/<name>`` (adapter only), ``tinker://`` accepted as an alias; both resolve to folders
under ``$RLVR_HOME/checkpoints`` (for a run of ``rlvr train``, a link into its run folder). A plain folder path
holding a checkpoint works too.

Each checkpoint is a folder written under a temporary name and renamed into place, so a crash or a full disk
mid-save leaves the previous checkpoint intact and never a half-written one:

    adapter_model.safetensors   LoRA weights, keyed as peft saves them (loadable with PeftModel.from_pretrained)
    adapter_config.json         the peft LoraConfig
    rlvr.json                   base model, LoRA spec, step, parameter order, format version, optimizer (weights/)
    optimizer.pt                AdamW or Dimuon state (weights/ only)
    rng.pt                      torch RNG state (weights/ only)

Every file is serialized in memory and written by Python, so a full disk, a denied permission or a read-only
filesystem is one ``StorageError`` naming the checkpoint, its folder and the fix; a damaged file read back is a
``CheckpointError`` naming it.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from rlvr.errors import CheckpointError, CheckpointNotFoundError
from rlvr.fileio import atomic_folder, storage_errors
from rlvr.home import resolve

__all__ = ["FORMAT_VERSION", "read_adapter", "read_meta", "read_torch", "write"]

FORMAT_VERSION = 1


def write(path: str, files: dict[str, object]) -> Path:
    """Write a checkpoint folder atomically. ``files`` maps file names to tensors dicts (.safetensors),
    JSON-able objects (.json) or torch-saveable objects (.pt)."""
    folder = resolve(path)
    action = f"write checkpoint {path} to" if str(folder) != path else "write checkpoint"
    with atomic_folder(folder, action=action) as tmp:  # an existing checkpoint of that name is replaced whole
        for filename, content in files.items():
            (tmp / filename).write_bytes(_serialize(filename, content))
    return folder


def _serialize(filename: str, content: object) -> bytes:
    if filename.endswith(".safetensors"):
        return save(content)  # type: ignore[arg-type]
    if filename.endswith(".json"):
        return json.dumps(content, indent=2, sort_keys=True).encode()
    if filename.endswith(".pt"):
        buffer = io.BytesIO()
        torch.save(content, buffer)
        return buffer.getvalue()
    raise AssertionError(f"unknown checkpoint file type {filename}")


def read_meta(path: str) -> tuple[Path, dict]:
    """The folder and ``rlvr.json`` of an existing checkpoint, or CheckpointNotFoundError naming the path."""
    folder = resolve(path)
    meta_file = folder / "rlvr.json"
    if not meta_file.exists():
        hint = f" (looked in {folder.resolve()})" if str(folder) != path else ""
        raise CheckpointNotFoundError(f"no checkpoint at {path!r}{hint}; paths come from save_state / "
                                      "save_weights_for_sampler, e.g. rlvr://<run>/weights/<name>")
    try:
        with storage_errors("read", meta_file):
            meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _damaged(path, meta_file, exc) from exc
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format_version {meta.get('format_version')}, this rlvr "
                              f"reads {FORMAT_VERSION}")
    return folder, meta


def read_adapter(folder: Path) -> dict[str, torch.Tensor]:
    target = folder / "adapter_model.safetensors"
    try:
        with storage_errors("read", target):
            return load_file(str(target))
    except SafetensorError as exc:
        raise _damaged(str(folder), target, exc) from exc


def read_torch(folder: Path, filename: str, path: str) -> object:
    target = folder / filename
    if not target.exists():
        raise CheckpointError(f"checkpoint {path!r} has no {filename}; it was saved with save_weights_for_sampler, "
                              "which keeps weights only. Resume from a save_state checkpoint (.../weights/...)")
    try:
        with storage_errors("read", target):
            return torch.load(target, weights_only=True, map_location="cpu")  # saved on a GPU, read anywhere
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:  # a truncated zip, a bad pickle
        raise _damaged(path, target, exc) from exc


def _damaged(path: str, file: Path, exc: BaseException) -> CheckpointError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return CheckpointError(f"checkpoint {path} is damaged: {file.resolve()} cannot be read ({reason:.120}); rlvr "
                           "writes checkpoints whole, so the file was changed afterwards (a disk fault, a copy cut "
                           "short): restore it, or resume from an earlier checkpoint")


def saved_optimizer(meta: dict) -> str:
    """The optimizer whose state a checkpoint holds: ``rlvr.json``'s ``optimizer.type`` ("adamw" or "dimuon"), AdamW
    for checkpoints written before Dimuon."""
    return str(meta.get("optimizer", {}).get("type", "adamw"))
