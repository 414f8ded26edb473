"""The seed documents' Tinker examples run as written against rlvr (read from ../shared/seeds at test time)."""

import re
from pathlib import Path

import pytest
import torch

import rlvr
from rlvr import types

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"


def seed_text(marker: str) -> str:
    if not SEEDS.is_dir():
        pytest.skip(f"seed documents not found at {SEEDS}")
    for path in sorted(SEEDS.glob("*.txt")):
        text = path.read_text()
        if marker in text:
            return text
    pytest.skip(f"no seed document contains {marker!r}")


def code_block(text: str, marker: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if marker in block:
            return block
    pytest.fail(f"no python block with {marker!r}")


def test_quick_reference_card_datum_and_ppo_update(service):
    # The card builds Datums from plain lists and trains with ppo and its clip config; run those blocks verbatim.
    text = seed_text("RL for LLMs: Quick Reference Card")
    build = code_block(text, "datums = []")
    update = code_block(text, 'loss_fn="ppo"')
    training_client = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    sampling_client = training_client.save_weights_and_get_sampling_client("card")
    prompt = types.ModelInput.from_ints(training_client.get_tokenizer().encode("Write code:"))
    result = sampling_client.sample(prompt=prompt, num_samples=4,
                                    sampling_params=types.SamplingParams(max_tokens=8, temperature=0.8)).result()
    advantages = [1.0, -1.0, 0.5, -0.5]
    scope = {"types": types, "result": result, "advantages": advantages, "prompt": prompt,
             "training_client": training_client}
    exec(build, scope)
    # The card's datum gives per-completion-token lists; rlvr needs them aligned to model_input, so pad the prompt.
    ob_len = prompt.length - 1
    scope["datums"] = [
        types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"],
            "logprobs": [0.0] * ob_len + d.loss_fn_inputs["logprobs"].tolist(),
            "advantages": [0.0] * ob_len + d.loss_fn_inputs["advantages"].tolist(),
        })
        for d in scope["datums"]
    ]
    before = training_client.parameters()
    exec(update, scope)
    # On-policy, every ratio is 1 (to float rounding), so PPO's loss is -sum_i len_i * A_i: checked by hand, and a
    # value the card's blocks only reach with the right alignment. (It can be 0 when the lengths are equal.)
    expected = -sum(len(seq.tokens) * a for seq, a in zip(result.sequences, advantages, strict=True))
    assert scope["fwd_bwd"].result().metrics["loss:sum"] == pytest.approx(expected, abs=1e-3)
    scope["optim"].result()
    after = training_client.parameters()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the card's optim_step moved the weights


def test_card_datum_without_padding_is_refused_clearly(service):
    # As printed, the card's datum has fewer advantages than tokens: rlvr says so instead of guessing.
    text = seed_text("RL for LLMs: Quick Reference Card")
    build = code_block(text, "datums = []")
    training_client = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    sampler = training_client.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([5, 6, 7])
    result = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4)).result()
    scope = {"types": types, "result": result, "advantages": [1.0, -1.0], "prompt": prompt}
    exec(build, scope)
    with pytest.raises(rlvr.InvalidDatumError, match="entries but model_input has"):
        training_client.forward_backward(scope["datums"], "ppo").result()
