"""A checkpoint out of rlvr, in the forms other tools load: a merged Hugging Face folder, a PEFT adapter folder, a GGUF
file.

    export_checkpoint("rlvr://run/weights/final", merged="out/model", adapter="out/lora", gguf="out/model.gguf")

- ``merged``: the base model with the LoRA update added into its weights by peft's own ``merge_and_unload``, in the
  base model's dtype (or ``dtype``), with config.json, generation config, tokenizer and chat template:
  ``AutoModelForCausalLM.from_pretrained`` and vLLM load it. Where the LoRA adapts an output layer tied to the
  embedding, the merged model unties them (rlvr trains the output layer's update alone; merging it into a shared
  matrix would change the embedding too).
- ``adapter``: ``adapter_config.json`` + ``adapter_model.safetensors`` as peft writes them, whose
  ``base_model_name_or_path`` names a base model other tools can find (a hub id, else a local folder):
  ``PeftModel.from_pretrained(base, folder)`` and vLLM's LoRA serving load it.
- ``gguf``: the merged model as one GGUF file (``gguf_write.py``: Llama, Qwen2 and Qwen3 with a byte-level BPE
  tokenizer), its matrices in float16, bfloat16, Q8_0 or float32 (``gguf_type``); llama.cpp, Ollama and
  ``base_model=<file.gguf>`` load it.

Every output is written beside its destination under a temporary name and renamed into place, so a destination
holds a whole export or what it held before. An existing destination is replaced only with ``force``.

Not here: which checkpoint a run folder or run name means (``rlvr.weights``), the ``rlvr export`` command
(``rlvr.cli``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.engine import checkpoint
from rlvr.engine.models.gguf_write import Encode, check_architecture, gguf_tokenizer, write_gguf
from rlvr.engine.models.load import canonical_name, load_base_model, model_folder
from rlvr.errors import ConfigurationError
from rlvr.fileio import atomic_folder
from rlvr.model_names import ALIASES

__all__ = ["DTYPES", "GGUF_TYPES", "Exported", "base_reference", "export_checkpoint", "merged_model",
           "write_adapter", "write_adapter_config"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes a merged folder is written in (``dtype``; None: the base model's)."""
GGUF_TYPES = {"f16": GGMLQuantizationType.F16, "bf16": GGMLQuantizationType.BF16,
              "q8_0": GGMLQuantizationType.Q8_0, "f32": GGMLQuantizationType.F32}
"""The types a GGUF file's matrices are stored in (``gguf_type``); vectors (norms, biases) are always float32, and a
matrix whose rows do not split into Q8_0's 32-value blocks is stored as float16, as llama.cpp's quantizer does."""
HUB_IDS = {name: hub for hub, name in ALIASES.items() if "/" in hub}
"""Hub ids of the models rlvr names otherwise (``smollm2-135m`` -> ``HuggingFaceTB/SmolLM2-135M-Instruct``)."""


@dataclass(frozen=True)
class Exported:
    """What an export wrote (None: not asked for)."""

    merged: Path | None = None
    """The merged Hugging Face folder."""
    adapter: Path | None = None
    """The PEFT adapter folder."""
    gguf: Path | None = None
    """The GGUF file."""


def export_checkpoint(path: str, *, merged: str | Path | None = None, adapter: str | Path | None = None,
                      gguf: str | Path | None = None, dtype: str | None = None, gguf_type: str = "f16",
                      force: bool = False, progress: Callable[[str], None] | None = None) -> Exported:
    """Write checkpoint ``path`` (``rlvr://<run>/weights/<name>``, ``.../sampler_weights/<name>`` or a checkpoint
    folder) as a merged folder, an adapter folder and/or a GGUF file (see the module docstring). ``progress`` is
    given one line, once the settings are checked, saying what is being written; the libraries' own progress bars
    and deprecation warnings are kept quiet meanwhile."""
    if merged is None and adapter is None and gguf is None:
        raise ConfigurationError("nothing to export: give merged= (a Hugging Face folder), adapter= (a PEFT adapter "
                                 "folder) or gguf= (a .gguf file), or several (CLI: --merged, --adapter, --gguf)")
    if dtype is not None and dtype not in DTYPES:
        raise ConfigurationError(f"dtype={dtype!r}: choose one of {list(DTYPES)} (or none: the base model's)")
    if gguf_type not in GGUF_TYPES:
        raise ConfigurationError(f"gguf_type={gguf_type!r}: choose one of {list(GGUF_TYPES)}")
    for field, target in (("merged", merged), ("adapter", adapter)):
        if target is not None:
            _check_folder(field, Path(target), force)
    if gguf is not None:
        _check_file(Path(gguf), force)
    folder, meta = checkpoint.read_meta(path)
    base_model = meta["base_model"]
    if progress is not None:
        kinds = [kind for kind, target in (("merged folder", merged), ("adapter", adapter),
                                           (f"GGUF ({gguf_type})", gguf)) if target is not None]
        progress(f"exporting {path} (base model {base_model}): {', '.join(kinds)}")
    with _libraries_quiet():
        return _export(folder, base_model, merged, adapter, gguf, dtype, gguf_type)


@contextlib.contextmanager
def _libraries_quiet() -> Iterator[None]:
    """transformers' and huggingface_hub's progress bars off, and their FutureWarnings and DeprecationWarnings
    (about their own internals, called by peft) silenced, for the block."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    shown, hub_shown = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
        if hub_shown:
            enable_progress_bars()


def _export(folder: Path, base_model: str, merged: str | Path | None, adapter: str | Path | None,
            gguf: str | Path | None, dtype: str | None, gguf_type: str) -> Exported:
    model = tokenizer = None
    if merged is not None or gguf is not None:
        model, tokenizer = merged_model(folder, base_model)
    if gguf is not None:  # a GGUF rlvr would refuse is refused before anything is written
        check_architecture(model.config)
        gguf_tokenizer(tokenizer, model.config.model_type)
    if adapter is not None:
        write_adapter(folder, Path(adapter), base_model)
    if gguf is not None:  # from the float32 weights, before the merged folder casts them
        write_gguf(Path(gguf), model.config, tokenizer, model.state_dict(), _encoder(GGUF_TYPES[gguf_type]),
                   pad_vocab=True)
    if merged is not None:
        target_dtype = DTYPES[dtype] if dtype is not None else base_dtype(base_model)
        with atomic_folder(Path(merged), action="write merged model") as tmp:
            model.to(target_dtype).save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    return Exported(merged=Path(merged) if merged is not None else None,
                    adapter=Path(adapter) if adapter is not None else None,
                    gguf=Path(gguf) if gguf is not None else None)


def merged_model(folder: Path, base_model: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model (float32, on the CPU) with the adapter in checkpoint ``folder`` merged into its weights by
    peft, and its tokenizer. An output layer the adapter changes is untied from the embedding first."""
    from peft import PeftModel

    loaded = load_base_model(base_model, "cpu", torch.float32)
    model = loaded.model
    targets = json.loads((folder / "adapter_config.json").read_text()).get("target_modules") or []
    if "lm_head" in targets:
        _untie_output(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        peft_model = PeftModel.from_pretrained(model, str(folder))
        merged = peft_model.merge_and_unload()
    return merged, loaded.tokenizer


def _untie_output(model: PreTrainedModel) -> None:
    """Give the output layer its own copy of a weight it shares with the embedding, and say so in the config."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or head.weight.data_ptr() != embedding.weight.data_ptr():
        return
    head.weight = torch.nn.Parameter(embedding.weight.detach().clone(), requires_grad=False)
    model.config.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):  # transformers 5 drops tied keys from what it saves
        model.all_tied_weights_keys = {}


def write_adapter(folder: Path, target: Path, base_model: str) -> Path:
    """The checkpoint's adapter as a PEFT adapter folder at ``target`` (see the module docstring)."""
    with atomic_folder(target, action="write adapter") as tmp:
        shutil.copyfile(folder / "adapter_model.safetensors", tmp / "adapter_model.safetensors")
        write_adapter_config(folder / "adapter_config.json", tmp / "adapter_config.json", base_model)
    return target


def write_adapter_config(source: Path, target: Path, base_model: str) -> None:
    """A checkpoint's ``adapter_config.json`` (``source``) as other tools want it, written to ``target``: the base
    model named where they can find it (:func:`base_reference`), and the task a causal LM's."""
    config = json.loads(source.read_text())
    config["base_model_name_or_path"] = base_reference(base_model)
    config["task_type"] = "CAUSAL_LM"  # peft then loads it as PeftModelForCausalLM, as vLLM expects
    target.write_text(json.dumps(config, indent=2, sort_keys=True))


def base_reference(base_model: str) -> str:
    """How other tools find ``base_model``: its hub id where it has one, else a local Hugging Face folder (``tiny``
    saved once, a GGUF file's converted folder, the folder itself)."""
    name = canonical_name(base_model)
    if name in HUB_IDS:
        return HUB_IDS[name]
    return model_folder(name)


def base_dtype(base_model: str) -> torch.dtype:
    """The dtype the base model's own config states (float32 where it states none, and for GGUF files and ``tiny``,
    which rlvr holds in float32)."""
    name = canonical_name(base_model)
    if name == "tiny" or name.endswith(".gguf") or name in HUB_IDS:
        return torch.float32
    try:
        config = AutoConfig.from_pretrained(name)
    except OSError:
        return torch.float32
    stated = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stated, str):
        stated = DTYPES.get(stated)
    return stated if stated in DTYPES.values() else torch.float32


def _encoder(kind: GGMLQuantizationType) -> Encode:
    """How each tensor is stored in a GGUF file of matrices of type ``kind``."""
    import gguf

    def encode(name: str, values: np.ndarray) -> tuple[np.ndarray, GGMLQuantizationType]:
        if values.ndim == 1 or kind == GGMLQuantizationType.F32:
            return values, GGMLQuantizationType.F32
        chosen = kind
        if kind == GGMLQuantizationType.Q8_0 and values.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
            chosen = GGMLQuantizationType.F16
        return gguf.quants.quantize(values, chosen), chosen

    return encode


def _check_folder(field: str, target: Path, force: bool) -> None:
    if target.exists() and not target.is_dir():
        raise ConfigurationError(f"{field}={str(target)!r} is a file; give a folder to write the export into")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ConfigurationError(f"{field}={str(target)!r} exists and is not empty; choose a new folder, or pass "
                                 "force=True (CLI: --force) to replace it")


def _check_file(target: Path, force: bool) -> None:
    if target.is_dir():
        raise ConfigurationError(f"gguf={str(target)!r} is a folder; give a file name such as model.gguf")
    if target.exists() and not force:
        raise ConfigurationError(f"gguf={str(target)!r} exists; choose a new file name, or pass force=True "
                                 "(CLI: --force) to replace it")
