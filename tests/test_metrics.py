"""rlvr.metrics: metrics of a batch's parts combined by the reduction their names carry."""

from rlvr.metrics import reduce_metrics


def test_metrics_of_microbatches_combine_by_their_suffix():
    parts = [({"loss:sum": 1.0, "clip:mean": 0.5, "ratio:max": 3.0, "ratio:min": 0.25}, 2),
             ({"loss:sum": 2.5, "clip:mean": 0.0, "ratio:max": 1.0, "ratio:min": 0.5}, 6)]
    # sum: 1 + 2.5; token-weighted mean: (0.5 * 2 + 0 * 6) / 8; max and min across microbatches.
    assert reduce_metrics(parts) == {"loss:sum": 3.5, "clip:mean": 0.125, "ratio:max": 3.0, "ratio:min": 0.25}
    assert reduce_metrics(parts[:1]) == parts[0][0]


def test_a_key_some_parts_lack_is_reduced_over_the_parts_that_have_it():
    parts = [({"loss:sum": 1.0, "kl:mean": 0.5}, 2), ({"loss:sum": 2.0}, 6)]
    assert reduce_metrics(parts) == {"loss:sum": 3.0, "kl:mean": 0.5}
