"""The basic loop: its reward reads the answer, and a run on tiny trains and writes its run folder."""

import json

from rich.console import Console

import rlvr.rl.basic as basic
from rlvr.rl.basic import BasicConfig, reward, train


def test_reward_takes_the_stated_answer_not_the_last_number():
    assert reward("12 + 13 = 25", 25) == 1.0
    assert reward("25", 25) == 1.0
    assert reward("12 + 13 = 24", 25) == 0.0
    assert reward("12 + 13 = 24, not 25", 25) == 0.0
    assert reward("The answer is -3", -3) == 1.0
    assert reward("The answer is 3", -3) == 0.0
    assert reward("no number here", 1) == 0.0


def test_basic_loop_trains_on_tiny_and_writes_its_run_folder(tmp_path, monkeypatch):
    # tiny never writes the sum, so the arithmetic reward is always 0 and no step would train; a reward that
    # varies within a group (the answer's length parity) makes every step send a forward_backward.
    monkeypatch.setattr(basic, "reward", lambda response, answer: float(len(response) % 2))
    config = BasicConfig(base_model="tiny", steps=2, problems_per_step=2, group_size=4, max_tokens=6,
                         eval_problems=4, out=str(tmp_path))
    result = train(config, Console(quiet=True))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().split("\n") if line]
    assert [m["step"] for m in lines] == [0, 1]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in lines)
    assert any(m["datums"] > 0 and "optim/kl_sample_train_v1" in m for m in lines), lines  # a step trained
    assert set(result) == {"baseline_accuracy", "after_accuracy"}
    assert json.loads((tmp_path / "config.json").read_text())["base_model"] == "tiny"
    assert (tmp_path / "curves.png").stat().st_size > 0
