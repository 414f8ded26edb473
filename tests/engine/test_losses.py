"""Each loss against a hand computation: value, and gradient with respect to the target logprobs."""

import math

import pytest
import torch

from rlvr.engine.losses import LOSSES, resolve_loss
from rlvr.errors import ConfigurationError, UnknownLossError


def run(name, target, **inputs):
    spec, config = resolve_loss(name, inputs.pop("config", None))
    target = torch.tensor(target, requires_grad=True)
    loss, metrics = spec.fn(target, *[torch.tensor(inputs[k]) for k in spec.inputs], **config)
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


def test_table_has_the_tinker_losses():
    assert set(LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}


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
