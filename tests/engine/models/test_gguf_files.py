"""GGUF files in, for Llama 3, Qwen2 and Qwen3 (small random models written here with the ``gguf`` package, every
tensor type published files mix, K-quants included): each loads through ``base_model=<file.gguf>`` with the weights
the ``gguf`` package's own dequantization gives, the head width and RoPE scaling the file states (the logits equal
a Hugging Face model's built from the original config and those weights), the tokenizer and chat template, and
then trains and samples through the client; a type that cannot be read, or a tensor missing, is refused by name."""

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import rlvr
from datums import rl_datum
from rlvr import types
from rlvr.engine.models import load as models
from rlvr.engine.models.gguf_files import llama3_rope
from rlvr.engine.models.gguf_write import llama3_rope_factors
from rlvr.engine.models.load import convert_gguf, load_base_model
from rlvr.engine.models.random_models import (
    q4_k_m_type,
    small_config,
    write_gguf_file,
    write_model_folder,
)
from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ModelLoadError

T = GGMLQuantizationType
TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16,
         T.F32]
"""Every type the test files hold: the K-quants (and IQ4_NL, llama.cpp's stand-in for Q2_K and Q3_K on rows that
are not a multiple of 256 long), the older block types and the float ones."""

# Rows of 256 (the K-quants' block) wherever the shape allows; a head width of 16 under a width of 256 (4 heads:
# 64, not 256 / 4), so the file's attention.key_length must be read; each architecture with a RoPE scaling of its
# own: Llama 3's (a rope_freqs tensor in the file), YaRN and linear (rope.scaling.* keys).
SHAPE = {"hidden_size": 256, "intermediate_size": 256, "head_dim": 16}
ROPE = {
    "llama": {"rope_theta": 500000.0, "max_position_embeddings": 131072,
              "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}},
    "qwen2": {"max_position_embeddings": 4096,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}},
    "qwen3": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
}


def config_of(arch):
    return small_config(arch, **SHAPE, **ROPE[arch])


def every_type():
    """A tensor_type for write_gguf_file: each matrix gets the least used type whose block divides its rows."""
    used = dict.fromkeys(TYPES, 0)

    def pick(name, shape):
        if len(shape) == 1:
            return T.F32
        fits = [kind for kind in TYPES if shape[-1] % GGML_QUANT_SIZES[kind][0] == 0]
        kind = min(fits, key=lambda k: used[k])
        used[kind] += 1
        return kind

    return pick


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The three GGUF files, and an RLVR_HOME of their own for the converted folders."""
    root = tmp_path_factory.mktemp("gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLVR_HOME", str(root / "home"))
        yield {arch: write_gguf_file(config_of(arch), root / f"{arch}.gguf", seed=1, tensor_type=every_type())
               for arch in ROPE}


def from_hf_rows(weight, heads):
    """Undo llama.cpp's order of a Llama q or k projection's rows (convert_hf_to_gguf.py permutes each head's rows
    with ``reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2)``)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def reference_weights(path, config):
    """The file's weights as the gguf package dequantizes them, under the Hugging Face names."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[config.model_type.upper()], config.num_hidden_layers)
    hf_names = AutoModelForCausalLM.from_config(config).state_dict()
    to_hf = {names.get_name(n, try_suffixes=(".weight", ".bias")): n for n in hf_names}
    weights, kinds = {}, set()
    for tensor in gguf.GGUFReader(path).tensors:
        kinds.add(tensor.tensor_type)
        if tensor.name == "rope_freqs.weight":
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if config.model_type == "llama" and tensor.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in tensor.name else config.num_key_value_heads
            values = from_hf_rows(values, heads)
        weights[to_hf[tensor.name]] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return weights, kinds


@pytest.mark.parametrize("arch", sorted(ROPE))
def test_a_k_quant_gguf_loads_with_the_gguf_packages_dequantized_weights(files, arch):
    config = config_of(arch)
    expected, kinds = reference_weights(files[arch], config)
    assert kinds >= set(TYPES), sorted(k.name for k in set(TYPES) - kinds)
    loaded = load_base_model(str(files[arch]))
    model = loaded.model
    assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                    "qwen3": "Qwen3ForCausalLM"}[arch]
    state = model.state_dict()
    for name, weight in expected.items():
        assert torch.equal(state[name], weight), name
    assert config.tie_word_embeddings == model.config.tie_word_embeddings == ("lm_head.weight" not in expected)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
        assert getattr(model.config, key) == getattr(config, key), key

    # The head width and RoPE scaling came through: the logits are those of the original config's model with the
    # same weights, at positions where every rotary frequency has turned.
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    reference.load_state_dict(expected, strict=False)  # a tied output layer is the embedding
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    assert model.model.rotary_emb.attention_scaling == pytest.approx(reference.model.rotary_emb.attention_scaling)
    ids = torch.randint(0, config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-5)

    tokenizer, byte_tokenizer = loaded.tokenizer, build_tiny_tokenizer()
    assert tokenizer.chat_template == byte_tokenizer.chat_template
    text = "héllo <|im_end|> wörld\n  x"
    assert tokenizer.encode(text) == byte_tokenizer.encode(text)
    assert (tokenizer.eos_token, tokenizer.pad_token) == (byte_tokenizer.eos_token, byte_tokenizer.pad_token)


@pytest.mark.parametrize("arch", sorted(ROPE))
def test_a_float32_gguf_holds_the_drawn_model_as_its_folder_does(tmp_path, monkeypatch, arch):
    """The writer's side: names, Llama's row order and the output layer as llama.cpp lays them out, read back by
    transformers' own GGUF reader into exactly the weights write_model_folder saves for the same seed."""
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    config = config_of(arch)
    path = write_gguf_file(config, tmp_path / "f32.gguf", seed=3, tensor_type=lambda name, shape: T.F32)
    folder = write_model_folder(config, tmp_path / "folder", seed=3)
    from_file = load_base_model(str(path)).model.state_dict()
    from_folder = load_base_model(str(folder)).model.state_dict()
    assert from_file.keys() == from_folder.keys()
    assert all(torch.equal(from_file[k], from_folder[k]) for k in from_folder)


@pytest.mark.parametrize("arch", sorted(ROPE))
def test_a_k_quant_gguf_trains_and_samples_through_the_client(files, arch):
    training = rlvr.ServiceClient().create_lora_training_client(base_model=str(files[arch]), rank=4, seed=2)
    tokenizer = training.get_tokenizer()
    tokens = tokenizer.encode("a line for the adapter to learn")
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    before = training.parameters()
    loss = training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = training.parameters()
    assert np.isfinite(loss) and any(not torch.equal(before[k], after[k]) for k in before)

    sampler = training.save_weights_and_get_sampling_client()
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                                            add_generation_prompt=True))
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[])
    for seq in sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences:
        assert len(seq.tokens) == len(seq.logprobs) == 8
        out = training.forward([rl_datum(prompt, seq.tokens, seq.logprobs, 0.0)], "importance_sampling").result()
        trainer = out.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]
        assert float((trainer - torch.tensor(seq.logprobs)).abs().max()) < 1e-3


def test_a_type_the_gguf_package_cannot_dequantize_is_refused_naming_the_tensor_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    path = tmp_path / "q8k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, GGML_QUANT_SIZES[T.Q8_K][1]), dtype=np.uint8),
                      raw_dtype=T.Q8_K)  # ggml's intermediate type for dot products: gguf has no dequantization
    writer.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"tensor 'token_embd\.weight' is stored as Q8_K.*llama-quantize"):
        load_base_model(str(path))
    assert not (tmp_path / "home" / "models").exists() or not list((tmp_path / "home" / "models").iterdir())


def test_a_file_missing_a_tensor_is_refused_rather_than_filled_at_random(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    add_tensor = gguf.GGUFWriter.add_tensor

    def drop_one(self, name, *args, **kwargs):
        if name != "blk.1.ffn_up.weight":
            add_tensor(self, name, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_tensor", drop_one)
        path = write_gguf_file(small_config("qwen2"), tmp_path / "short.gguf")
    with pytest.raises(ModelLoadError, match=r"no weights for \['model\.layers\.1\.mlp\.up_proj\.weight'\]"):
        load_base_model(str(path))


def test_a_rope_scaling_key_rlvr_does_not_read_is_refused_rather_than_dropped(tmp_path, monkeypatch):
    """llama.cpp's YaRN attn_factor multiplies the attention scale YaRN computes, where transformers'
    attention_factor replaces it: rather than guess, the file is refused, naming the key."""
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    add_factor = gguf.GGUFWriter.add_rope_scaling_factor

    def with_attn_factor(self, value):
        add_factor(self, value)
        self.add_rope_scaling_attn_factors(0.8)

    with monkeypatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_rope_scaling_factor", with_attn_factor)
        path = write_gguf_file(config_of("qwen2"), tmp_path / "yarn.gguf")
    with pytest.raises(ModelLoadError, match=r"RoPE scaling 'yarn' \(factor 4\.0, qwen2\.rope\.scaling\.attn_factor\)"):
        load_base_model(str(path))


def test_a_gguf_conversion_is_written_whole_once_and_again_for_a_new_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    path = write_gguf_file(small_config("llama"), tmp_path / "m.gguf")
    cache = tmp_path / "home" / "models"
    conversions = []
    from_pretrained = AutoModelForCausalLM.from_pretrained

    def counted(*args, **kwargs):
        conversions.append(kwargs["gguf_file"])
        return from_pretrained(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as crash:
        crash.setattr(type(build_tiny_tokenizer()), "save_pretrained", disk_full)
        with pytest.raises(OSError, match="disk full"):
            convert_gguf(path)
    assert list(cache.iterdir()) == []  # neither a half-written folder nor a temporary one
    folder = convert_gguf(path)
    assert folder.parent == cache and (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    assert convert_gguf(path) == folder and conversions == ["m.gguf", "m.gguf"]  # converted once, then read back
    monkeypatch.setattr(models, "CONVERSION", models.CONVERSION + 1)  # what a fixed conversion does to the cache
    assert convert_gguf(path) != folder and len(conversions) == 3


@pytest.mark.parametrize("rope", [
    {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"factor": 16.0, "low_freq_factor": 0.5, "high_freq_factor": 8.0, "original_max_position_embeddings": 4096},
])
def test_llama3_rope_scaling_is_recovered_from_llama_cpps_factors(rope):
    """Llama 3.1-3.3's scalings and one with other edges: the parameters read back from llama.cpp's per-frequency
    factors give transformers' own Llama 3 frequencies, and factors of no Llama 3 scaling are refused."""
    config = small_config("llama", head_dim=128, hidden_size=512, rope_theta=500000.0,
                          max_position_embeddings=131072, rope_scaling={"rope_type": "llama3", **rope})
    factors = llama3_rope_factors(config).astype(np.float64)
    read = llama3_rope(factors, 500000.0, 128, "f.gguf")
    again = small_config("llama", head_dim=128, hidden_size=512, rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling=read)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    recovered, _ = ROPE_INIT_FUNCTIONS["llama3"](again, "cpu")
    torch.testing.assert_close(recovered, expected, rtol=1e-6, atol=0)
    assert llama3_rope(np.ones_like(factors), 500000.0, 128, "f.gguf") is None
    with pytest.raises(ModelLoadError, match="not a Llama 3 RoPE scaling"):
        llama3_rope(factors[::-1].copy(), 500000.0, 128, "f.gguf")


def test_the_default_mix_is_llama_cpps_q4_k_m_with_its_fallbacks():
    layers = 24  # more bits for attn_v and ffn_down in layers 0-2, 21-23 and every third between
    assert q4_k_m_type("blk.0.ffn_down.weight", (896, 4864), layers) == T.Q6_K
    assert q4_k_m_type("blk.4.ffn_down.weight", (896, 4864), layers) == T.Q4_K
    assert q4_k_m_type("blk.5.attn_v.weight", (128, 896), layers) == T.Q8_0  # Q6_K on rows of 896: Q8_0
    assert q4_k_m_type("blk.4.attn_q.weight", (896, 896), layers) == T.Q5_0  # Q4_K on rows of 896: Q5_0
    assert q4_k_m_type("blk.4.attn_q.weight", (2048, 1024), layers) == T.Q4_K
    assert q4_k_m_type("token_embd.weight", (151936, 1024), layers) == T.Q6_K
    assert q4_k_m_type("blk.4.attn_norm.weight", (896,), layers) == T.F32
