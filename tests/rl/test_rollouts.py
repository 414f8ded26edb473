"""The share of answers cut at max_tokens (``env/all/clipped``, ``test/clipped``): by hand on made-up turns, and on
real runs of tiny whose budget cuts every answer (max_tokens=1) or none (a model fine-tuned to answer "a" and stop)."""

import json
import math

import pytest
from test_loop import SayA, config

from rlvr.app.sft import SftConfig, sft
from rlvr.fileio import read_jsonl
from rlvr.rl import train
from rlvr.rl.envs import Trajectory, Transition, clipped_share
from rlvr.rl.rollouts import Rollout, _episode_metrics


def turn(clipped):
    return Transition([1, 2], [3], [-0.5], 1.0, clipped=clipped)


def test_clipped_share_by_hand():
    assert clipped_share([turn(True), turn(False), turn(False), turn(True)]) == 0.5
    assert clipped_share([turn(True), turn(None), turn(False)]) == 0.5  # unknown turns are left out, not counted as 0
    assert clipped_share([turn(None)]) is None and clipped_share([]) is None


def test_the_steps_metrics_carry_the_clipped_share_over_every_turn():
    """Three turns of one episode and one of another, two of them cut: 2/4 (per turn, not per episode)."""
    from rlvr.rl.rollouts import Rollouts

    played = Rollout([[Trajectory([turn(True), turn(False), turn(False)]), Trajectory([turn(True)])]],
                     [[1.0, 1.0]], [], 4, 0.0)
    metrics = Rollouts.metrics(None, [played])  # self is unused: the metrics depend on the rollouts alone
    assert metrics["env/all/clipped"] == 0.5
    assert "env/all/clipped" not in _episode_metrics([played])  # added once, by metrics
    unknown = Rollout([[Trajectory([turn(None)])]], [[1.0]], [], 1, 0.0)
    assert "env/all/clipped" not in Rollouts.metrics(None, [unknown])


def test_a_budget_that_cuts_every_answer_gives_one(tmp_path):
    """max_tokens=1 on tiny: every sampled and every held-out answer stops at the budget (none is a lone stop token,
    which the sampler would report as stopped, not cut)."""
    result = train(config(tmp_path, steps=2, max_tokens=1), SayA())
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [row["env/all/clipped"] for row in rows] == [1.0, 1.0]
    assert result["before"]["test/clipped"] == 1.0 and result["after"]["test/clipped"] == 1.0
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000000.jsonl").open()]
    assert all(len(r["response"].encode()) <= 4 for r in rollouts)  # one byte-level token each (UTF-8: up to 4 bytes)


@pytest.fixture(scope="module")
def says_a_and_stops(tmp_path_factory):
    """tiny fine-tuned to answer SayA's questions with "a" and its end-of-turn token."""
    folder = tmp_path_factory.mktemp("says-a")
    pairs = folder / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Say a, {i}.", "completion": "a"}) + "\n" for i in range(16)))
    return sft(SftConfig(data=str(pairs), base_model="tiny", rank=8, steps=12, batch_size=4, learning_rate=2e-2,
                         out=str(folder / "sft")))


def test_a_budget_that_cuts_no_answer_gives_zero(tmp_path, says_a_and_stops):
    result = train(config(tmp_path, steps=2, max_tokens=8, start_from_checkpoint=says_a_and_stops), SayA())
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [row["env/all/clipped"] for row in rows] == [0.0, 0.0]
    assert [row["env/all/reward/mean"] for row in rows] == [1.0, 1.0]  # every answer is "a", ended by the model
    assert result["before"]["test/clipped"] == 0.0 and result["after"]["test/clipped"] == 0.0
    assert not math.isnan(rows[0]["env/all/ac_tokens_per_turn"]) and rows[0]["env/all/ac_tokens_per_turn"] == 2.0
