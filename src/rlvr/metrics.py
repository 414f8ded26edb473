"""Combining metrics over parts of a batch, by the reduction each name carries (no torch: both layers use it).

The losses name a metric ``name:reduction`` (``loss:sum``, ``clip_fraction:mean``, ``ratio:max``). The engine
combines a call's microbatches with :func:`reduce_metrics`, and the loop a step's ``forward_backward`` calls
(``num_substeps``, ``stream_minibatches``), so a step reports the step, not its last part: sums are summed, means
weighted by the tokens each part trained on, maxima and minima taken over the parts.

Not here: what each metric means (the loss table, ``engine/train/losses.py``), logging (``rl/tracking.py``).
"""

from __future__ import annotations

from collections.abc import Sequence


def reduce_metrics(parts: Sequence[tuple[dict[str, float], float]]) -> dict[str, float]:
    """One dict from ``(metrics, tokens)`` per call: each key reduced by its ``:suffix`` (none: summed).

    A key missing from some calls is reduced over the calls that have it; one call's metrics come back as they are.
    """
    if len(parts) == 1:
        return dict(parts[0][0])
    keys = list(dict.fromkeys(key for metrics, _ in parts for key in metrics))
    out: dict[str, float] = {}
    for key in keys:
        values = [(metrics[key], tokens) for metrics, tokens in parts if key in metrics]
        reduction = key.rsplit(":", 1)[-1] if ":" in key else "sum"
        if reduction == "mean":
            total = sum(tokens for _, tokens in values)
            out[key] = (sum(v * t for v, t in values) / total if total else sum(v for v, _ in values) / len(values))
        elif reduction == "max":
            out[key] = max(v for v, _ in values)
        elif reduction == "min":
            out[key] = min(v for v, _ in values)
        else:
            out[key] = sum(v for v, _ in values)
    return out
