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
