"""A stopped run's status and the command it prints (``rlvr/app/status.py``): whole on one line even on a narrow
terminal, so it pastes."""

import io
import json
import signal

import pytest
from rich.console import Console

from rlvr.app.commands import user_command
from rlvr.app.status import Stopped, running
from rlvr.errors import RunInterrupted


def test_the_resume_command_is_one_line_on_a_narrow_terminal(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_COMMAND", "./rlvr")
    run = tmp_path / ("a-run-folder-whose-name-alone-is-wider-than-the-terminal-" * 2)
    run.mkdir()
    command = user_command("resume", str(run))
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=40, color_system=None)
    with pytest.raises(RunInterrupted), running(run, console, lambda: Stopped(3, "step 3/9", command)):
        raise RunInterrupted(signal.SIGINT, 3)
    assert f"  {command}" in screen.getvalue().splitlines()
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "interrupted" and status["resume"] == command


def test_where_a_stopped_run_stands_comes_from_its_record(tmp_path, monkeypatch):
    """``stopped_at``: before any checkpoint, in the warm-up, in the loop, after its last step (only the final
    evaluation stopped: evaluate it), and an sft run's step."""
    import yaml

    from rlvr.app.status import stopped_at
    from rlvr.rl import checkpoints
    from rlvr.rl.run_record import RunRecord

    monkeypatch.setenv("RLVR_COMMAND", "rlvr")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"kind": "rl", "steps": 8}))
    record, resume = RunRecord(run), f"rlvr resume {run}"
    assert stopped_at(record, 8, 6) == Stopped(0, "step 0", resume, "no checkpoint yet; start it again (from step 0) "
                                                                    "with:")
    checkpoints.record_checkpoint(run, {"step": 2, "state_path": "w2"}, checkpoints.WARMUP)
    assert stopped_at(record, 8, 6) == Stopped(0, "warm-up step 2/6", resume)
    checkpoints.record_checkpoint(run, {"step": 3, "state_path": "s3", "rng": None})
    assert stopped_at(record, 8, 6) == Stopped(3, "step 3/8", resume)
    checkpoints.record_checkpoint(run, {"step": 8, "state_path": "s8", "final": True})
    assert stopped_at(record, 8, 6) == Stopped(8, "step 8/8", f"rlvr eval --checkpoint {run}", "training is "
                                               "complete; its final evaluation was stopped. Evaluate it with:")
    tuned = tmp_path / "sft"
    tuned.mkdir()
    (tuned / "config.yaml").write_text(yaml.safe_dump({"kind": "sft", "steps": 3}))
    checkpoints.record_checkpoint(tuned, {"step": 1, "state_path": "t1", "kind": "sft"})
    assert stopped_at(RunRecord(tuned), 3) == Stopped(1, "step 1/3", f"rlvr resume {tuned}")
