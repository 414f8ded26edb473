"""Each loss against a hand computation: value, and gradient with respect to the target logprobs."""

import math

import pytest
import torch

from rlvr.engine.train.losses import LOSSES, resolve_loss
from rlvr.errors import ConfigurationError, InvalidDatumError, UnknownLossError


def run(name, target, **inputs):
    spec, config = resolve_loss(name, inputs.pop("config", None))
    target = torch.tensor(target, requires_grad=True)
    extra = {"lengths": inputs.pop("lengths")} if spec.per_datum else {}
    loss, metrics = spec.fn(target, *[torch.tensor(inputs[k]) for k in spec.arguments], **extra, **config)
    loss.backward()
    return loss.item(), target.grad.tolist(), metrics


def test_cross_entropy_is_weighted_negative_log_likelihood():
    # loss = -(1 * -0.5 + 0 * -2.0 + 2 * -1.0) = 2.5 ; d/dlp = -w = [-1, 0, -2]
    loss, grad, metrics = run("cross_entropy", [-0.5, -2.0, -1.0], weights=[1.0, 0.0, 2.0])
    assert loss == pytest.approx(2.5)
    assert grad == pytest.approx([-1.0, 0.0, -2.0])
    assert metrics["loss:sum"] == pytest.approx(2.5)


def test_importance_sampling_value_and_gradient():
    # ratio = exp(lp - q) = [exp(0.1), exp(-0.2)] ; loss = -(r0 * 2 + r1 * -1) ; d/dlp_i = -r_i * A_i
    lp, q, adv = [-1.0, -0.7], [-1.1, -0.5], [2.0, -1.0]
    r = [math.exp(0.1), math.exp(-0.2)]
    loss, grad, _ = run("importance_sampling", lp, logprobs=q, advantages=adv)
    assert loss == pytest.approx(-(r[0] * 2.0 - r[1]))
    assert grad == pytest.approx([-r[0] * 2.0, r[1] * 1.0])


def test_importance_sampling_on_policy_is_reinforce():
    # lp == q: ratio 1, gradient -A per token, exactly REINFORCE's.
    loss, grad, _ = run("importance_sampling", [-1.0, -2.0], logprobs=[-1.0, -2.0], advantages=[0.5, -0.25])
    assert loss == pytest.approx(-0.25)
    assert grad == pytest.approx([-0.5, 0.25])


def test_ppo_clips_only_where_the_advantage_pushes_past_the_bound():
    # token 0: ratio e^0.5=1.65 > 1.2, A>0 -> clipped: objective 1.2*1, no gradient
    # token 1: ratio e^0.5 > 1.2, A<0 -> min picks unclipped (-1.65 < -1.2): gradient -r*A = +1.65
    # token 2: ratio e^-0.5=0.61 < 0.8, A<0 -> clipped: objective 0.8*-1, no gradient
    # token 3: ratio e^0.1=1.105 inside: gradient -r*A = -1.105*2
    lp = [0.0, 0.0, 0.0, 0.0]
    q = [-0.5, -0.5, 0.5, -0.1]
    adv = [1.0, -1.0, -1.0, 2.0]
    e5, e1 = math.exp(0.5), math.exp(0.1)
    loss, grad, metrics = run("ppo", lp, logprobs=q, advantages=adv)
    assert loss == pytest.approx(-(1.2 * 1.0 + e5 * -1.0 + 0.8 * -1.0 + e1 * 2.0), rel=1e-6)
    assert grad == pytest.approx([0.0, e5, 0.0, -e1 * 2.0], rel=1e-6)
    assert metrics["clip_fraction:mean"] == pytest.approx(0.5)


def test_ppo_config_changes_the_bounds():
    # ratio e^0.5 = 1.65 inside [0.5, 2.0]: unclipped, gradient -r*A
    e5 = math.exp(0.5)
    loss, grad, _ = run("ppo", [0.0], logprobs=[-0.5], advantages=[1.0],
                        config={"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    assert loss == pytest.approx(-e5)
    assert grad == pytest.approx([-e5])


def test_cispo_keeps_gradient_on_clipped_tokens_with_clipped_weight():
    # loss = -sum sg(clip(r)) * A * lp ; d/dlp = -clip(r) * A
    # token 0: r = e^0.5 -> clipped to 1.2 ; token 1: r = e^0.1 inside ; token 2: r = e^-0.5 -> 0.8
    lp = [-1.0, -2.0, -0.5]
    q = [-1.5, -2.1, 0.0]
    adv = [1.0, -2.0, 3.0]
    w = [1.2, math.exp(0.1), 0.8]
    loss, grad, metrics = run("cispo", lp, logprobs=q, advantages=adv)
    assert loss == pytest.approx(-sum(wi * a * x for wi, a, x in zip(w, adv, lp, strict=True)), rel=1e-6)
    assert grad == pytest.approx([-wi * a for wi, a in zip(w, adv, strict=True)], rel=1e-6)
    assert metrics["clip_fraction:mean"] == pytest.approx(2 / 3)


def test_truncated_importance_sampling_is_cispo_without_a_lower_bound():
    # TIS: d/dlp = -min(r, C) * A. token 0: r = e^1 = 2.72 -> capped at 2 ; token 1: r = e^-2 = 0.135 kept (no floor)
    lp, q, adv, cap = [0.0, -2.0], [-1.0, 0.0], [1.0, -1.0], 2.0
    _, grad, _ = run("cispo", lp, logprobs=q, advantages=adv,
                     config={"clip_low_threshold": 0.0, "clip_high_threshold": cap})
    assert grad == pytest.approx([-cap * 1.0, math.exp(-2.0) * 1.0], rel=1e-6)


def test_dro_quadratic_penalty():
    # loss = -sum(lp*A - beta/2 (lp - q)^2) ; d/dlp = -(A - beta (lp - q))
    lp, q, adv, beta = [-1.0, -3.0], [-1.5, -2.0], [2.0, -1.0], 0.1
    loss, grad, _ = run("dro", lp, logprobs=q, advantages=adv, config={"beta": beta})
    expected = -((-1.0 * 2.0 - 0.05 * 0.25) + (-3.0 * -1.0 - 0.05 * 1.0))
    assert loss == pytest.approx(expected)
    assert grad == pytest.approx([-(2.0 - beta * 0.5), -(-1.0 - beta * -1.0)])


def test_gspo_clips_whole_sequences_on_the_masked_mean_log_ratio():
    # Datum A (3 tokens, mask [0,1,1]): s = exp(mean(0.2, 0.4)) = e^0.3 = 1.35 > 1.2 with A > 0 -> both sampled tokens
    #   clipped: objective 1.2 * 1 each, no gradient; token 0 has A = 0.
    # Datum C (3 tokens, mask [0,1,1]): s = exp(mean(0.1, -0.1)) = 1; token 0's own ratio e^2.5 is outside the mask and
    #   so does not count: every token carries s = 1: objective sum A = 0.5 + 2 - 1 ; d/dlp_t = -s * A_t.
    # Datum E (2 tokens, mask [1,1]): token ratios e^0.5 and e^-0.5 (PPO would clip the first) but s = 1: unclipped.
    lp = [0.0, -1.0, -2.0] + [-0.5, -1.0, -1.0] + [0.0, 0.0]
    q = [0.0, -1.2, -2.4] + [-3.0, -1.1, -0.9] + [-0.5, 0.5]
    adv = [0.0, 1.0, 1.0] + [0.5, 2.0, -1.0] + [1.0, 1.0]
    mask = [0.0, 1.0, 1.0] + [0.0, 1.0, 1.0] + [1.0, 1.0]
    loss, grad, metrics = run("gspo", lp, logprobs=q, advantages=adv, sequence_ratio_mask=mask, lengths=[3, 3, 2])
    assert loss == pytest.approx(-(1.2 * 2) - (0.5 + 2.0 - 1.0) - (1.0 + 1.0), rel=1e-6)
    assert grad == pytest.approx([0.0, 0.0, 0.0, -0.5, -2.0, 1.0, -1.0, -1.0], abs=1e-6)
    assert metrics["clip_fraction:mean"] == pytest.approx(2 / 8)


def test_gspo_negative_advantage_below_the_low_bound_is_clipped():
    # s = exp(mean(-0.5, -0.5)) = 0.61 < 0.8 with A < 0: min(0.61 * -1, 0.8 * -1) = -0.8 per token, no gradient.
    loss, grad, _ = run("gspo", [0.0, 0.0], logprobs=[0.5, 0.5], advantages=[-1.0, -1.0],
                        sequence_ratio_mask=[1.0, 1.0], lengths=[2])
    assert loss == pytest.approx(1.6)
    assert grad == pytest.approx([0.0, 0.0])


def test_gspo_value_is_the_sequence_ratio_but_the_gradient_is_per_token():
    # s = exp(mean(0.1, 0.2)) = e^0.15, inside [0.5, 2]: objective sum s * A_t ; d/dlp_t = -s * A_t (own token only).
    s = math.exp(0.15)
    loss, grad, _ = run("gspo", [-1.0, -2.0], logprobs=[-1.1, -2.2], advantages=[1.0, 3.0],
                        sequence_ratio_mask=[1.0, 1.0], lengths=[2],
                        config={"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    assert loss == pytest.approx(-(s * 1.0 + s * 3.0), rel=1e-6)
    assert grad == pytest.approx([-s * 1.0, -s * 3.0], rel=1e-6)


def test_gspo_refuses_a_datum_with_an_empty_mask():
    with pytest.raises(InvalidDatumError, match=r"sequence_ratio_mask'\] marks no position"):
        run("gspo", [0.0, 0.0], logprobs=[0.0, 0.0], advantages=[1.0, 1.0], sequence_ratio_mask=[0.0, 0.0],
            lengths=[2])


def test_stable_reinforce_truncated_weight_and_k3_penalty():
    # Sampled positions 1..3 (position 0 is prompt: its logprob padding 0.0 and ratio e^-0.5 must not count).
    # loss = -sum_S sg(min(r, 1)) A lp + k * sum_S (r - 1 - log r) ; d/dlp = -min(r, 1) A + k (r - 1)
    # token 1: r = e^0.5 -> weight 1 ; token 2: r = e^-1 -> weight e^-1 ; token 3: r = 1 -> weight 1.
    lp, q = [-0.5, -1.0, -2.0, -0.3], [0.0, -1.5, -1.0, -0.3]
    adv, sampled, k = [7.0, 1.0, -2.0, 0.5], [0.0, 1.0, 1.0, 1.0], 0.1
    r1, r2 = math.exp(0.5), math.exp(-1.0)
    loss, grad, metrics = run("stable_reinforce", lp, logprobs=q, advantages=adv, sampled_mask=sampled,
                              config={"kl_coeff": k})
    pg = 1.0 * 1.0 * -1.0 + r2 * -2.0 * -2.0 + 1.0 * 0.5 * -0.3
    kl = (r1 - 1 - 0.5) + (r2 - 1 + 1.0) + 0.0
    assert loss == pytest.approx(-pg + k * kl, rel=1e-6)
    assert grad == pytest.approx([0.0, -1.0 + k * (r1 - 1), r2 * 2.0 + k * (r2 - 1), -0.5], rel=1e-6)
    assert metrics["kl_sample_train_k3:sum"] == pytest.approx(kl, rel=1e-6)
    assert metrics["truncated_tokens:sum"] == 1.0


def test_stable_reinforce_on_policy_is_reinforce():
    # lp == q on the sampled tokens: weight 1, no KL: d/dlp = -A, loss = -sum A lp.
    loss, grad, _ = run("stable_reinforce", [-1.0, -2.0], logprobs=[-1.0, -2.0], advantages=[0.5, -0.25],
                        sampled_mask=[1.0, 1.0], config={"kl_coeff": 1.0})
    assert loss == pytest.approx(-(-0.5 + 0.5))
    assert grad == pytest.approx([-0.5, 0.25])


def test_table_has_the_tinker_losses():
    assert set(LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"}


def test_unknown_loss_names_the_choices():
    with pytest.raises(UnknownLossError, match="'reinforce' is not a built-in loss.*cispo"):
        resolve_loss("reinforce", None)


def test_bad_configs_are_refused():
    with pytest.raises(ConfigurationError, match="not used by loss_fn='importance_sampling'"):
        resolve_loss("importance_sampling", {"clip_low_threshold": 0.8})
    with pytest.raises(ConfigurationError, match="needs loss_fn_config=\\{'beta'"):
        resolve_loss("dro", None)
    with pytest.raises(ConfigurationError, match="clip_low_threshold <= clip_high_threshold"):
        resolve_loss("ppo", {"clip_low_threshold": 1.5})
