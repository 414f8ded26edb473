"""The real embedded model through the client API (slow: ~135M parameters on a CPU)."""

import pytest
import torch

from datums import rl_datum
from rlvr import types

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(service):
    return service.create_lora_training_client(base_model="smollm2-135m", rank=8, seed=0)


def test_sampler_and_trainer_agree_on_smollm2(smol):
    tok = smol.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], tokenize=False,
                                     add_generation_prompt=True)
    prompt_tokens = tok.encode(prompt)
    sampler = smol.save_weights_and_get_sampling_client()
    result = sampler.sample(types.ModelInput.from_ints(prompt_tokens), 4,
                            types.SamplingParams(max_tokens=24, temperature=1.0, seed=0)).result()
    data = [rl_datum(prompt_tokens, s.tokens, s.logprobs, 0.0) for s in result.sequences]
    out = smol.forward(data, "importance_sampling").result()
    diffs = [
        (o["logprobs"].to_torch()[len(prompt_tokens) - 1:] - torch.tensor(s.logprobs)).abs()
        for o, s in zip(out.loss_fn_outputs, result.sequences, strict=True)
    ]
    assert torch.cat(diffs).mean().item() < 1e-3


def test_smollm2_trains(smol):
    tok = smol.get_tokenizer()
    prompt = tok.encode("<|im_start|>user\nSay yes<|im_end|>\n<|im_start|>assistant\n")
    target = tok.encode("yes")
    before = smol.forward([rl_datum(prompt, target, [0.0] * len(target), 0.0)], "importance_sampling").result()
    lp = before.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]
    smol.forward_backward([rl_datum(prompt, target, lp.tolist(), 1.0)], "importance_sampling")
    metrics = smol.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics
    assert metrics["grad_norm:mean"] > 0
    after = smol.forward([rl_datum(prompt, target, [0.0] * len(target), 0.0)], "importance_sampling").result()
    assert after.loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:].sum() > lp.sum()
