"""Randomly initialised models of real architectures (Llama 3, Qwen2 / Qwen2.5, Qwen3), written as Hugging Face
folders or GGUF files that ``base_model=<folder or file>`` loads: for tests and benchmarks, with no download.

Two sizes: ``small_config`` (a few hundred thousand parameters, the byte tokenizer's vocabulary: tests) and
``real_config`` (the published shapes and vocabularies of Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.2-1B and Qwen3-4B:
benchmarks). Either way the
folder holds ``tiny``'s byte tokenizer (``tiny.build_tiny_tokenizer``), whose ids all lie inside the model's
vocabulary; a real-size vocabulary has ids no text encodes to, which a random model samples all the same.

A GGUF file (:func:`write_gguf_file`) is laid out as llama.cpp's converter writes one and mixes tensor types as a
published file does (default: llama.cpp's Q4_K_M mix), K-quants included.

They are not language models: their outputs are noise until trained.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

from rlvr.engine.models.gguf_write import write_gguf
from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ConfigurationError

ARCHITECTURES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
REAL_SHAPES: dict[str, tuple[str, dict]] = {
    # Qwen/Qwen2.5-0.5B-Instruct's config.json (Qwen2: biases on q, k and v)
    "qwen2.5-0.5b": ("qwen2", {
        "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}),
    # Qwen/Qwen3-0.6B's config.json (Qwen3: q and k norms, head_dim 128 over a 1024-wide model)
    "qwen3-0.6b": ("qwen3", {
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}),
    # meta-llama/Llama-3.2-1B's config.json
    "llama-3.2-1b": ("llama", {
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}),
    # Qwen/Qwen3-4B's config.json
    "qwen3-4b": ("qwen3", {
        "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}),
}


def _ids() -> dict[str, int]:
    tokenizer = build_tiny_tokenizer()
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def small_config(architecture: str, **overrides: object) -> PretrainedConfig:
    """A two-layer model of ``architecture`` ("llama", "qwen2" or "qwen3") over the byte tokenizer's vocabulary,
    with outputs peaked enough that LoRA learns on it in a few steps (``tiny``'s initialiser range)."""
    if architecture not in ARCHITECTURES:
        raise ConfigurationError(f"architecture={architecture!r}: choose one of {sorted(ARCHITECTURES)}")
    shape = {"vocab_size": len(build_tiny_tokenizer()), "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "max_position_embeddings": 1024, "tie_word_embeddings": architecture != "qwen2",
             "initializer_range": 0.1, **_ids()}
    return ARCHITECTURES[architecture](**{**shape, **overrides})


def real_config(name: str) -> PretrainedConfig:
    """The published shape of ``name`` (a key of ``REAL_SHAPES``), with the byte tokenizer's special ids."""
    if name not in REAL_SHAPES:
        raise ConfigurationError(f"model shape {name!r}: choose one of {sorted(REAL_SHAPES)}")
    architecture, shape = REAL_SHAPES[name]
    return ARCHITECTURES[architecture](**shape, **_ids())


def write_model_folder(config: PretrainedConfig, folder: str | Path, seed: int = 0,
                       dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Path:
    """Build a model of ``config`` with weights drawn from ``seed`` (on ``device``: a GPU draws billions of them
    fast) and write it, in ``dtype``, with the byte tokenizer to ``folder``; returns the folder."""
    folder = Path(folder)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder, safe_serialization=True)
    build_tiny_tokenizer().save_pretrained(folder)
    return folder


# --- GGUF files -------------------------------------------------------------------------------------------------

RANDOM_BLOCKS = {  # type -> byte offsets in its block of the float16 scale d and min scale dmin (None: no min)
    # ggml's block layouts (ggml-common.h): block_q2_K {scales[16], qs[64], d, dmin}, block_q3_K {hmask[32], qs[64],
    # scales[12], d}, block_q4_K {d, dmin, scales[12], qs[128]}, block_q5_K {d, dmin, scales[12], qh[32], qs[128]},
    # block_q6_K {ql[128], qh[64], scales[16], d}, block_iq4_nl {d, qs[16]}
    GGMLQuantizationType.Q2_K: (80, 82),
    GGMLQuantizationType.Q3_K: (108, None),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208, None),
    GGMLQuantizationType.IQ4_NL: (0, None),
}
"""The types the ``gguf`` package cannot quantize that :func:`write_gguf_file` writes as random blocks."""
K_FALLBACK = {  # what llama.cpp's quantizer stores instead when a row does not split into 256-value blocks
    GGMLQuantizationType.Q2_K: GGMLQuantizationType.IQ4_NL, GGMLQuantizationType.Q3_K: GGMLQuantizationType.IQ4_NL,
    GGMLQuantizationType.Q4_K: GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_K: GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q6_K: GGMLQuantizationType.Q8_0,
}


def q4_k_m_type(name: str, shape: tuple[int, ...], layers: int) -> GGMLQuantizationType:
    """The type llama.cpp's Q4_K_M mix gives GGUF tensor ``name`` of ``shape`` (rows, columns) in a model of
    ``layers`` blocks: Q6_K for the embedding and output and for attn_v and ffn_down in the layers that get more
    bits (the first and last eighth, every third between), Q4_K elsewhere; vectors F32; K types fall back to
    legacy ones (Q4_K -> Q5_0, Q6_K -> Q8_0) on rows that are not a multiple of 256 long, as llama.cpp's do."""
    if len(shape) == 1:
        return GGMLQuantizationType.F32
    kind = GGMLQuantizationType.Q4_K
    if name.startswith(("token_embd.", "output.")):
        kind = GGMLQuantizationType.Q6_K
    elif name.endswith((".attn_v.weight", ".ffn_down.weight")):
        layer = int(name.split(".")[1])
        if layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2:
            kind = GGMLQuantizationType.Q6_K
    block = GGML_QUANT_SIZES[kind][0]
    return kind if shape[-1] % block == 0 else K_FALLBACK[kind]


def write_gguf_file(config: PretrainedConfig, path: str | Path, seed: int = 0,
                    tensor_type: Callable[[str, tuple[int, ...]], GGMLQuantizationType] | None = None) -> Path:
    """Write a model of ``config`` (Llama, Qwen2 or Qwen3) with weights drawn from ``seed`` as a GGUF file laid out
    as llama.cpp's converter lays one out: its tensor names, Llama's q and k rows in llama.cpp's order, RoPE scaling
    as ``rope.scaling.*`` keys (linear, YaRN) or a ``rope_freqs`` tensor (Llama 3's), and the byte tokenizer with its
    chat template as metadata.
    ``tensor_type(gguf_name, shape)`` picks each tensor's type (default: :func:`q4_k_m_type`).

    Float and legacy types (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) hold the drawn weights, quantized by the
    ``gguf`` package. The K types (Q2_K to Q6_K) and IQ4_NL, which that package cannot quantize, hold random blocks
    instead (``RANDOM_BLOCKS``): random bits, with the scales of each block set so that the weights spread as the
    drawn ones do (the model is random either way). Other types are refused. Read the file's weights back with
    ``gguf.GGUFReader`` and ``gguf.quants.dequantize``."""
    architecture = config.model_type
    if architecture not in ARCHITECTURES:
        raise ConfigurationError(f"config.model_type={architecture!r}: GGUF files are written for "
                                 f"{sorted(ARCHITECTURES)}")
    layers = config.num_hidden_layers
    pick = tensor_type or (lambda name, shape: q4_k_m_type(name, shape, layers))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        state = AutoModelForCausalLM.from_config(config, dtype=torch.float32).state_dict()
    rng = np.random.default_rng(seed)

    def encode(name: str, values: np.ndarray) -> tuple[np.ndarray, GGMLQuantizationType]:
        kind = pick(name, tuple(values.shape))
        if kind in RANDOM_BLOCKS:
            return _random_blocks(kind, values.shape, float(values.std()), rng), kind
        try:
            return gguf.quants.quantize(values, kind), kind
        except (NotImplementedError, gguf.quants.QuantError) as exc:
            raise ConfigurationError(f"{name}: cannot write type {kind.name} of shape {tuple(values.shape)} "
                                     f"({exc})") from exc

    return write_gguf(path, config, build_tiny_tokenizer(), state, encode)


def _random_blocks(kind: GGMLQuantizationType, shape: tuple[int, ...], spread: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Random ``kind`` blocks for a tensor of ``shape``, as bytes ``(rows, row bytes)``: random bits, then every
    block's float16 scales set to one value chosen so the weights have standard deviation about ``spread``."""
    block, size = GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(int(np.prod(shape)) // block, size), dtype=np.uint8)
    d, dmin = RANDOM_BLOCKS[kind]

    def with_scales(scale: float, minimum: float) -> np.ndarray:
        out = blocks.copy()
        out[:, d:d + 2] = np.array([scale], dtype=np.float16).view(np.uint8)
        if dmin is not None:
            out[:, dmin:dmin + 2] = np.array([minimum], dtype=np.float16).view(np.uint8)
        return out

    # The weights are linear in (d, dmin): measure each part at scale 1, then centre them and set their spread.
    scaled = gguf.quants.dequantize(with_scales(1.0, 0.0), kind)
    minimum = 0.0
    if dmin is not None:
        mins = gguf.quants.dequantize(with_scales(0.0, 1.0), kind)  # -m of each sub-block
        minimum = float(scaled.mean() / -mins.mean())
        scaled = scaled + minimum * mins
    scale = spread / float(scaled.std())
    return with_scales(scale, minimum * scale).reshape(shape[0], -1)
