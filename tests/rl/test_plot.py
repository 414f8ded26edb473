"""Run plots: a PNG from metrics.jsonl, and clear errors for folders without metrics."""

import json

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rl.plot import curves, plot_run


def test_plot_writes_a_png(tmp_path):
    rows = [{"step": i, "env/all/reward/mean": i / 10, **({"test/correct": 0.5} if i == 4 else {})} for i in range(5)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = plot_run(tmp_path, extra={"baseline accuracy": 0.3})
    assert out == tmp_path / "curves.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000


def test_plot_refuses_missing_or_unknown_metrics(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0}))
    with pytest.raises(ConfigurationError, match="nothing to plot"):
        plot_run(tmp_path)


def test_the_clipped_shares_are_drawn_where_logged(tmp_path):
    rows = [{"step": i, "env/all/reward/mean": 0.1, "env/all/clipped": i / 4,
             **({"test/clipped": 0.75} if i == 3 else {})} for i in range(4)]
    drawn = curves(rows)
    assert drawn["train answers cut at max_tokens"] == [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75)]
    assert drawn["held-out answers cut at max_tokens"] == [(3, 0.75)]
    assert "held-out accuracy" not in drawn
    assert list(curves([{"step": 0, "env/all/reward/mean": 0.1}])) == ["train reward (mean)"]
