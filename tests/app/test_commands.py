"""The commands rlvr prints for a person to copy (``rlvr/app/commands.py``) take the form they ran rlvr in, and a
printed resume line, pasted into a shell at the clone's root, resumes the run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.app import commands
from rlvr.app.commands import user_command
from rlvr.fileio import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_the_wrapper_names_how_it_was_called(monkeypatch):
    monkeypatch.setenv("RLVR_COMMAND", "./rlvr")
    assert user_command("resume", "runs/a b") == "./rlvr resume 'runs/a b'"
    monkeypatch.setenv("RLVR_COMMAND", "/home/me/my clone/rlvr")
    assert user_command("eval", "--checkpoint", "r") == "'/home/me/my clone/rlvr' eval --checkpoint r"


def test_the_installed_command_is_rlvr_when_it_is_the_one_on_path(monkeypatch, tmp_path):
    monkeypatch.delenv("RLVR_COMMAND", raising=False)
    program = tmp_path / "bin" / "rlvr"
    program.parent.mkdir()
    program.write_text("")
    monkeypatch.setattr(sys, "argv", [str(program), "train"])
    monkeypatch.setattr(commands.shutil, "which", lambda name: str(program))
    assert user_command("resume", "x") == "rlvr resume x"
    monkeypatch.setattr(commands.shutil, "which", lambda name: None)  # not on PATH: its path, as it was run
    assert user_command("resume", "x") == f"{program} resume x"
    monkeypatch.setattr(sys, "argv", ["-c"])  # python -c, a library call: the installed name
    assert user_command("resume", "x") == "rlvr resume x"


def wait_for(predicate, process, what, timeout=600.0):
    """Poll ``predicate`` until it holds; fail if ``process`` ends first (no timing race: the run waits for us)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.05)


def stop(process):
    """Ctrl-C, as a person stops a run, to the whole process group the test started."""
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=600) == 128 + signal.SIGINT


def checkpointed(run):
    return [row["step"] for row in read_jsonl(run / "checkpoints.jsonl")] if (run / "checkpoints.jsonl").exists() \
        else []


def resume_line(log):
    lines = log.read_text().splitlines()
    told = [i for i, line in enumerate(lines) if line.startswith("stopped by SIGINT: checkpoint at step")]
    assert told, log.read_text()
    return lines[told[-1] + 1]


@pytest.mark.slow  # two runs of ./rlvr in fresh processes
def test_a_printed_resume_line_pasted_at_the_clones_root_resumes_the_run(tmp_path):
    run = tmp_path / "a run folder"  # a space: the line must be quoted to paste
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("RLVR_COMMAND", None)
    settings = ["base_model=tiny", "rank=4", "steps=1000", "problems_per_step=2", "group_size=2", "max_tokens=4",
                "eval_problems=2", "save_every=1", "keep_checkpoints=0", f"out={run}"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:  # steps=1000: the run is still going when the Ctrl-C comes
        first = subprocess.Popen(["./rlvr", "train", *settings], cwd=ROOT, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: checkpointed(run), first, "first checkpoint")
    stop(first)
    line = resume_line(log)
    assert line == f"  ./rlvr resume '{run}'"
    stopped_at = json.loads((run / "status.json").read_text())
    assert stopped_at["status"] == "interrupted" and stopped_at["resume"] == line.strip()

    log2 = tmp_path / "resume.log"
    with open(log2, "w") as out:  # the line as printed, in a shell at the clone's root
        second = subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    wait_for(lambda: max(checkpointed(run)) > stopped_at["step"], second, "checkpoint after the resume")
    stop(second)
    assert resume_line(log2) == line  # the same line again
    steps = [row["step"] for row in read_jsonl(run / "metrics.jsonl")]
    assert steps == list(range(len(steps))) and len(steps) > stopped_at["step"]  # continued, not restarted
