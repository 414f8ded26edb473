"""Datum building and the sampler/trainer comparison metrics."""

import pytest

from rlvr.rl.datums import rl_datum, sample_train_metrics


def test_rl_datum_masks_the_prompt():
    datum, mask = rl_datum([10, 11, 12], [20, 21], [-0.5, -1.5], advantage=0.25)
    assert datum.model_input.to_ints() == [10, 11, 12, 20]
    inputs = {k: v.tolist() for k, v in datum.loss_fn_inputs.items()}
    assert inputs["target_tokens"] == [11, 12, 20, 21]
    assert inputs["logprobs"] == [0.0, 0.0, -0.5, -1.5]
    assert inputs["advantages"] == [0.0, 0.0, 0.25, 0.25]
    assert mask == [0.0, 0.0, 1.0, 1.0]


def test_rl_datum_refuses_mismatched_logprobs():
    with pytest.raises(ValueError, match="2 completion tokens but 1 logprobs"):
        rl_datum([1], [2, 3], [-1.0], 1.0)


def test_sample_train_metrics_by_hand():
    # masked positions: d = q - p = [(-1.0) - (-1.2), (-2.0) - (-1.9)] = [0.2, -0.1]
    # v1 = 0.05 ; v2 = (0.04 + 0.01) / 4 = 0.0125 ; entropy = -(-1.2 - 1.9) / 2 = 1.55
    metrics = sample_train_metrics([[-9.0, -1.2, -1.9]], [[0.0, -1.0, -2.0]], [[0.0, 1.0, 1.0]])
    assert metrics["optim/kl_sample_train_v1"] == pytest.approx(0.05)
    assert metrics["optim/kl_sample_train_v2"] == pytest.approx(0.0125)
    assert metrics["optim/entropy"] == pytest.approx(1.55)
    assert metrics["optim/max_abs_logprob_diff"] == pytest.approx(0.2)


def test_kl_sample_train_is_zero_before_any_update(service):
    # Sample from tiny, build datums with rl_datum, run the trainer forward: v1 and v2 ~ 0 at equal weights.
    from rlvr import types

    training_client = service.create_lora_training_client(base_model="tiny", rank=4, seed=3)
    sampler = training_client.save_weights_and_get_sampling_client()
    prompt = [5, 6, 7, 8]
    result = sampler.sample(types.ModelInput.from_ints(prompt), 4,
                            types.SamplingParams(max_tokens=10, temperature=0.9, seed=0)).result()
    built = [rl_datum(prompt, s.tokens, s.logprobs, 1.0) for s in result.sequences]
    out = training_client.forward([d for d, _ in built], "importance_sampling").result()
    metrics = sample_train_metrics([o["logprobs"].tolist() for o in out.loss_fn_outputs],
                                   [d.loss_fn_inputs["logprobs"].tolist() for d, _ in built], [m for _, m in built])
    assert abs(metrics["optim/kl_sample_train_v1"]) < 1e-4
    assert metrics["optim/kl_sample_train_v2"] < 1e-7
    assert metrics["optim/entropy"] > 0


def test_kl_penalty_by_hand():
    from rlvr.rl.datums import apply_kl_penalty

    # Two datums, prompt of 2 tokens (1 masked position each), completions of 2 and 1 tokens.
    d1, m1 = rl_datum([1, 2], [3, 4], [-1.0, -2.0], advantage=0.5)
    d2, m2 = rl_datum([1, 2], [5], [-0.5], advantage=-0.5)
    # base logprobs of targets: k = q - base on sampled tokens: d1 -> [-1 - -1.5, -2 - -2.0] = [0.5, 0.0];
    # d2 -> [-0.5 - -1.0] = [0.5]; mean k = 1/3; coef 0.3: A += 0.3 * (1/3 - k)
    out, metrics = apply_kl_penalty([d1, d2], [m1, m2], [[0.0, -1.5, -2.0], [0.0, -1.0]], coef=0.3)
    assert metrics["kl_policy_base"] == pytest.approx(1 / 3)
    assert out[0].loss_fn_inputs["advantages"].tolist() == pytest.approx(
        [0.0, 0.5 + 0.3 * (1 / 3 - 0.5), 0.5 + 0.3 * (1 / 3)])
    assert out[1].loss_fn_inputs["advantages"].tolist() == pytest.approx([0.0, -0.5 + 0.3 * (1 / 3 - 0.5)])
    assert out[0].loss_fn_inputs["target_tokens"].tolist() == d1.loss_fn_inputs["target_tokens"].tolist()


def test_per_token_advantages_land_on_the_sampled_tokens_in_order():
    from rlvr.rl.datums import masked_datum

    # tokens 1..5, tokens 3 and 5 sampled (4 is an observation between them): targets 2..5, mask [0, 1, 0, 1]
    datum, mask = masked_datum([1, 2, 3, 4, 5], [0, 0, -0.1, 0, -0.2], [0, 0, 1, 0, 1], [0.7, -0.3])
    assert mask == [0, 1, 0, 1]
    assert datum.loss_fn_inputs["advantages"].tolist() == pytest.approx([0.0, 0.7, 0.0, -0.3])
    with pytest.raises(ValueError, match="3 advantages for 2 sampled tokens"):
        masked_datum([1, 2, 3, 4, 5], [0, 0, -0.1, 0, -0.2], [0, 0, 1, 0, 1], [0.7, -0.3, 0.1])
