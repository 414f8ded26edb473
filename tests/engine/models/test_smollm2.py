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


def test_greedy_matches_hugging_face_generate_on_smollm2(service):
    sampler = service.create_sampling_client(base_model="smollm2-135m")
    tok = sampler.get_tokenizer()
    from rlvr.engine.models.load import load_base_model

    pristine = load_base_model("smollm2-135m").model  # a copy no adapter has touched (reloads in well under 1 s)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                  add_generation_prompt=True))
               for q in ("What is 2 + 3?", "Name a colour.")]
    params = types.SamplingParams(max_tokens=16, temperature=0.0, stop=[])
    futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
    for prompt, future in zip(prompts, futures, strict=True):
        with torch.inference_mode():
            out = pristine.generate(input_ids=torch.tensor([prompt]),
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
                                 max_new_tokens=16, pad_token_id=tok.pad_token_id, eos_token_id=None)
        assert future.result().sequences[0].tokens == out[0, len(prompt):].tolist()
