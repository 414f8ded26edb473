"""GGUF model files out: a Llama, Qwen2 or Qwen3 model's weights, shape and tokenizer written as llama.cpp's converter
(``convert_hf_to_gguf.py``) lays them out, so llama.cpp, Ollama and rlvr's own loader (``gguf_files.py``) read them.

- Tensor names are Hugging Face's mapped through the ``gguf`` package's own table (the inverse of what
  ``gguf_files.py`` reads back); Llama's q and k rows are put in llama.cpp's rotary order; a tied output layer is not
  written (llama.cpp reuses the embedding); Llama 3's RoPE scaling becomes a ``rope_freqs`` tensor, linear and YaRN
  ``rope.scaling.*`` keys.
- The tokenizer is written for byte-level BPE vocabularies (GPT-2's alphabet: Qwen2/Qwen3, Llama 3, SmolLM2, rlvr's
  byte tokenizer): tokens, merges, token types, special ids, the pre-tokenizer's name and the chat template.
  A tokenizer of another kind (SentencePiece, as Llama 2 has) is refused, naming the fix, rather than written in a
  form that would split text differently. A vocabulary without merges (rlvr's byte tokenizer, one token per byte) is
  written with scores instead, as GGUF holds no empty list: transformers and rlvr read it, llama.cpp does not (it
  wants the merges of a BPE vocabulary).

Not here: which type each tensor gets and how it is quantized beyond the ``gguf`` package's quantizer (the callers:
``random_models.write_gguf_file`` for test files, ``engine.export`` for trained models), reading GGUF files
(``gguf_files.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from rlvr.errors import ConfigurationError
from rlvr.fileio import atomic_file

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

ARCHITECTURES = ("llama", "qwen2", "qwen3")
"""``config.model_type`` values written (those ``gguf_files.py`` completes when it reads them back)."""

Encode = Callable[[str, np.ndarray], tuple[np.ndarray, GGMLQuantizationType]]
"""``encode(gguf_name, float32 values)`` -> (the bytes or values to store, their type)."""


def write_gguf(path: str | Path, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase,
               state: Mapping[str, torch.Tensor], encode: Encode, pad_vocab: bool = False) -> Path:
    """Write the model ``state`` (Hugging Face names) of ``config`` with ``tokenizer`` to GGUF file ``path``, each
    tensor stored as ``encode`` says; written to a temporary file beside ``path`` and renamed, so ``path`` is whole
    or absent. ``pad_vocab``: list placeholder tokens up to ``config.vocab_size`` (llama.cpp wants one token per
    embedding row, as its converter writes them)."""
    check_architecture(config)
    tokens = gguf_tokenizer(tokenizer, config.model_type, config.vocab_size if pad_vocab else None)
    with atomic_file(path) as temp:
        writer = gguf.GGUFWriter(str(temp), config.model_type)
        write_metadata(writer, config, tokens)
        for name, values in gguf_tensors(state, config):
            data, kind = encode(name, values)
            writer.add_tensor(name, data, raw_dtype=kind)
        if (factors := llama3_rope_factors(config)) is not None:
            writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(path)


def check_architecture(config: PretrainedConfig) -> None:
    if config.model_type not in ARCHITECTURES:
        raise ConfigurationError(f"config.model_type={config.model_type!r}: GGUF files are written for "
                                 f"{list(ARCHITECTURES)}; for another model write a Hugging Face folder (--merged) "
                                 "and convert it with llama.cpp's convert_hf_to_gguf.py")


def gguf_tensors(state: Mapping[str, torch.Tensor], config: PretrainedConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 values in llama.cpp's layout) of each tensor of ``state``."""
    architecture = config.model_type
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[architecture.upper()], config.num_hidden_layers)
    for hf_name, tensor in state.items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # a tied output layer is the embedding: llama.cpp writes no output.weight
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigurationError(f"{hf_name}: no GGUF name for it in architecture {architecture!r}")
        values = tensor.detach().to("cpu", torch.float32).numpy()
        if architecture == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            values = llama_cpp_rows(values, heads)
        yield name, values


def write_metadata(writer: Any, config: PretrainedConfig, tokens: dict[str, Any]) -> None:
    """The model's shape under llama.cpp's keys, and the tokenizer ``tokens`` (:func:`gguf_tokenizer`)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_vocab_size(config.vocab_size)
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
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tokens["pre"])
    writer.add_token_list(tokens["tokens"])
    writer.add_token_types(tokens["types"])
    if tokens["merges"]:
        writer.add_token_merges(tokens["merges"])
    else:  # GGUF cannot hold an empty list: readers then derive the merges from the scores (none here)
        writer.add_token_scores([0.0] * len(tokens["tokens"]))
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("pad", writer.add_pad_token_id)):
        if tokens[key] is not None:
            add(tokens[key])
    writer.add_add_bos_token(tokens["add_bos"])
    if tokens["chat_template"]:
        writer.add_chat_template(tokens["chat_template"])


PRE_TOKENIZERS = {QWEN2_SPLIT: "qwen2", LLAMA3_SPLIT: "llama-bpe"}
"""The Split regex a tokenizer.json states -> llama.cpp's name for it (``tokenizer.ggml.pre``)."""


def gguf_tokenizer(tokenizer: PreTrainedTokenizerBase, architecture: str, vocab_size: int | None = None
                   ) -> dict[str, Any]:
    """A byte-level BPE tokenizer as GGUF metadata: tokens by id (padded with ``[PAD<id>]`` placeholders up to
    ``vocab_size`` when given), their types, merges, special ids, the pre-tokenizer's llama.cpp name and the chat
    template. Any other tokenizer is refused with a ConfigurationError naming the fix."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    model = spec.get("model") or {}
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"))
    if model.get("type") != "BPE" or pre is None:
        raise ConfigurationError(
            f"the {architecture} model's tokenizer ({type(tokenizer).__name__}, model {model.get('type')!r}, "
            f"pre-tokenizer {_describe(spec.get('pre_tokenizer'))}) is not a byte-level BPE tokenizer rlvr writes to "
            "GGUF (Qwen2/Qwen3's, Llama 3's, GPT-2's); write a Hugging Face folder instead (--merged DIR) and "
            "convert it with llama.cpp's convert_hf_to_gguf.py, which knows more tokenizers")
    vocab = dict(model["vocab"])
    special = set()
    user_defined = set()
    for added in spec.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
        (special if added.get("special") else user_defined).add(added["content"])
    size = max(vocab_size or 0, max(vocab.values()) + 1)
    tokens: list[str | None] = [None] * size
    for token, index in vocab.items():
        tokens[index] = token
    types = []
    for index, token in enumerate(tokens):
        if token is None:
            tokens[index] = f"[PAD{index}]"
            types.append(gguf.TokenType.UNUSED)
        elif token in special:
            types.append(gguf.TokenType.CONTROL)
        elif token in user_defined:
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre,
            "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id,
            "add_bos": bool(probe) and probe[0] == tokenizer.bos_token_id and tokenizer.bos_token_id is not None,
            "chat_template": tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None}


def _pre_tokenizer_name(pre: dict | None) -> str | None:
    """llama.cpp's name for a tokenizer.json pre-tokenizer: a byte-level one alone (``gpt-2``: GPT-2's split, as
    SmolLM2's; ``default`` when it splits nothing, as rlvr's byte tokenizer, whose one token per byte any split
    leaves alone), or after a Split by a known regex; None for anything else."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel":
        return "gpt-2" if pre.get("use_regex", True) else "default"
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel" \
            and not steps[1].get("use_regex", True):
        return PRE_TOKENIZERS.get((steps[0].get("pattern") or {}).get("Regex"))
    return None


def _describe(pre: dict | None) -> str:
    if pre is None:
        return "none"
    if pre.get("type") == "Sequence":
        return "+".join(step.get("type", "?") for step in pre.get("pretokenizers") or [])
    return str(pre.get("type"))


def llama_cpp_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a Llama q or k projection's rows: each head's two rotary halves interleaved
    (convert_hf_to_gguf.py's ``LlamaModel.permute``)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


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
