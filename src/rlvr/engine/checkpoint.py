"""One checkpoint format: where checkpoints live, how they are written atomically, and how they are read.

Paths are ``rlvr://<run>/weights/<name>`` (training state: adapter, optimizer, RNG, metadata) and
``rlvr://<run>/sampler_weights/<name>`` (adapter only), ``tinker://`` accepted as an alias; both resolve to folders
under ``$RLVR_HOME/checkpoints``. A plain folder path holding a checkpoint works too.

Each checkpoint is a folder written under a temporary name and renamed into place, so a crash mid-save leaves
the previous checkpoint intact and never a half-written one:

    adapter_model.safetensors   LoRA weights, keyed as peft saves them (loadable with PeftModel.from_pretrained)
    adapter_config.json         the peft LoraConfig
    rlvr.json                   base model, LoRA spec, step, parameter order, format version, optimizer (weights/)
    optimizer.pt                AdamW or Dimuon state (weights/ only)
    rng.pt                      torch RNG state (weights/ only)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlvr.engine.models.load import rlvr_home
from rlvr.errors import CheckpointError, CheckpointNotFoundError
from rlvr.fileio import atomic_folder

FORMAT_VERSION = 1
SCHEMES = ("rlvr://", "tinker://")
KINDS = ("weights", "sampler_weights")


def checkpoint_root() -> Path:
    return rlvr_home() / "checkpoints"


def make_path(run_id: str, kind: str, name: str) -> str:
    """The ``rlvr://`` path of checkpoint ``name`` of ``run_id``."""
    assert kind in KINDS, kind
    if not name or "/" in name or name.startswith("."):
        raise CheckpointError(f"checkpoint name {name!r} must be non-empty, without '/', and not start with '.'")
    return f"rlvr://{run_id}/{kind}/{name}"


def resolve(path: str) -> Path:
    """The folder a checkpoint path names (it need not exist yet)."""
    if not isinstance(path, str) or not path:
        raise CheckpointError(f"checkpoint path must be a non-empty string, got {path!r}")
    for scheme in SCHEMES:
        if path.startswith(scheme):
            parts = path[len(scheme):].split("/")
            if len(parts) != 3 or parts[1] not in KINDS or not all(parts):
                raise CheckpointError(f"checkpoint path {path!r} must look like {scheme}<run>/weights/<name> or "
                                      f"{scheme}<run>/sampler_weights/<name>")
            return checkpoint_root().joinpath(*parts)
    return Path(path).expanduser()


def write(path: str, files: dict[str, object]) -> Path:
    """Write a checkpoint folder atomically. ``files`` maps file names to tensors dicts (.safetensors),
    JSON-able objects (.json) or torch-saveable objects (.pt)."""
    folder = resolve(path)
    with atomic_folder(folder) as tmp:  # an existing checkpoint of that name is replaced whole
        for filename, content in files.items():
            target = tmp / filename
            if filename.endswith(".safetensors"):
                save_file(content, str(target))  # type: ignore[arg-type]
            elif filename.endswith(".json"):
                target.write_text(json.dumps(content, indent=2, sort_keys=True))
            elif filename.endswith(".pt"):
                torch.save(content, target)
            else:
                raise AssertionError(f"unknown checkpoint file type {filename}")
    return folder


def read_meta(path: str) -> tuple[Path, dict]:
    """The folder and ``rlvr.json`` of an existing checkpoint, or CheckpointNotFoundError naming the path."""
    folder = resolve(path)
    meta_file = folder / "rlvr.json"
    if not meta_file.exists():
        hint = f" (looked in {folder})" if str(folder) != path else ""
        raise CheckpointNotFoundError(f"no checkpoint at {path!r}{hint}; paths come from save_state / "
                                      "save_weights_for_sampler, e.g. rlvr://<run>/weights/<name>")
    meta = json.loads(meta_file.read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format_version {meta.get('format_version')}, this rlvr "
                              f"reads {FORMAT_VERSION}")
    return folder, meta


def read_adapter(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


def read_torch(folder: Path, filename: str, path: str) -> object:
    target = folder / filename
    if not target.exists():
        raise CheckpointError(f"checkpoint {path!r} has no {filename}; it was saved with save_weights_for_sampler, "
                              "which keeps weights only. Resume from a save_state checkpoint (.../weights/...)")
    return torch.load(target, weights_only=True, map_location="cpu")  # saved on a GPU, read anywhere


def saved_optimizer(meta: dict) -> str:
    """The optimizer whose state a checkpoint holds: ``rlvr.json``'s ``optimizer.type`` ("adamw" or "dimuon"), AdamW
    for checkpoints written before Dimuon."""
    return str(meta.get("optimizer", {}).get("type", "adamw"))
