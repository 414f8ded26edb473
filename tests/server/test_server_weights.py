"""Weights out of ``rlvr serve``: tinker-cookbook's ``weights`` module downloads an external weights checkpoint (its
signed URLs: ``test_server_signed_urls.py``) and builds a PEFT adapter and a merged model from it that reproduce rlvr's
logprobs."""

from __future__ import annotations

import json
import sys
import types as pytypes

import numpy as np
import pytest
import tinker
import torch
from tinker import types

TOKENS = [5, 72, 101, 108, 108, 111, 257, 3]
DATUM = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]),
                    loss_fn_inputs={"target_tokens": types.TensorData(data=TOKENS[1:], dtype="int64"),
                                    "weights": types.TensorData(data=[1.0] * (len(TOKENS) - 1), dtype="float32")})


def trained_export(sdk, name: str, **lora):
    """A LoRA trained three steps through the SDK, saved with save_weights_external; (client, tinker path)."""
    tc = sdk.create_lora_training_client(base_model="tiny", rank=4, seed=7, **lora).result()
    for _ in range(3):
        tc.forward_backward([DATUM], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    return tc, tc.save_weights_external(name).result().path


def sampler_logprobs(tc) -> np.ndarray:
    sampler = tc.save_weights_and_get_sampling_client()
    return np.array(sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()[1:])


def hf_logprobs(model) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(TOKENS) - 1), torch.tensor(TOKENS[1:])].numpy()


@pytest.fixture(scope="module")
def rest(server):
    return tinker.RestClient(base_url=server.base_url, api_key=server.api_key)


@pytest.fixture
def cookbook_weights(server, monkeypatch):
    """tinker-cookbook's weights module, pointed at the test server. pyrage (age decryption, which only the download
    of a training checkpoint uses) is stood in for where it is not installed."""
    pytest.importorskip("tinker_cookbook")
    if "pyrage" not in sys.modules:
        try:
            import pyrage  # noqa: F401
        except ImportError:
            monkeypatch.setitem(sys.modules, "pyrage", pytypes.ModuleType("pyrage"))
    monkeypatch.setenv("TINKER_API_KEY", server.api_key)
    from tinker_cookbook import weights

    return weights


def test_the_cookbook_downloads_external_weights_and_builds_a_peft_adapter(server, sdk, cookbook_weights, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tc, path = trained_export(sdk, "cookbook-peft")
    expected = sampler_logprobs(tc)
    folder = cookbook_weights.download(tinker_path=path, output_dir=str(tmp_path / "download"),
                                       base_url=server.base_url)
    base = json.loads((tmp_path / "download" / "adapter_config.json").read_text())["base_model_name_or_path"]
    cookbook_weights.build_lora_adapter(base_model=base, adapter_path=folder, output_path=str(tmp_path / "peft"))
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                      tmp_path / "peft")
    np.testing.assert_allclose(hf_logprobs(model), expected, atol=1e-4)


def test_the_cookbook_builds_a_merged_model_from_downloaded_weights(server, sdk, cookbook_weights, tmp_path):
    """tiny ties its output layer to the embedding, and the cookbook merges an output layer's LoRA only into a
    separate lm_head; so this LoRA leaves the output layer alone (rlvr export --merged handles the tied case)."""
    from transformers import AutoModelForCausalLM

    tc, path = trained_export(sdk, "cookbook-merged", train_unembed=False)
    expected = sampler_logprobs(tc)
    folder = cookbook_weights.download(tinker_path=path, output_dir=str(tmp_path / "download"),
                                       base_url=server.base_url)
    base = json.loads((tmp_path / "download" / "adapter_config.json").read_text())["base_model_name_or_path"]
    cookbook_weights.build_hf_model(base_model=base, adapter_path=folder, output_path=str(tmp_path / "merged"),
                                    dtype="float32", merge_strategy="full")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    np.testing.assert_allclose(hf_logprobs(model), expected, atol=1e-4)
