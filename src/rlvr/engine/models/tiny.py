"""The ``tiny`` base model: a randomly initialised Llama of ~300k parameters and a byte-level tokenizer.

It exists for tests and quick experiments: it needs no download, builds in milliseconds, and is the same model
every time (its weights come from a fixed seed), so a checkpoint trained on it reloads onto the same base.
It is not a language model in any useful sense: its outputs are noise until trained.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TINY_SEED = 0  # The tiny base weights are always drawn from this seed.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as SmolLM2 uses, so prompts render the same way on both models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per byte (256) plus three ChatML special tokens, no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(vocab_size: int) -> LlamaConfig:
    """Three layers of width 96: about 330k parameters."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        # Larger than the usual 0.02 so the random model has peaked, position-dependent outputs: LoRA on it
        # memorises a sequence in tens of steps, and sampler tests see non-uniform distributions.
        initializer_range=0.1,
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 3,
    )


def build_tiny_model() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The tiny model and its tokenizer; identical on every call."""
    tokenizer = build_tiny_tokenizer()
    config = tiny_config(len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    return model, tokenizer
