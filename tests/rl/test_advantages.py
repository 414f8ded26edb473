"""Advantages against hand computations."""

import pytest

from rlvr.rl.advantages import RunningBaseline, entropy_shaped, group_advantages, group_outcomes, is_constant


def test_group_centring():
    # mean of [1, 0, 0, 1] is 0.5
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([2.0, -1.0, 0.5]) == pytest.approx([1.5, -1.5, 0.0])


def test_std_normalisation():
    # [1, 0, 0, 0]: mean 0.25, centred [0.75, -0.25, -0.25, -0.25], population std sqrt(0.1875) = 0.4330
    out = group_advantages([1.0, 0.0, 0.0, 0.0], normalize_std=True, eps=0.0)
    assert out == pytest.approx([0.75 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127])
    assert group_advantages([3.0, 3.0], normalize_std=True) == [0.0, 0.0]  # eps keeps a constant group finite


def test_constant_groups_and_outcomes():
    assert is_constant([0.5, 0.5]) and not is_constant([0.5, 0.4])
    metrics = group_outcomes([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert metrics == {"by_group/frac_mixed": 0.5, "by_group/frac_all_good": 0.25, "by_group/frac_all_bad": 0.25}


def test_running_baseline():
    baseline = RunningBaseline(decay=0.5)
    assert baseline.advantages([1.0, 3.0]) == [-1.0, 1.0]  # first batch: its own mean, 2
    assert baseline.value == 2.0
    assert baseline.advantages([4.0]) == [2.0]  # against 2, then 0.5 * 2 + 0.5 * 4 = 3
    assert baseline.value == 3.0


def test_entropy_shaping_by_hand():
    # A = 1, logprobs [-1, -2, -0.5], coef 0.1: suffix sums [-3.5, -2.5, -0.5] -> 1 + [0.35, 0.25, 0.05]
    assert entropy_shaped(1.0, [-1.0, -2.0, -0.5], 0.1) == pytest.approx([1.35, 1.25, 1.05])
    assert entropy_shaped(0.5, [-1.0, -2.0], 0.0) == [0.5, 0.5]
    with pytest.raises(ValueError, match=">= 0"):
        entropy_shaped(0.0, [-1.0], -0.1)


def test_entropy_shaping_is_the_entropy_gradient_in_expectation():
    # A two-token policy pi(y1) pi(y2 | y1) over 3 x 3 answers, with parameters theta. Enumerating every answer, the
    # expected policy gradient sum_y pi(y) sum_t A_t(y) grad log pi(y_t | .) with the shaped advantages (A = 0,
    # coef 1) must equal grad H, H = -sum_y pi(y) log pi(y), computed by autograd on the exact entropy.
    import torch

    gen = torch.Generator().manual_seed(0)
    first = torch.randn(3, generator=gen, requires_grad=True)
    second = torch.randn(3, 3, generator=gen, requires_grad=True)

    def logprobs(y1, y2):
        return torch.log_softmax(first, -1)[y1], torch.log_softmax(second[y1], -1)[y2]

    answers = [(a, b) for a in range(3) for b in range(3)]
    entropy = -sum(torch.exp(sum(logprobs(*y))) * sum(logprobs(*y)) for y in answers)
    exact = torch.autograd.grad(entropy, [first, second])
    surrogate = 0.0
    for y in answers:
        lp1, lp2 = logprobs(*y)
        weight = torch.exp(lp1 + lp2).detach()  # the expectation over answers, not differentiated
        a1, a2 = entropy_shaped(0.0, [lp1.item(), lp2.item()], 1.0)
        surrogate = surrogate + weight * (a1 * lp1 + a2 * lp2)
    estimated = torch.autograd.grad(surrogate, [first, second])
    for e, x in zip(estimated, exact, strict=True):
        torch.testing.assert_close(e, x, atol=1e-5, rtol=1e-5)
    # Guard: an estimator that drops the token's own surprisal (keeps only what follows it) misses the gradient.
    wrong = sum(torch.exp(sum(logprobs(*y))).detach() * (-(logprobs(*y)[1].item()) * logprobs(*y)[0]) for y in answers)
    assert not torch.allclose(torch.autograd.grad(wrong, [first])[0], exact[0], atol=1e-3)


def test_gae_by_hand():
    from rlvr.rl.advantages import gae, returns_to_go

    rewards, values = [0.0, 0.0, 1.0], [0.2, 0.5, 0.4]
    # deltas: 0 + 0.5 - 0.2 = 0.3, 0 + 0.4 - 0.5 = -0.1, 1 + 0 - 0.4 = 0.6
    assert gae(rewards, values, gamma=1.0, lam=0.5) == pytest.approx([0.3 + 0.5 * (-0.1 + 0.5 * 0.6), -0.1 + 0.3, 0.6])
    assert gae(rewards, values, gamma=1.0, lam=1.0) == pytest.approx([0.8, 0.5, 0.6])  # return - value
    assert gae(rewards, values, gamma=1.0, lam=0.0) == pytest.approx([0.3, -0.1, 0.6])  # one-step TD errors
    assert returns_to_go(rewards, gamma=0.9) == pytest.approx([0.81, 0.9, 1.0])
    assert gae(rewards, values, gamma=0.9, lam=1.0) == pytest.approx([0.61, 0.4, 0.6])
    with pytest.raises(ValueError, match="3 rewards but 2 values"):
        gae(rewards, values[:2])
