"""GGUF model files in: ``base_model=<file.gguf>`` converts the file once into a float32 Hugging Face folder (in
``$RLVR_HOME/models/``), which later loads read.

transformers reads the file: its GGUF loader takes the config, the tokenizer and the chat template from the metadata
and dequantizes every tensor with the ``gguf`` package, so every type that package dequantizes loads (F32, F16,
BF16, the legacy Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K to Q6_K, the IQ types...). Around it this module:

- refuses a file holding a tensor type the installed ``gguf`` cannot dequantize before any work, naming the
  tensor, its type and the fix;
- restores for Llama, Qwen2 and Qwen3 what transformers' reading of the metadata drops: the head width
  (``attention.key_length``; Qwen2 and Qwen3 would otherwise get hidden/heads or the config class's 128), and the
  RoPE scaling (llama.cpp stores Llama 3's as a ``rope_freqs`` tensor of per-frequency factors, linear and YaRN as
  ``rope.scaling.*`` keys), without which a model loads and runs with the wrong positions;
- refuses a conversion that leaves a weight of the model unread (transformers would start it from random values).

Not here: resolving ``base_model`` names and loading folders (``models.py``); writing GGUF files
(``gguf_write.py``; ``random_models.write_gguf_file`` writes test files with it).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from rlvr.errors import ModelLoadError
from rlvr.fileio import atomic_folder

CONVERSION = 2
"""Version of the conversion below, part of a converted folder's cache key (``models.convert_gguf``): a folder an
earlier version converted (version 1 dropped Llama 3's RoPE scaling) is converted again rather than reused."""

ARCHITECTURES = ("llama", "qwen2", "qwen3")
"""GGUF architectures whose metadata this module completes; others load as transformers reads them."""


def gguf_to_folder(path: Path, folder: Path) -> Path:
    """Convert GGUF file ``path`` into a float32 safetensors folder at ``folder`` (written whole or not at all).

    transformers loads GGUF weights dequantized but keeps the model marked as quantized, and a model so marked
    refuses training; the saved copy drops the marker, so it trains and reloads fast.
    """
    import gguf  # here, not at the top: every engine start would pay for it, most never read a GGUF

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise ModelLoadError(f"{path}: not a GGUF file the gguf package ({_version()}) can read ({exc}); "
                             "base_model= takes a GGUF model file, a Hugging Face model folder or a hub id") from exc
    check_tensor_types(reader, path)
    with _parsed_once(gguf, path, reader):
        config = gguf_config(reader, path)
        print(f"rlvr: converting {path.name} to a float32 safetensors folder at {folder} (once)", file=sys.stderr)
        model, info = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config,
                                                           dtype=torch.float32, output_loading_info=True)
        if info["missing_keys"]:
            raise ModelLoadError(f"{path}: the file holds no weights for {sorted(info['missing_keys'])[:6]} of "
                                 f"its {config.model_type} model, which would start from random values. Is the file "
                                 "complete (its download finished)? The model's Hugging Face folder loads too.")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    # Strip the quantization marker: the weights are already plain float32 tensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Replaces a folder there: one without config.json holds no model, and one another process converted meanwhile
    # holds the same.
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return folder


@contextlib.contextmanager
def _parsed_once(gguf: Any, path: Path, reader: Any) -> Iterator[None]:
    """While converting ``path``, ``gguf.GGUFReader(path)`` returns ``reader`` and ``gguf.get_tensor_name_map``
    remembers its answers: transformers parses the file anew for the config, the weights and the tokenizer, and
    builds the architecture's name map once per tensor (it imports both at each call). Parsing the metadata of a
    real vocabulary (SmolLM2's 49,152 tokens and their merges) takes seconds each time. Other files, and readers
    asked for with other arguments, are made as before."""
    made, name_map, resolved = gguf.GGUFReader, gguf.get_tensor_name_map, path.resolve()

    def reader_of(file: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and Path(file).resolve() == resolved:
            return reader
        return made(file, *args, **kwargs)

    gguf.GGUFReader, gguf.get_tensor_name_map = reader_of, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = made, name_map


def check_tensor_types(reader: Any, path: Path) -> None:
    """Raise ModelLoadError naming a tensor whose type the installed ``gguf`` package cannot dequantize."""
    unreadable = {kind for kind in {t.tensor_type for t in reader.tensors} if not _dequantizes(kind)}
    if unreadable:
        first = next(t for t in reader.tensors if t.tensor_type in unreadable)
        count = sum(t.tensor_type in unreadable for t in reader.tensors)
        raise ModelLoadError(
            f"{path}: tensor {first.name!r} is stored as {first.tensor_type.name}, a type the installed gguf package "
            f"({_version()}) cannot dequantize ({count} tensors of types {sorted(k.name for k in unreadable)}). "
            f"Upgrade it (`pip install -U gguf`) if a newer one reads {first.tensor_type.name}, or re-quantize the "
            "file to a type it reads (llama.cpp: `llama-quantize --allow-requantize IN.gguf OUT.gguf Q4_K_M`), or "
            "give the model's Hugging Face folder instead.")


def _dequantizes(kind: Any) -> bool:
    """Whether ``gguf.quants.dequantize`` reads tensors of type ``kind`` (tried on one zero block)."""
    import gguf

    block = np.zeros((1, gguf.GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
    try:
        gguf.quants.dequantize(block, kind)
    except NotImplementedError:
        return False
    return True


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown version"


def gguf_config(reader: Any, path: Path) -> PretrainedConfig:
    """The model config the file describes: transformers' reading of its metadata, completed for Llama, Qwen2 and
    Qwen3 with the head width and the RoPE scaling."""
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except ValueError as exc:  # e.g. "GGUF model with architecture X is not supported yet."
        raise ModelLoadError(f"{path}: transformers cannot build a model from this GGUF file ({exc}); give the "
                             "model's Hugging Face folder or hub id instead") from exc
    architecture = _field(reader, "general.architecture")
    if architecture not in ARCHITECTURES:
        return config
    values = config.to_dict()
    head_dim = _field(reader, f"{architecture}.attention.key_length")
    if head_dim is not None:
        values["head_dim"] = int(head_dim)
    rope = gguf_rope(reader, architecture, path, head_dim or config.hidden_size // config.num_attention_heads)
    if rope is not None:
        values["rope_parameters"] = {**values["rope_parameters"], **rope}
    return type(config).from_dict(values)


def gguf_rope(reader: Any, architecture: str, path: Path, head_dim: int) -> dict[str, Any] | None:
    """The RoPE scaling the file states, as transformers' ``rope_parameters`` entries (None: plain RoPE)."""
    scaling = _field(reader, f"{architecture}.rope.scaling.type")
    factors = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if factors is not None:
        if scaling not in (None, "none"):
            raise ModelLoadError(f"{path}: the file states RoPE scaling {scaling!r} and per-frequency factors "
                                 "(rope_freqs) both; rlvr reads one or the other. Give the model's Hugging Face "
                                 "folder instead.")
        theta = float(_field(reader, f"{architecture}.rope.freq_base") or 10000.0)
        return llama3_rope(np.asarray(factors.data, dtype=np.float64), theta, head_dim, path)
    if scaling in (None, "none"):
        return None
    factor = _field(reader, f"{architecture}.rope.scaling.factor")
    if scaling == "linear" and factor is not None:
        return {"rope_type": "linear", "factor": float(factor)}
    prefix = f"{architecture}.rope.scaling."
    unread = sorted(key for key in reader.fields if key.startswith(prefix) and key.removeprefix(prefix) not in
                    ("type", "factor", "original_context_length", "finetuned", "yarn_beta_fast", "yarn_beta_slow"))
    original = _field(reader, f"{prefix}original_context_length")
    if scaling == "yarn" and factor is not None and original is not None and not unread:
        yarn = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):  # the same in both
            if (value := _field(reader, f"{prefix}{key}")) is not None:
                yarn[name] = float(value)
        return yarn
    raise ModelLoadError(f"{path}: RoPE scaling {scaling!r} (factor {factor}{', ' if unread else ''}"
                         f"{', '.join(unread)}) is one rlvr does not read from GGUF metadata (it reads linear, YaRN "
                         "by factor and original context, and Llama 3's rope_freqs); give the model's Hugging Face "
                         "folder instead.")


def llama3_rope(factors: np.ndarray, theta: float, head_dim: int, path: Path) -> dict[str, Any] | None:
    """The Llama 3 RoPE scaling whose per-frequency factors are ``factors`` (llama.cpp's ``rope_freqs``: how much
    each rotary frequency is slowed), or None when none is slowed.

    llama.cpp keeps only the factors; transformers wants the four numbers they came from. The factor of the slowest
    frequencies is ``factor``; in between, ``1/f`` is linear in ``1/wavelength`` (Llama 3's smoothing), and any
    (low, high, original context) on that line gives the same factors: llama.cpp's defaults (1, 4, 8192) are tried,
    then the line through the smoothed frequencies. Whatever is returned reproduces ``factors``, or this raises."""
    if np.allclose(factors, 1.0):
        return None
    wavelength = 2 * math.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    if len(factors) != len(wavelength):
        raise ModelLoadError(f"{path}: rope_freqs holds {len(factors)} factors for a head width of {head_dim} "
                             f"({len(wavelength)} rotary frequencies)")
    factor = float(factors.max())
    candidates = [(1.0, 4.0, 8192)]
    smoothed = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6))
    if smoothed.sum() >= 2:
        slope, intercept = np.polyfit(1 / wavelength[smoothed], (1 / factors[smoothed] - 1 / factor) /
                                      (1 - 1 / factor), 1)  # smooth = (original / wavelength - low) / (high - low)
        if intercept < 0:  # low = 1: high = 1 - 1 / intercept, original = -slope / intercept
            candidates.append((1.0, float(1 - 1 / intercept), round(float(-slope / intercept))))
    for low, high, original in candidates:
        if np.allclose(_llama3_factors(wavelength, factor, low, high, original), factors, rtol=1e-4):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise ModelLoadError(f"{path}: its rope_freqs factors are not a Llama 3 RoPE scaling, the only kind rlvr reads "
                         "from them; give the model's Hugging Face folder instead.")


def _llama3_factors(wavelength: np.ndarray, factor: float, low: float, high: float, original: float) -> np.ndarray:
    """Llama 3's per-frequency slow-down factors (what llama.cpp stores as rope_freqs)."""
    smooth = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
    return 1 / ((1 - smooth) / factor + smooth)


def _field(reader: Any, key: str) -> Any:
    """A scalar or string metadata value of the file (None when absent)."""
    import gguf

    field = reader.get_field(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    return value.item()
