"""LinearCritic: its features and its gradient steps computed by hand, its refusals, its state round trip."""

import json
import math

import numpy as np
import pytest

from rlvr.integrations.tensafe.critic import LinearCritic


def test_features_by_hand():
    # buckets 4: prompt [1, 5, 2] hashes to bins 1, 1, 2 -> frequencies [0, 2/3, 1/3, 0] on every row. Answer [3, 6, 0]:
    # the state before token t has seen answer tokens < t: none; [3] -> bin 3; [3, 6] -> bins 3, 2 (halves).
    # Then log(1 + t) / 8 and the bias 1.
    x = LinearCritic(buckets=4).features([1, 5, 2], [3, 6, 0])
    prompt = [0, 2 / 3, 1 / 3, 0]
    expected = [prompt + [0, 0, 0, 0] + [0.0, 1],
                prompt + [0, 0, 0, 1] + [math.log(2) / 8, 1],
                prompt + [0, 0, 0.5, 0.5] + [math.log(3) / 8, 1]]
    assert x.dtype == np.float64 and x.shape == (3, 10)
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-15)


def test_fit_takes_gradient_steps_on_the_squared_error():
    # buckets 1, prompt [9], answer [4]: one state with features [1, 0, 0, 1], target 1. Each step moves w by
    # -STEP_SIZE * value_coef * 2 * x^T (x.w - y) / n = -0.2 * (x.w - 1) * [1, 0, 0, 1] at value_coef 0.5:
    # w = [.2, 0, 0, .2] (value 0.4), then + 0.2 * 0.6 -> [.32, 0, 0, .32] (value 0.64).
    critic = LinearCritic(buckets=1)
    x = critic.features([9], [4])
    assert critic.fit([x], [[1.0]], value_coef=0.5, steps=1) == 1.0  # the error before the fit: (0 - 1)^2
    np.testing.assert_allclose(critic.weights, [0.2, 0, 0, 0.2], rtol=0, atol=1e-15)
    assert critic.fit([x], [[1.0]], value_coef=0.5, steps=1) == pytest.approx(0.36)  # (0.4 - 1)^2
    assert critic.values([9], [4]) == pytest.approx([0.64])


def test_fit_refuses_mismatched_targets_and_divergence():
    critic = LinearCritic(buckets=4)
    x = critic.features([1, 2], [3, 4, 5])
    with pytest.raises(ValueError, match="2 value targets for 3 answer tokens"):
        critic.fit([x], [[1.0, 0.0]], value_coef=1.0)
    with pytest.raises(FloatingPointError, match="lower value_coef"):
        critic.fit([x], [[1.0, 0.0, 1.0]], value_coef=1e6, steps=200)


def test_state_round_trips_through_json():
    critic = LinearCritic(buckets=8)
    critic.fit([critic.features([1, 2, 3], [4, 5])], [[0.5, 1.0]], value_coef=0.5)
    restored = LinearCritic.from_state(json.loads(json.dumps(critic.state())))
    assert restored.buckets == 8 and restored.values([1, 2, 3], [4, 5]) == critic.values([1, 2, 3], [4, 5])
