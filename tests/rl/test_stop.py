"""A clean stop (rl/stop.py, app/status.py): SIGTERM or Ctrl-C finish the step in flight, checkpoint it, mark the run
interrupted, print the command that resumes it and exit with 128 + the signal; the resumed run ends where the
uninterrupted one does. A second Ctrl-C stops at once. Nothing the run started (reward workers, Ray) is left
running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_determinism import assert_same_run
from test_loop import SayA, config

from rlvr.errors import RunInterrupted
from rlvr.fileio import read_jsonl
from rlvr.rl.checkpoints import last_checkpoint
from rlvr.rl.loop import train
from rlvr.rl.stop import StopRequest

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["base_model=tiny", "steps=8", "save_every=3", "problems_per_step=2", "group_size=4", "max_tokens=6",
        "eval_problems=4", "task.num_train=20", "task.num_test=8", "seed=5"]


def rlvr(*args: str) -> subprocess.Popen:
    """``rlvr ARGS`` in a fresh process (this checkout's rlvr), output captured."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def rows(run: Path) -> list[dict]:
    return read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []


def wait_for_row(process: subprocess.Popen, run: Path, step: int) -> None:
    deadline = time.monotonic() + 300
    while not any(r["step"] == step for r in rows(run)):
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the run never reached the step"
        time.sleep(0.01)


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (reward workers and their like), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


@pytest.mark.slow
def test_sigterm_between_checkpoints_checkpoints_the_step_reached_and_resumes_to_the_uninterrupted_run(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    uninterrupted = rlvr("train", *TINY, f"out={straight}")

    run = rlvr("train", *TINY, f"out={stopped}")
    wait_for_row(run, stopped, 3)  # 4 steps done; checkpoints at 3 and 6: the next step is between them
    children = descendants(run.pid)
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=300)[0]
    assert run.returncode == 143, output  # 128 + SIGTERM
    assert children and not alive(children), "reward workers outlived the run"

    status = json.loads((stopped / "status.json").read_text())
    reached = last_checkpoint(stopped)["step"]
    assert status["status"] == "interrupted" and status["signal"] == "SIGTERM", status
    assert 4 < reached < 8 and reached != 6, reached  # the stop's own checkpoint, not a scheduled one
    assert status["step"] == reached == len(rows(stopped))  # every step it logged is in the checkpoint
    assert f"checkpoint at step {reached}/8" in output
    assert f"  rlvr resume {stopped}\n" in output  # the one command, unwrapped

    assert uninterrupted.wait(timeout=600) == 0, uninterrupted.stdout.read()
    resumed = rlvr("resume", str(stopped))
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    assert json.loads((stopped / "status.json").read_text())["status"] == "finished"
    assert_same_run(straight, stopped, 8)


@pytest.mark.slow
def test_sigterm_stops_a_ray_run_cleanly_and_its_cluster_goes_with_it(tmp_path):
    """ray.init takes SIGTERM for itself (it would end the run at once, marked failed): the run takes it back."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    run = rlvr("train", *TINY, "steps=30", "distributed.backend=ray", f"out={out}")
    wait_for_row(run, out, 0)
    children = descendants(run.pid)  # the local Ray instance, its actors and reward workers
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=300)[0]
    assert run.returncode == 143, output
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "interrupted" and status["step"] == last_checkpoint(out)["step"] > 0, status
    deadline = time.monotonic() + 30
    while alive(children) and time.monotonic() < deadline:  # Ray's own processes take a moment to go
        time.sleep(0.5)
    assert children and not alive(children), "Ray processes outlived the run"


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    out = tmp_path / "run"  # steps of a few seconds: the second Ctrl-C comes while the first one's step runs
    run = rlvr("train", *TINY, "steps=400", "save_every=0", "problems_per_step=8", "group_size=8", "max_tokens=48",
               f"out={out}")
    wait_for_row(run, out, 0)
    run.send_signal(signal.SIGINT)
    said: list[str] = []  # the second once the first is taken: two at once would arrive as one
    while not said or "SIGINT: finishing the step in flight" not in said[-1]:
        said.append(run.stdout.readline())
        assert said[-1], "".join(said)  # the output ended without saying so
    run.send_signal(signal.SIGINT)
    output = "".join(said) + run.communicate(timeout=120)[0]
    assert run.returncode == 130, output  # 128 + SIGINT
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "interrupted" and status["signal"] == "SIGINT"
    assert status["step"] == 0 and last_checkpoint(out) is None, output  # the step in flight was not finished
    assert f"rlvr resume {out}" in output


def test_the_loop_finishes_the_step_in_flight_checkpoints_it_and_raises(tmp_path):
    stop = StopRequest()

    def stop_during(step, metrics):  # as a signal arriving in step 1 would
        if step == 0:
            stop.request(signal.SIGTERM)

    with pytest.raises(RunInterrupted) as raised:
        train(config(tmp_path, steps=6, save_every=4), SayA(), progress=stop_during, stop=stop)
    assert raised.value.step == 1 and raised.value.exit_code == 143
    assert last_checkpoint(tmp_path / "run")["step"] == 1  # the step in flight when the signal came
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0]


def test_a_stop_in_an_evaluation_or_a_second_request_ends_at_once():
    stop = StopRequest()
    with stop.abandonable():
        with pytest.raises(RunInterrupted):
            stop.request(signal.SIGTERM)  # nothing to keep: at once
    again = StopRequest()
    again.request(signal.SIGINT)  # a step in flight: it finishes
    assert again.requested
    with pytest.raises(RunInterrupted):
        again.request(signal.SIGINT)  # the second: at once
    with pytest.raises(RunInterrupted), again.abandonable():
        pass  # asked for already: nothing abandonable starts


@pytest.mark.slow
def test_rlvr_sft_stopped_and_resumed_ends_with_the_uninterrupted_weights(tmp_path):
    import rlvr as api
    from rlvr.app.sft import SftConfig, sft

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{i}+1?", "completion": f"{i + 1}"}) + "\n" for i in range(8)))
    settings = dict(data=str(pairs), base_model="tiny", rank=4, steps=4, batch_size=2, seed=3)
    straight = sft(SftConfig(**settings, out=str(tmp_path / "a")))
    stop = StopRequest()

    def stop_after(step, metrics):
        if step == 1:
            stop.request(signal.SIGTERM)

    from unittest import mock

    with mock.patch("rlvr.app.status.StopRequest", return_value=stop), pytest.raises(RunInterrupted):
        sft(SftConfig(**settings, out=str(tmp_path / "b")), progress=stop_after)
    status = json.loads((tmp_path / "b" / "status.json").read_text())
    assert status["status"] == "interrupted" and status["step"] == 2 and status["kind"] == "sft"
    resumed = api.resume(tmp_path / "b")
    service = api.ServiceClient()
    a = service.create_training_client_from_state(straight).parameters()
    b = service.create_training_client_from_state(resumed).parameters()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")] == [0, 1, 2, 3]
