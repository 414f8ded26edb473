"""Combining a step's metrics over its minibatches, by the reduction each name carries.

The engine and the losses name a metric ``name:reduction`` (``loss:sum``, ``clip_fraction:mean``,
``ratio:max``); a step trained in several ``forward_backward`` calls (``num_substeps``, ``stream_minibatches``)
reports the step, not its last call: sums are summed, means weighted by the tokens each call trained on, maxima
and minima taken over the calls.

Not here: what each metric means (the loss table, ``engine/losses.py``), logging (``tracking.py``).
"""

from __future__ import annotations

from collections.abc import Sequence


def reduce_metrics(parts: Sequence[tuple[dict[str, float], float]]) -> dict[str, float]:
    """One dict from ``(metrics, tokens)`` per call: each key reduced by its ``:suffix`` (none: summed).

    A key missing from some calls is reduced over the calls that have it.
    """
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
