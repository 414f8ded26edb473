"""Moving a LoRA adapter from the trainer to the samplers, and proving it arrived: files and content hashes.

What it is: a published adapter travels as the bytes of the peft folder the engine already writes for sampler
checkpoints (``adapter_model.safetensors``, ``adapter_config.json``, ``rlvr.json``; see
``rlvr.engine.checkpoint``), so a sampler on another machine needs no shared disk. :func:`adapter_digest` hashes
an adapter's tensors (names, dtypes, shapes and bytes, in sorted order); the trainer hashes what it published, each
sampler hashes what it actually loaded into its model, and the two must be equal. :func:`received_files` is how
either sampler (the engine's, the vLLM one) takes the files it was sent.

What it is not: the checkpoint format itself (``rlvr.engine.checkpoint``) or the actors that call these helpers.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors

from rlvr.errors import SamplingError

ADAPTER_FILE = "adapter_model.safetensors"


def adapter_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of an adapter state dict: every tensor's name, dtype, shape and bytes, names sorted."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def read_folder(folder: Path) -> dict[str, bytes]:
    """The files of a checkpoint folder by name (flat: checkpoints have no subfolders)."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def files_digest(files: Mapping[str, bytes]) -> str:
    """:func:`adapter_digest` of the adapter inside a folder's files."""
    return adapter_digest(load_safetensors(files[ADAPTER_FILE]))


def write_folder(folder: Path, files: Mapping[str, bytes]) -> Path:
    """Write ``files`` into a fresh ``folder`` (replacing one left there), for the engine to load."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, content in files.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"unexpected file name {name!r} in a published adapter")
        (folder / name).write_bytes(content)
    return folder


def received_files(files: Any, replica: str, key: str) -> dict[str, bytes]:
    """The files of adapter ``key`` that sampler ``replica`` (as errors name it) was sent: ``files``, or what it
    refers to when the caller boxed a Ray reference; SamplingError when none came, as for a replica that restarted
    since the adapter was published and was sent only its name."""
    if files is not None and not isinstance(files, dict):  # a Ray ObjectRef, boxed by the caller
        import ray

        files = ray.get(files)
    if not files:
        raise SamplingError(f"{replica} was asked for adapter {key!r}, which it does not hold, and was given no files "
                            "to load it from")
    return files
