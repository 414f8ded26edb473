"""`rlvr runs` on real runs of tiny: a run made with out= elsewhere is listed, a deleted one is pruned, sft and resumed
runs are indexed, and a run stopped (or failed) before its first step says so."""

import os
import shutil
import signal

import pytest
from rich.console import Console
from typer.testing import CliRunner

import rlvr
from rlvr.cli import app
from rlvr.client import ServiceClient
from rlvr.errors import RunInterrupted
from rlvr.home import run_index

TINY = {"recipe": "arithmetic", "base_model": "tiny", "steps": 1, "problems_per_step": 2, "group_size": 2,
        "max_tokens": 2, "eval_problems": 2, "task": {"num_train": 8, "num_test": 2}}


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A home and a current folder of the test's own, the runs made elsewhere."""
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    return tmp_path


def train(out, **settings):
    return rlvr.train({**TINY, "out": str(out), **settings}, console=Console(quiet=True))


def listed():
    """`rlvr runs`'s table: run folder -> its other cells."""
    result = CliRunner().invoke(app, ["runs"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][:4] == ["run", "task", "status", "steps"]
    rows = [[cell.strip() for cell in line.strip("│ ").split("│")] for line in lines if line.startswith("│")]
    return {row[0]: row[1:] for row in rows}


def broken(*args, **kwargs):
    raise OSError("the model's file is damaged")


def test_a_run_made_elsewhere_is_listed_and_a_deleted_one_pruned(here, monkeypatch):
    elsewhere = here / "elsewhere" / "mine"
    train(elsewhere)
    monkeypatch.setattr(ServiceClient, "create_lora_training_client", broken)
    with pytest.raises(OSError, match="damaged"):
        train("runs/local")  # under ./runs, as the default out= puts it
    rows = listed()
    assert set(rows) == {str(elsewhere.resolve()), "runs/local"}
    assert rows[str(elsewhere.resolve())][:3] == ["arithmetic", "finished", "1/1"]
    shutil.rmtree(elsewhere)
    assert set(listed()) == {"runs/local"}
    assert len(list(run_index().iterdir())) == 1  # the deleted folder's entry is gone, runs/local's stays


def test_sft_and_resumed_runs_are_indexed(here):
    pairs = here / "pairs.jsonl"
    pairs.write_text('{"prompt": "1 + 1", "completion": "2"}\n')
    settings = {"data": str(pairs), "base_model": "tiny", "rank": 4, "steps": 1, "batch_size": 1,
                "out": str(here / "sft-run")}
    rlvr.sft(settings)
    assert listed()[str((here / "sft-run").resolve())][:3] == ["sft", "finished", "1/1"]
    shutil.rmtree(run_index())  # an index lost (or a run from before it): the resume adds the run again
    assert listed() == {}
    rlvr.resume(here / "sft-run", ["steps=2"])
    assert listed()[str((here / "sft-run").resolve())][:3] == ["sft", "finished", "2/2"]


def test_a_run_stopped_or_failed_before_its_first_step_says_so(here, monkeypatch):
    """Ctrl-C while the model loads (the signal delivered to the process, as a person's would be), and an error
    there: 0/1 steps, and the status says it ended before its first step, not just "interrupted"."""
    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("the signal should have stopped the run")

    monkeypatch.setattr(ServiceClient, "create_lora_training_client", interrupted)
    with pytest.raises(RunInterrupted):
        train(here / "stopped")

    monkeypatch.setattr(ServiceClient, "create_lora_training_client", broken)
    with pytest.raises(OSError, match="damaged"):
        train(here / "failed")
    rows = listed()
    stopped = rows[str((here / "stopped").resolve())]
    assert stopped[:6] == ["arithmetic", "interrupted before its first step", "0/1", "-", "-", "-"]
    assert rows[str((here / "failed").resolve())][:3] == ["arithmetic", "failed before its first step", "0/1"]


def test_the_task_column_comes_from_the_run_record(here):
    """A loop-only run (no recipe) is ``loop``, not guessed as sft; an sft run is ``sft``, recorded or (a folder from
    before the kind was recorded) guessed; a folder whose recorded kind was edited by hand is ``?``."""
    from rlvr.app.runs import describe_run

    runs = {name: here / "runs" / name for name in ("loop", "sft", "old-sft", "edited")}
    configs = {"loop": "kind: rl\ngroup_size: 4\n", "sft": "kind: sft\ndata: pairs.jsonl\n",
               "old-sft": "data: pairs.jsonl\nbatch_size: 2\n", "edited": "kind: dpo\n"}
    for name, folder in runs.items():
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(configs[name])
    assert {name: describe_run(folder).kind for name, folder in runs.items()} == {
        "loop": "loop", "sft": "sft", "old-sft": "sft", "edited": "?"}
