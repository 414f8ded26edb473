"""The basic loop: its reward reads the answer, and a run on tiny writes one metrics line per step."""

import json

from rich.console import Console

from rlvr.rl.basic import BasicConfig, reward, train


def test_reward_takes_the_last_integer():
    assert reward("12 + 13 = 25", 25) == 1.0
    assert reward("12 + 13 = 24", 25) == 0.0
    assert reward("The answer is -3", -3) == 1.0
    assert reward("no number here", 1) == 0.0


def test_basic_loop_runs_on_tiny(tmp_path):
    config = BasicConfig(base_model="tiny", steps=2, problems_per_step=2, group_size=3, max_tokens=4,
                         eval_problems=4, out=str(tmp_path))
    result = train(config, Console(quiet=True))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in lines)
    assert set(result) == {"baseline_accuracy", "after_accuracy"}
    assert json.loads((tmp_path / "config.json").read_text())["base_model"] == "tiny"

