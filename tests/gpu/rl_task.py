"""A task a random model learns in a few RL steps, and a loop that trains on it through the client API only.

The task: answer with the letter "a". Reward: the fraction of the first ``MAX_TOKENS`` sampled tokens that are "a"
(a random model over the byte vocabulary gets ~1/259). The loop is GRPO's: ``GROUP`` samples per prompt, advantages
centred on the group's mean reward, the importance-sampling loss on the sampled tokens.
"""

from __future__ import annotations

from rlvr import types

PROMPTS = ["say a", "a please", "the letter a", "aaa?"]
GROUP = 16
MAX_TOKENS = 6


def reward(tokens: list[int], target: int) -> float:
    return sum(t == target for t in tokens) / MAX_TOKENS


def run(service, base_model: str, steps: int, learning_rate: float = 2e-2, seed: int = 0) -> list[float]:
    """Mean reward of each step's samples (before that step's update)."""
    tc = service.create_lora_training_client(base_model=base_model, rank=8, seed=seed)
    tok = tc.get_tokenizer()
    target = tok.encode("a")[0]
    prompts = [tok.encode(p) for p in PROMPTS]
    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, stop=[])
    rewards = []
    for step in range(steps):
        sampler = tc.save_weights_and_get_sampling_client()
        futures = [sampler.sample(types.ModelInput.from_ints(p), GROUP,
                                  params.model_copy(update={"seed": seed + 1000 * step + i}))
                   for i, p in enumerate(prompts)]
        data, step_rewards = [], []
        for prompt, future in zip(prompts, futures, strict=True):
            sequences = future.result().sequences
            group = [reward(s.tokens, target) for s in sequences]
            mean = sum(group) / len(group)
            step_rewards += group
            for seq, r in zip(sequences, group, strict=True):
                tokens = prompt + seq.tokens
                n = len(prompt) - 1
                data.append(types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [0.0] * n + list(seq.logprobs),
                                    "advantages": [0.0] * n + [r - mean] * len(seq.tokens)}))
        rewards.append(sum(step_rewards) / len(step_rewards))
        tc.forward_backward(data, "importance_sampling")
        tc.optim_step(types.AdamParams(learning_rate=learning_rate)).result()
    return rewards
