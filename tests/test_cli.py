"""The rlvr command end to end on the tiny model: train (config file + overrides), resume, eval, plot, runs, sft."""

import json

import yaml
from typer.testing import CliRunner

from rlvr.cli import app

runner = CliRunner()

SMALL = {"base_model": "tiny", "steps": 2, "problems_per_step": 2, "group_size": 4, "max_tokens": 6,
         "eval_problems": 4, "save_every": 1, "task": {"num_train": 20, "num_test": 8}}


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_train_resume_eval_plot_runs(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    run = tmp_path / "runs" / "first"
    out = invoke("train", "--config", str(config), f"out={run}", "seed=3", "task.instruction=Answer.")

    assert "Baseline" in out and "After" in out and "pass rate" in out
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["seed"] == 3 and saved["steps"] == 2 and saved["task"]["instruction"] == "Answer."
    assert saved["recipe"] == "arithmetic" and saved["reward"] == "math_correct"  # the recipe's presets
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary) == {"baseline", "after"} and "test/correct" in summary["after"]
    assert (run / "rollouts" / "index.html").exists()

    invoke("resume", str(run), "steps=3")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert yaml.safe_load((run / "config.yaml").read_text())["steps"] == 3

    out = invoke("eval", "--checkpoint", str(run), "--samples", "2", "--k", "1", "--k", "2", "--problems", "3")
    assert "pass@2" in out
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(len(r["responses"]) == 2 for r in records)
    assert all(0.0 <= r["pass@1"] <= r["pass@2"] <= 1.0 for r in records)

    (run / "curves.png").unlink()
    invoke("plot", str(run))
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "curves.png").stat().st_size > 1000

    out = invoke("runs", str(tmp_path / "runs"))
    assert "first" in out and "finished" in out and "3/3" in out


def test_resume_of_a_finished_run_says_nothing_remains(tmp_path):
    run = tmp_path / "done"
    invoke("train", *[f"{k}={json.dumps(v)}" for k, v in {**SMALL, "steps": 1}.items()], f"out={run}")
    result = runner.invoke(app, ["resume", str(run)])
    assert result.exit_code == 2
    assert "nothing remains to train" in result.output


def test_sft_then_train_from_its_checkpoint(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "completion": str(i + 1)}) + "\n"
                             for i in range(8)))
    out = invoke("sft", f"data={pairs}", "base_model=tiny", "steps=3", "batch_size=4", f"out={tmp_path / 'sft'}")
    path = out.split("saved: ")[1].split()[0]
    assert (tmp_path / "sft" / "checkpoints.jsonl").exists()
    last = next(line for line in out.splitlines() if line.startswith("step 3/3  loss/token "))  # progress, off a tty
    assert "s/step" in last and last.endswith("ETA 0:00")
    run = tmp_path / "rl"
    invoke("train", *[f"{k}={json.dumps(v)}" for k, v in {**SMALL, "steps": 1}.items()], f"out={run}",
           f"start_from_checkpoint={path}")
    assert yaml.safe_load((run / "config.yaml").read_text())["start_from_checkpoint"] == path


def test_sft_rejects_bad_records(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "x", "answer": "y"}) + "\n")
    result = runner.invoke(app, ["sft", f"data={pairs}", "base_model=tiny"])
    assert result.exit_code != 0
    assert "record 0 needs string fields 'prompt' and 'completion'" in str(result.exception or result.output)


def test_reasoning_gym_from_the_command_line(tmp_path):
    """`rlvr train --recipe reasoning-gym task.name=... task.config={...}` and `rlvr eval` on it; a dataset name
    reasoning-gym lacks is an error naming the nearest ones, before any model loads."""
    import pytest

    pytest.importorskip("reasoning_gym")
    bad = runner.invoke(app, ["train", "--recipe", "reasoning-gym", "task.name=leg_countin"])
    assert bad.exit_code == 2 and "no dataset 'leg_countin' (did you mean 'leg_counting'" in bad.output
    bad = runner.invoke(app, ["train", "--recipe", "reasoning-gym", "task.name=gcd", "task.config={max_animals: 2}"])
    assert bad.exit_code == 2 and "its config keys are" in bad.output
    run = tmp_path / "rg"
    invoke("train", "--recipe", "reasoning-gym", "base_model=tiny", "steps=1", "problems_per_step=2", "group_size=2",
           "max_tokens=4", "eval_problems=3", f"out={run}", "task.name=gcd", "task.config={max_value: 9}",
           "task.num_train=10", "task.num_test=3")
    out = invoke("eval", "--checkpoint", str(run), "--problems", "3")
    assert "pass@1" in out and "reward_failures      0" in out
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [r["problem_id"] for r in records] == [f"reasoning-gym/gcd/test/{i}" for i in range(3)]
