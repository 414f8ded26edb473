"""The rlvr command end to end on the tiny model: train (config file + overrides), resume, eval, plot, runs, sft."""

import errno
import json
import pathlib
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.errors import CheckpointError
from rlvr.fileio import read_jsonl
from rlvr.rl.checkpoints import last_checkpoint

pytestmark = pytest.mark.slow  # whole runs through the command line

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
    assert "disk" in out and " kB " in out  # tiny's checkpoints (the last two and the final one) and the run files


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
    assert result.exit_code == 2  # one line naming the record, no traceback
    assert "record 0 needs string fields 'prompt' and 'completion'" in result.output


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


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path, monkeypatch):
    """The second checkpoint's write fails with ENOSPC half-way (its adapter written, its optimizer state not): one
    line naming the checkpoint, its folder, the cause and the fix; the run marked failed; the first checkpoint and
    the run files intact, no half-written folder; once there is room, the run resumes."""
    run = tmp_path / "run"
    real_write, writes = pathlib.Path.write_bytes, []

    def full_disk(self, data):
        if self.name == "optimizer.pt":
            writes.append(self)
            if len(writes) == 2:
                real_write(self, data[: len(data) // 2])  # the disk fills mid-file
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", full_disk)
    result = runner.invoke(app, ["train", *[f"{k}={json.dumps(v)}" for k, v in SMALL.items()], f"out={run}"])
    monkeypatch.undo()
    assert result.exit_code == 1, result.output
    errors = error_lines(result.output)
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    folder = run / "checkpoints" / "weights" / "step-000002"
    assert errors[0].startswith("error: could not write checkpoint rlvr://") and "/weights/step-000002 to " in errors[0]
    assert str(folder.name) in errors[0] and "No space left on device (ENOSPC)" in errors[0]
    assert "free space on it, or give the run a folder on another disk (out=...;" in errors[0]

    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "No space left on device" in status["error"]
    assert last_checkpoint(run)["step"] == 1 and not folder.exists()
    assert [p.name for p in folder.parent.iterdir()] == ["step-000001"]  # nothing half-written beside it
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1]  # every row parses
    import rlvr

    rlvr.ServiceClient().create_training_client_from_state_with_optimizer(last_checkpoint(run)["state_path"])
    invoke("resume", str(run))
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    assert last_checkpoint(run)["step"] == 2


def test_a_damaged_or_missing_checkpoint_is_one_line_naming_it_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    run = tmp_path / "run"
    invoke("train", *[f"{k}={json.dumps(v)}" for k, v in {**SMALL, "steps": 1}.items()], f"out={run}")
    state = run / "checkpoints" / "weights" / "step-000001"
    optimizer = state / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # cut short after it was written
    result = runner.invoke(app, ["resume", str(run), "steps=2"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    [error] = error_lines(result.output)
    assert error.startswith("error: checkpoint rlvr://") and f"is damaged: {optimizer} cannot be read (" in error
    assert error.endswith("restore it, or resume from an earlier checkpoint")
    assert json.loads((run / "status.json").read_text())["status"] == "failed"

    monkeypatch.setenv("RLVR_DEBUG", "1")
    result = runner.invoke(app, ["resume", str(run), "steps=2"])
    assert isinstance(result.exception, CheckpointError)  # raised whole, for its traceback
    monkeypatch.delenv("RLVR_DEBUG")

    shutil.rmtree(state)
    result = runner.invoke(app, ["resume", str(run), "steps=2"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    [error] = error_lines(result.output)
    assert error.startswith("error: no checkpoint at 'rlvr://") and f"(looked in {state})" in error


def test_nothing_a_person_may_copy_is_wrapped_off_a_terminal(tmp_path):
    run = tmp_path / ("a-run-folder-whose-name-is-long-enough-to-pass-eighty-columns-by-itself-" * 2) / "run"
    out = invoke("train", *[f"{k}={json.dumps(v)}" for k, v in {**SMALL, "steps": 1}.items()], f"out={run}")
    lines = out.splitlines()
    assert any(line.startswith("rlvr train recipe=arithmetic") and line.endswith(f"-> {run}") for line in lines)
    assert any(line.startswith(f"run folder: {run}   curves: {run}/curves.png") for line in lines), out
    evaluations = [line for line in lines if line.startswith("evaluating the baseline: answered 4/4")]
    assert evaluations, out  # the evaluations show their progress, as rlvr eval does
