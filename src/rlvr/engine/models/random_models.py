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

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

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
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[architecture.upper()], layers)
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_gguf_metadata(writer, config)
    for hf_name, tensor in state.items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # a tied output layer is the embedding: llama.cpp writes no output.weight
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigurationError(f"{hf_name}: no GGUF name for it in architecture {architecture!r}")
        values = tensor.numpy()
        if architecture == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            values = _llama_cpp_rows(values, heads)
        kind = pick(name, tuple(values.shape))
        if kind in RANDOM_BLOCKS:
            data = _random_blocks(kind, values.shape, float(values.std()), rng)
        else:
            try:
                data = gguf.quants.quantize(values, kind)
            except (NotImplementedError, gguf.quants.QuantError) as exc:
                raise ConfigurationError(f"{name}: cannot write type {kind.name} of shape {tuple(values.shape)} "
                                         f"({exc})") from exc
        writer.add_tensor(name, data, raw_dtype=kind)
    if (factors := llama3_rope_factors(config)) is not None:
        writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _write_gguf_metadata(writer: Any, config: PretrainedConfig) -> None:
    """The model's shape and the byte tokenizer under llama.cpp's keys."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_vocab_size(config.vocab_size)  # past the byte tokenizer's 259 tokens in a real shape
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.rope_parameters
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type", "default") in ("linear", "yarn"):  # llama3's goes in a tensor (llama3_rope_factors)
        writer.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        writer.add_rope_scaling_factor(rope["factor"])
        if rope["rope_type"] == "yarn":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif rope.get("rope_type", "default") not in ("default", "llama3"):
        raise ConfigurationError(f"rope_type={rope['rope_type']!r}: GGUF files are written with default, linear, "
                                 "yarn or llama3 RoPE")
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    tokenizer = build_tiny_tokenizer()
    tokens = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    # The byte tokenizer has no merges, and GGUF cannot hold an empty list: readers then derive the merges from the
    # scores (which yield none here).
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)


def _llama_cpp_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a Llama q or k projection's rows: each head's two rotary halves interleaved
    (convert_hf_to_gguf.py's ``LlamaModel.permute``)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


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


def llama3_rope_factors(config: PretrainedConfig) -> np.ndarray | None:
    """llama.cpp's ``rope_freqs`` for a Llama 3 RoPE scaling (None for other RoPE): per rotary frequency, the
    factor its wavelength is stretched by (convert_hf_to_gguf.py's ``LlamaModel.generate_extra_tensors``)."""
    rope = config.rope_parameters
    if rope.get("rope_type") != "llama3":
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
