"""Taking a trained model out of rlvr: ``rlvr.export`` (and ``rlvr export``) writes a run's or a checkpoint's weights
as a merged Hugging Face folder, a PEFT adapter folder and/or a GGUF file.

    import rlvr

    rlvr.export("runs/arithmetic-20260101-120000", merged="out/model", gguf="out/model.gguf", gguf_type="q8_0")

What ``path`` may be: a checkpoint path (``rlvr://<run>/weights/<name>``, ``.../sampler_weights/<name>``), a
checkpoint folder, a run folder (its last checkpoint, as ``rlvr eval --checkpoint`` takes it) or a run's name: a
folder of ``./runs`` (as ``rlvr runs`` lists them), or the ``<run>`` of its ``rlvr://`` paths (the run folder that owns
them, or the newest checkpoint saved under it).

Not here: the model work, merging and writing files (``rlvr.engine.export``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.errors import CheckpointNotFoundError
from rlvr.home import KINDS, SCHEMES, checkpoint_root

if TYPE_CHECKING:
    from rlvr.engine.export import Exported

__all__ = ["checkpoint_of", "export"]

RUNS = Path("runs")
"""Where ``rlvr train`` puts run folders by default (``out=runs/<recipe>-<time>``): a bare name is looked up there."""


def export(path: str | Path, *, merged: str | Path | None = None, adapter: str | Path | None = None,
           gguf: str | Path | None = None, dtype: str | None = None, gguf_type: str = "f16",
           force: bool = False, progress: Callable[[str], None] | None = None) -> Exported:
    """Export the checkpoint ``path`` names (see the module docstring) as:

    - ``merged``: a Hugging Face folder with the LoRA merged into the base weights, in the base's dtype or ``dtype``
      ("float32", "bfloat16", "float16"), with tokenizer and chat template (transformers, vLLM);
    - ``adapter``: a PEFT adapter folder (``PeftModel.from_pretrained``, vLLM's LoRA serving);
    - ``gguf``: a GGUF file of the merged model, matrices in ``gguf_type`` ("f16", "bf16", "q8_0", "f32")
      (llama.cpp, Ollama, ``base_model=<file.gguf>``).

    An existing destination is replaced only with ``force``; ``progress`` is given one line saying what is being
    written, as the work starts. Returns the paths written."""
    from rlvr.engine.export import export_checkpoint

    return export_checkpoint(checkpoint_of(path), merged=merged, adapter=adapter, gguf=gguf, dtype=dtype,
                             gguf_type=gguf_type, force=force, progress=progress)


def checkpoint_of(path: str | Path) -> str:
    """The checkpoint path ``path`` names: itself (a checkpoint path or folder), a run folder's last checkpoint, or
    a run name's (see the module docstring); CheckpointNotFoundError naming what was looked for otherwise."""
    from rlvr.app.evaluation import resolve_checkpoint

    text = str(path)
    if text.startswith(SCHEMES) or (Path(text) / "rlvr.json").is_file():
        return text
    if Path(text).is_dir():
        return resolve_checkpoint(text)  # a run folder: its last checkpoint (or an error saying it has none)
    if "/" not in text and text:
        if (RUNS / text).is_dir():  # a folder name `rlvr runs` lists
            return resolve_checkpoint(RUNS / text)
        named = checkpoint_root() / text
        if named.is_symlink() and named.exists():  # a run folder owns it: the run's last checkpoint
            return resolve_checkpoint(named.resolve().parent)
        newest = _newest_checkpoint(named)
        if newest is not None:
            return newest
    raise CheckpointNotFoundError(f"{text!r} is neither a checkpoint (rlvr://<run>/weights/<name>, or a folder holding "
                                  f"rlvr.json), a run folder, nor the name of a run with checkpoints under "
                                  f"{checkpoint_root()}; `rlvr runs` lists run folders")


def _newest_checkpoint(folder: Path) -> str | None:
    """The ``rlvr://`` path of the most recently written checkpoint under ``folder`` (``<run>/<kind>/<name>``)."""
    found = [(meta.stat().st_mtime_ns, kind, meta.parent.name) for kind in KINDS
             for meta in (folder / kind).glob("*/rlvr.json")] if folder.is_dir() else []
    if not found:
        return None
    _, kind, name = max(found)
    return f"rlvr://{folder.name}/{kind}/{name}"
