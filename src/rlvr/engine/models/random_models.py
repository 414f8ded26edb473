"""Randomly initialised models of real architectures (Llama 3, Qwen2 / Qwen2.5, Qwen3), written as Hugging Face
folders that ``base_model=<folder>`` loads: for tests and benchmarks, with no download.

Two sizes: ``small_config`` (a few hundred thousand parameters, the byte tokenizer's vocabulary: tests) and
``real_config`` (the published shapes and vocabularies of Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.2-1B and Qwen3-4B:
benchmarks). Either way the
folder holds ``tiny``'s byte tokenizer (``tiny.build_tiny_tokenizer``), whose ids all lie inside the model's
vocabulary; a real-size vocabulary has ids no text encodes to, which a random model samples all the same.

They are not language models: their outputs are noise until trained.
"""

from __future__ import annotations

from pathlib import Path

import torch
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
