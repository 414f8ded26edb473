"""Base-model loading: tiny is deterministic and small; unknown names fail clearly; the embedded model (slow)."""

import pytest
import torch

from rlvr.engine.models import SMOLLM2, load_base_model
from rlvr.errors import ModelLoadError


def test_tiny_is_small_deterministic_and_has_a_chat_template():
    a, b = load_base_model("tiny"), load_base_model("tiny")
    n = sum(p.numel() for p in a.model.parameters())
    assert 100_000 < n < 1_000_000
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))
    text = a.tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert a.tokenizer.decode(a.tokenizer.encode("héllo, wörld")) == "héllo, wörld"
    assert not any(p.requires_grad for p in a.model.parameters())


def test_unknown_names_and_bad_folders_fail_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="neither a known name"):
        load_base_model("no-such-org/no-such-model")
    with pytest.raises(ModelLoadError, match="folder without config.json"):
        load_base_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_base_model(str(tmp_path / "missing.gguf"))


@pytest.mark.slow
def test_smollm2_loads_as_plain_float32_with_its_chat_template():
    loaded = load_base_model(SMOLLM2)
    n = sum(p.numel() for p in loaded.model.parameters())
    assert n == pytest.approx(134.5e6, rel=0.001)
    assert loaded.model.dtype == torch.float32
    assert not getattr(loaded.model, "is_quantized", False)
    assert getattr(loaded.model.config, "quantization_config", None) is None
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                add_generation_prompt=True)
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert load_base_model("HuggingFaceTB/SmolLM2-135M-Instruct").name == SMOLLM2
