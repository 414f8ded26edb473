"""Exports of a trained checkpoint: a merged folder and a PEFT adapter that transformers and peft load to rlvr's own
logits, a GGUF file that reads back (gguf's reader, rlvr's loader, llama.cpp where installed), atomic writes and
errors that name the fix."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from datums import ce_datum
from rlvr import types
from rlvr.engine import checkpoint
from rlvr.engine import export as export_module
from rlvr.engine.export import export_checkpoint
from rlvr.engine.models.random_models import small_config, write_model_folder
from rlvr.errors import CheckpointNotFoundError, ConfigurationError

TOKENS = [5, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 257, 258, 3, 9]


def train(service, base_model: str, name: str, steps: int = 3):
    """A LoRA on ``base_model`` trained a few steps at a high rate (its update is far from zero), saved as
    ``name``; returns (client, state path)."""
    tc = service.create_lora_training_client(base_model=base_model, rank=4, seed=5)
    data = [ce_datum(TOKENS), ce_datum([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])]
    for _ in range(steps):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    return tc, tc.save_state(name).result().path


def rlvr_logprobs(service, tc, name: str) -> np.ndarray:
    """The trained weights' log-probabilities of TOKENS[1:], computed by rlvr's sampler."""
    path = tc.save_weights_for_sampler(name).result().path
    logprobs = service.create_sampling_client(model_path=path).compute_logprobs(
        types.ModelInput.from_ints(TOKENS)).result()
    return np.array(logprobs[1:], dtype=np.float64)


def hf_logprobs(model: torch.nn.Module) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits.float()[0, :-1]  # (T-1, V)
    logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(TOKENS[1:])[:, None])[:, 0]
    return logprobs.double().numpy()


@pytest.fixture(scope="module")
def trained(service):
    tc, path = train(service, "tiny", "export-me")
    return path, rlvr_logprobs(service, tc, "export-me-sampler")


def bpe_tokenizer():
    """A byte-level BPE tokenizer shaped as Qwen2's (a Split by its regex, merges, special and added tokens), trained
    on a few sentences."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlvr.engine.models.gguf_write import QWEN2_SPLIT

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    text = ["hello world, hello there", "the quick brown fox jumps over the lazy dog 12345", "héllo wörld"] * 20
    backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=
                                                          pre_tokenizers.ByteLevel.alphabet(),
                                                          special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                          "<|im_end|>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens(["<think>"])
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    return tokenizer


def base_logprobs(base_model: str = "tiny") -> np.ndarray:
    from rlvr.engine.models.load import load_base_model

    return hf_logprobs(load_base_model(base_model).model)


# --- merged folder -------------------------------------------------------------------------------------------------

def test_a_merged_folder_loads_in_transformers_to_rlvrs_logits(trained, tmp_path):
    path, expected = trained
    assert np.abs(expected - base_logprobs()).max() > 1e-2  # the adapter moved the model: the merge is not a no-op
    out = export_checkpoint(path, merged=tmp_path / "merged")
    assert out.merged == tmp_path / "merged"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    np.testing.assert_allclose(hf_logprobs(model), expected, atol=1e-4)
    files = {p.name for p in (tmp_path / "merged").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                                   tokenize=False, add_generation_prompt=True)
    # tiny ties its output layer to the embedding, and the LoRA changed the output layer alone
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["tie_word_embeddings"] is False


def test_the_test_fails_when_the_merge_is_skipped(trained, tmp_path, monkeypatch):
    path, expected = trained

    def unmerged(folder, base_model):
        from rlvr.engine.models.load import load_base_model

        loaded = load_base_model(base_model)
        return loaded.model, loaded.tokenizer

    monkeypatch.setattr(export_module, "merged_model", unmerged)
    export_checkpoint(path, merged=tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    assert np.abs(hf_logprobs(model) - expected).max() > 1e-2


def test_a_merged_folder_in_bfloat16_holds_the_float32_merge_rounded(trained, tmp_path):
    """Each bfloat16 weight is the float32 merge's, rounded (exact, whatever the CPU); a bfloat16 forward then differs
    from rlvr's float32 logprobs by that rounding and the bfloat16 kernels' own, which vary with the CPU (the Xeon's
    AMX and the EPYC's AVX512-BF16 round sums in different orders), so that part is only bounded loosely."""
    path, expected = trained
    export_checkpoint(path, merged=tmp_path / "f32")
    export_checkpoint(path, merged=tmp_path / "bf16", dtype="bfloat16")
    f32 = AutoModelForCausalLM.from_pretrained(tmp_path / "f32", dtype=torch.float32).state_dict()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16
    bf16 = model.state_dict()
    assert bf16.keys() == f32.keys()
    for name, weight in bf16.items():
        assert weight.dtype == torch.bfloat16 and torch.equal(weight, f32[name].bfloat16()), name
    logprobs = hf_logprobs(model)
    assert np.isfinite(logprobs).all()
    assert np.abs(logprobs - expected).mean() < 0.1 and np.abs(logprobs - expected).max() < 0.5


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_merged_folder_of_a_base_folder_keeps_its_dtype(service, tmp_path, arch):
    base = write_model_folder(small_config(arch), tmp_path / "base", seed=2, dtype=torch.bfloat16)
    tc, path = train(service, str(base), f"export-{arch}")
    expected = rlvr_logprobs(service, tc, f"export-{arch}-sampler")
    export_checkpoint(path, merged=tmp_path / "merged")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "merged").dtype == torch.bfloat16
    export_checkpoint(path, merged=tmp_path / "merged32", dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged32")
    np.testing.assert_allclose(hf_logprobs(model), expected, atol=1e-4)


# --- adapter -------------------------------------------------------------------------------------------------------

def test_an_adapter_loads_with_peft_onto_the_base_to_rlvrs_logits(trained, tmp_path):
    from peft import PeftModel

    path, expected = trained
    export_checkpoint(path, adapter=tmp_path / "lora")
    assert {p.name for p in (tmp_path / "lora").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    base_folder = Path(config["base_model_name_or_path"])
    assert (base_folder / "config.json").exists()  # tiny has no hub id: the folder rlvr saved it to
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, tmp_path / "lora")
    np.testing.assert_allclose(hf_logprobs(model), expected, atol=1e-4)


# --- GGUF ----------------------------------------------------------------------------------------------------------

def test_a_gguf_reads_back_with_the_types_written_and_loads_in_rlvr(service, trained, tmp_path):
    path, expected = trained
    out = export_checkpoint(path, gguf=tmp_path / "model.gguf")
    reader = gguf.GGUFReader(out.gguf)
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["output.weight"].tensor_type == gguf.GGMLQuantizationType.F16  # untied: the LoRA changed it
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert list(tensors["blk.2.ffn_down.weight"].shape) == [256, 96]  # gguf lists the shape fastest axis first
    assert len(tensors) == 2 + 1 + 3 * 9  # embedding, output, final norm; 7 matrices and 2 norms per layer
    # rlvr's own loader: base_model=<file.gguf>
    reloaded = service.create_sampling_client(base_model=str(out.gguf))
    logprobs = reloaded.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    np.testing.assert_allclose(np.array(logprobs[1:]), expected, atol=2e-2)
    tokenizer = reloaded.get_tokenizer()
    assert tokenizer.encode("héllo <|im_end|>", add_special_tokens=False) == \
        service.create_sampling_client(base_model="tiny").get_tokenizer().encode("héllo <|im_end|>",
                                                                              add_special_tokens=False)
    assert "<|im_start|>" in (tokenizer.chat_template or "")


def test_q8_0_dequantizes_close_to_the_merged_weights(trained, tmp_path):
    path, _ = trained
    export_checkpoint(path, gguf=tmp_path / "q8.gguf", gguf_type="q8_0")
    from rlvr.engine.export import merged_model

    folder, meta = checkpoint.read_meta(path)
    model, _ = merged_model(folder, meta["base_model"])
    weights = model.state_dict()
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "q8.gguf").tensors}
    for gguf_name, hf_name in (("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
                               ("output.weight", "lm_head.weight"), ("blk.0.attn_v.weight",
                                                                     "model.layers.0.self_attn.v_proj.weight")):
        tensor = tensors[gguf_name]
        assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        reference = weights[hf_name].numpy()
        assert values.shape == reference.shape
        assert np.abs(values - reference).max() <= np.abs(reference).max() / 127 + 1e-6


def test_greedy_tokens_equal_in_llama_cpp(service, tmp_path):
    """llama.cpp wants a BPE vocabulary's merges (the byte tokenizer has none), so the model here has a trained BPE
    tokenizer with Qwen2's split."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokenizer = bpe_tokenizer()
    config = small_config("qwen2", vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    base = write_model_folder(config, tmp_path / "base", seed=6)
    tokenizer.save_pretrained(base)
    _, path = train(service, str(base), "llama-cpp")
    export_checkpoint(path, gguf=tmp_path / "f32.gguf", gguf_type="f32", merged=tmp_path / "merged")
    prompt = tokenizer.encode("hello world, the quick", add_special_tokens=False)
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)[0, len(prompt):].tolist()
    llm = llama_cpp.Llama(str(tmp_path / "f32.gguf"), n_ctx=64, verbose=False)
    theirs = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
        theirs.append(token)
        if len(theirs) == len(ours):
            break
    assert theirs == ours


def test_a_tokenizer_that_is_not_byte_level_bpe_is_refused_naming_the_fix(trained, tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models

    path, _ = trained
    real = export_module.merged_model

    def sentencepiece_like(folder, base_model):
        model, tokenizer = real(folder, base_model)
        tokenizer._tokenizer = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
        return model, tokenizer

    monkeypatch.setattr(export_module, "merged_model", sentencepiece_like)
    with pytest.raises(ConfigurationError, match="not a byte-level BPE.*--merged.*convert_hf_to_gguf"):
        export_checkpoint(path, gguf=tmp_path / "model.gguf", adapter=tmp_path / "lora", merged=tmp_path / "m")
    assert list(tmp_path.iterdir()) == []  # refused before any of the three was written


# --- destinations and errors ---------------------------------------------------------------------------------------

def test_nothing_asked_for_is_an_error_naming_the_options(trained):
    with pytest.raises(ConfigurationError, match="merged=.*adapter=.*gguf="):
        export_checkpoint(trained[0])


def test_a_missing_checkpoint_is_an_error_naming_the_path(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="rlvr://nope/weights/x"):
        export_checkpoint("rlvr://nope/weights/x", adapter=tmp_path / "a")


def test_a_non_empty_destination_needs_force(trained, tmp_path):
    path, _ = trained
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigurationError, match="not empty.*--force"):
        export_checkpoint(path, adapter=tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    (tmp_path / "m.gguf").write_text("old")
    with pytest.raises(ConfigurationError, match="exists.*--force"):
        export_checkpoint(path, gguf=tmp_path / "m.gguf")
    export_checkpoint(path, adapter=tmp_path / "taken", force=True)
    assert not (tmp_path / "taken" / "keep.txt").exists()
    assert (tmp_path / "taken" / "adapter_model.safetensors").exists()


def test_a_failed_write_leaves_the_destination_as_it_was(trained, tmp_path, monkeypatch):
    path, _ = trained
    export_checkpoint(path, adapter=tmp_path / "lora")
    before = (tmp_path / "lora" / "adapter_config.json").read_text()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module.shutil, "copyfile", full_disk)
    with pytest.raises(OSError):
        export_checkpoint(path, adapter=tmp_path / "lora", force=True)
    assert (tmp_path / "lora" / "adapter_config.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora"]  # no temporary folder left beside it


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_a_gguf_of_each_architecture_loads_in_rlvr_to_the_merged_logits(service, tmp_path, arch):
    base = write_model_folder(small_config(arch), tmp_path / "base", seed=4)
    tc, path = train(service, str(base), f"gguf-{arch}")
    expected = rlvr_logprobs(service, tc, f"gguf-{arch}-sampler")
    export_checkpoint(path, gguf=tmp_path / "model.gguf", gguf_type="f32")
    assert gguf.GGUFReader(tmp_path / "model.gguf").get_field("general.architecture").contents() == arch
    reloaded = service.create_sampling_client(base_model=str(tmp_path / "model.gguf"))
    logprobs = reloaded.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    np.testing.assert_allclose(np.array(logprobs[1:]), expected, atol=1e-4)  # f32: the same weights


def test_a_bpe_tokenizer_with_merges_and_a_split_regex_reads_back_the_same(tmp_path):
    """Qwen2's tokenizer shape (a Split by its regex, byte-level BPE with merges, special and added tokens) written
    to GGUF encodes text as the original does when transformers reads it back."""
    from rlvr.engine.models.gguf_write import gguf_tokenizer, write_gguf
    from rlvr.engine.models.load import convert_gguf

    tokenizer = bpe_tokenizer()
    meta = gguf_tokenizer(tokenizer, "qwen2", vocab_size=len(tokenizer) + 3)
    assert meta["pre"] == "qwen2" and meta["merges"] and meta["tokens"][-1] == f"[PAD{len(tokenizer) + 2}]"
    config = small_config("qwen2", vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    state = AutoModelForCausalLM.from_config(config).state_dict()
    write_gguf(tmp_path / "bpe.gguf", config, tokenizer, state,
               lambda name, values: (values, gguf.GGMLQuantizationType.F32))
    back = AutoTokenizer.from_pretrained(convert_gguf(tmp_path / "bpe.gguf", tmp_path / "converted"))
    assert len(tokenizer.encode("hello world", add_special_tokens=False)) < 4  # the merges are used
    for sample in ["hello world, hello there!", "the lazy fox 123456 <think> héllo<|im_end|>", "  two  spaces\n"]:
        assert back.encode(sample, add_special_tokens=False) == tokenizer.encode(sample, add_special_tokens=False)


def test_the_pre_tokenizer_is_named_as_llama_cpp_names_it():
    from rlvr.engine.models.gguf_write import LLAMA3_SPLIT, _pre_tokenizer_name

    assert _pre_tokenizer_name({"type": "ByteLevel", "use_regex": True}) == "gpt-2"  # SmolLM2, GPT-2
    assert _pre_tokenizer_name({"type": "ByteLevel", "use_regex": False}) == "default"  # rlvr's byte tokenizer
    split = {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}}
    assert _pre_tokenizer_name({"type": "Sequence", "pretokenizers": [split, {"type": "ByteLevel",
                                                                                "use_regex": False}]}) == "llama-bpe"
    assert _pre_tokenizer_name({"type": "Metaspace"}) is None  # SentencePiece: refused


@pytest.mark.slow
def test_smollm2_exports_to_a_q8_0_gguf_with_its_tokenizer_and_an_adapter_naming_its_hub_id(service, tmp_path):
    """The embedded model end to end: SmolLM2's BPE vocabulary (49152 tokens, 48900 merges, GPT-2's split) and chat
    template go into the GGUF and come back; the Q8_0 file's logprobs are those of the trained model within Q8_0's
    error."""
    tc = service.create_lora_training_client(base_model="smollm2-135m", rank=4, seed=1)
    tokenizer = tc.get_tokenizer()
    tokens = tokenizer.encode("The capital of France is Paris. 12345 héllo")
    for _ in range(2):
        tc.forward_backward([ce_datum(tokens)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    path = tc.save_state("smollm2-export").result().path
    sampler = tc.save_weights_for_sampler("smollm2-export-sampler").result().path
    prompt = types.ModelInput.from_ints(tokens)
    expected = np.array(service.create_sampling_client(model_path=sampler).compute_logprobs(prompt).result()[1:])
    export_checkpoint(path, gguf=tmp_path / "smollm2.gguf", gguf_type="q8_0", adapter=tmp_path / "lora")
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    reloaded = service.create_sampling_client(base_model=str(tmp_path / "smollm2.gguf"))
    got = np.array(reloaded.compute_logprobs(prompt).result()[1:])
    assert np.abs(got - expected).mean() < 0.05
    back = reloaded.get_tokenizer()
    for text in ["The capital of France is Paris. 12345 héllo", "  x\n\ny <|im_start|>user\nhi<|im_end|>"]:
        assert back.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    chat = [{"role": "user", "content": "hi"}]
    assert back.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_a_gguf_written_with_a_bfloat16_folder_holds_the_float32_merge(trained, tmp_path):
    path, _ = trained
    export_checkpoint(path, gguf=tmp_path / "alone.gguf", gguf_type="f32")
    export_checkpoint(path, gguf=tmp_path / "with.gguf", gguf_type="f32", merged=tmp_path / "bf16", dtype="bfloat16")
    alone, with_folder = gguf.GGUFReader(tmp_path / "alone.gguf"), gguf.GGUFReader(tmp_path / "with.gguf")
    for a, b in zip(alone.tensors, with_folder.tensors, strict=True):
        assert a.name == b.name and np.array_equal(a.data, b.data)
