"""Advantages against hand computations."""

import pytest

from rlvr.rl.advantages import RunningBaseline, group_advantages, group_outcomes, is_constant


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
