"""Plots of a run folder's ``metrics.jsonl``: the training reward per step and, where logged, held-out accuracy and the
share of answers cut at ``max_tokens``.

Not here: live dashboards (MLflow / W&B logging belongs to the CLI issue).
"""

from __future__ import annotations

import math
from pathlib import Path

from rlvr.errors import ConfigurationError
from rlvr.fileio import read_jsonl

REWARD_KEYS = ("env/all/reward/mean", "reward/mean")  # full loop, basic loop
ACCURACY_KEYS = ("test/correct",)
CLIPPED_KEYS = {"env/all/clipped": "train answers cut at max_tokens",
                "test/clipped": "held-out answers cut at max_tokens"}
"""The share of answers that hit the token budget (``max_tokens``), drawn dotted on the same 0-1 axis."""


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise ConfigurationError(f"{path} does not exist; plot a run folder written by rlvr train")
    rows = read_jsonl(path)
    if not rows:
        raise ConfigurationError(f"{path} is empty: the run logged no step yet")
    return rows


def curves(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The curves :func:`plot_run` draws, by label: ``(step, value)`` points of the training reward, the held-out
    accuracy and the clipped shares, each where the rows log it."""
    reward_key = next((k for k in REWARD_KEYS if k in rows[0]), None)
    if reward_key is None:
        raise ConfigurationError(f"metrics.jsonl has none of {REWARD_KEYS}; nothing to plot")
    drawn = {"train reward (mean)": [(r["step"], r.get(reward_key, math.nan)) for r in rows]}
    for key, label in [*((k, "held-out accuracy") for k in ACCURACY_KEYS), *CLIPPED_KEYS.items()]:
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            drawn[label] = points
    return drawn


def plot_run(run_dir: str | Path, out: str | Path | None = None, extra: dict[str, float] | None = None) -> Path:
    """Write ``<run_dir>/curves.png`` (or ``out``): reward per step, held-out accuracy points and the share of
    answers cut at ``max_tokens`` (:func:`curves`).

    ``extra`` adds horizontal reference lines, e.g. ``{"baseline accuracy": 0.42}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = curves(read_metrics(Path(run_dir)))
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in drawn.items():
        style = {"linestyle": ":", "marker": "."} if label in CLIPPED_KEYS.values() else \
            {"marker": "o" if label.startswith("train") else "s", "markersize": 3}
        ax.plot(*zip(*points, strict=True), label=label, **style)
    for i, (label, value) in enumerate((extra or {}).items()):
        ax.axhline(value, linestyle="--", color=f"C{i + 2}", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("reward / accuracy")
    ax.set_title(Path(run_dir).name)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    target = Path(out) if out is not None else Path(run_dir) / "curves.png"
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
