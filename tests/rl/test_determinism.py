"""Same seed, same run: a run killed (SIGKILL) and resumed ends bit for bit like the uninterrupted one, every float
of metrics.jsonl (timings aside) and the final adapter weights, with one metrics row per step. Each comparison is also
one of separate processes with the same settings: the killed process's steps are compared with the uninterrupted
process's, and so are the resuming process's.

Each run is a fresh Python process (its own hash seed, kernel timing and thread start-up), on this machine's default
kernels (RLVR_MATMUL unset). These train the tiny model (SayA, and the rpn recipe with a warm-up);
``test_determinism_smollm2.py`` does the same for SmolLM2-135M as ``rlvr train`` runs it.
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlvr.engine import checkpoint
from rlvr.fileio import read_jsonl
from rlvr.home import resolve
from rlvr.rl.checkpoints import WARMUP, last_checkpoint

pytestmark = pytest.mark.slow  # whole runs in fresh processes, killed and resumed

SRC = Path(__file__).resolve().parents[2] / "src"
TIMINGS = ("time/", "tokens_per_s")  # wall-clock readings: the only numbers allowed to differ

# Kill switches the child script installs before training (``DIE``): inside the second checkpoint's state write, or
# a number of seconds after the first checkpoint's record.
_PRELUDE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from rlvr import startup
# torch, transformers and tinker with the collector paused, as `rlvr train` imports them (it names rlvr.rl.loop,
# which here must wait for the patches below: they replace names it imports)
startup.import_modules("rlvr.client")
DIE = {die!r}
if DIE == "inside_second_checkpoint":
    import torch
    import rlvr.engine.checkpoint as ckpt
    write, writes = ckpt.write, []
    def dying_write(path, files):
        writes.append(path)
        if len(writes) == 2:
            save = torch.save
            def save_then_die(obj, f, *a, **k):
                save(obj, f, *a, **k)
                os.kill(os.getpid(), signal.SIGKILL)
            torch.save = save_then_die
        return write(path, files)
    ckpt.write = dying_write
TIMING = {timing!r}
if DIE.startswith("random:") or TIMING:  # times from the first checkpoint's record; a kill that many seconds after it
    import threading, time
    import rlvr.rl.checkpoints as cps
    record, marks = cps.record_checkpoint, []
    def record_and_time(run_dir, entry):
        record(run_dir, entry)
        marks.append(time.monotonic())
        if TIMING:
            Path(TIMING).write_text(str(marks[-1] - marks[0]))  # the last record's time after the first
        if DIE and len(marks) == 1:
            timer = threading.Timer(float(DIE.split(":")[1]), os.kill, (os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()
    cps.record_checkpoint = record_and_time
"""

_TINY = """
from test_loop import SayA, config
from rlvr.rl.loop import train
train(config(Path({out!r}), steps=6, save_every=2, resume={resume!r}), SayA())
"""

_SMOLLM2 = """
from rlvr.app.run import resume, train
if {resume!r}:
    resume({out!r})
else:
    train(overrides=["steps=3", "save_every=1", "problems_per_step=2", "group_size=4", "max_tokens=4",
                     "eval_problems=1", "seed=7", "out={out}"])
"""

# The rpn recipe on tiny as `rlvr train` runs it: a supervised warm-up (6 steps, checkpointed every 2), then RL
# (4 steps, checkpointed every 2). PHASE_KILLS stop it in each phase; `rlvr.resume` continues it.
_WARMED = """
from rlvr.app.run import resume, train
from rich.console import Console
if {resume!r}:
    resume({out!r}, console=Console(quiet=True))
else:
    train(overrides=["recipe=rpn", "rank=8", "steps=4", "save_every=2", "problems_per_step=2", "group_size=4",
                     "max_tokens=8", "eval_problems=2", "task.num_train=40", "warmup.steps=6", "warmup.batch_size=4",
                     "warmup.save_every=2", "out={out}"], console=Console(quiet=True))
"""

PHASE_KILLS = """
import rlvr.rl.checkpoints as cps
from rlvr.rl import tracking
record, log = cps.record_checkpoint, tracking.JsonlTracker.log
def record_then_die(run_dir, entry, filename=cps.FILENAME):
    record(run_dir, entry, filename)
    if DIE == "in_warmup" and filename == cps.WARMUP and entry["step"] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
def log_then_die(self, metrics, step):
    log(self, metrics, step)
    if DIE == "in_rl_before_its_first_checkpoint" and step == 0 or DIE == "in_rl" and step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
cps.record_checkpoint, tracking.JsonlTracker.log = record_then_die, log_then_die
"""


def run_process(body: str, out: Path, resume: bool = False, die: str = "", timing: Path | None = None
                ) -> subprocess.CompletedProcess:
    """Train (or resume) in a fresh Python process, optionally killing it as ``die`` says (``random:S``: S seconds
    after the first checkpoint is recorded); ``timing``: a file that receives the seconds from the first checkpoint's
    record to the last's."""
    script = textwrap.dedent(_PRELUDE.format(tests=str(Path(__file__).parent), die=die,
                                             timing=str(timing) if timing else "")
                             + body.format(out=str(out), resume=resume))
    env = {k: v for k, v in os.environ.items() if k not in ("RLVR_MATMUL", "PYTHONHASHSEED")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])  # this checkout's rlvr
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1800)


def run_to_the_end(body: str, out: Path, resume: bool = False, timing: Path | None = None) -> Path:
    """Train (or resume) ``body`` into ``out`` in a fresh process that must finish (``timing``: as ``run_process``);
    returns ``out``."""
    done = run_process(body, out, resume=resume, timing=timing)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def final_adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.read_adapter(resolve(last_checkpoint(run_dir)["state_path"]))


def assert_same_run(a: Path, b: Path, steps: int) -> None:
    """Every non-timing float of metrics.jsonl equal, one row per step in order, the final adapters equal."""
    rows_a, rows_b = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert [r["step"] for r in rows_a] == list(range(steps))
    assert [r["step"] for r in rows_b] == list(range(steps))
    for row_a, row_b in zip(rows_a, rows_b, strict=True):
        assert row_a.keys() == row_b.keys()
        differ = {k: (row_a[k], row_b[k]) for k in row_a if not k.startswith(TIMINGS) and row_a[k] != row_b[k]}
        assert not differ, f"step {row_a['step']}: {differ}"
    weights_a, weights_b = final_adapter(a), final_adapter(b)
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a), "the final adapters differ"


def check_kill_and_resume(straight: Path, tmp_path: Path, body: str, run: str, steps: int) -> None:
    """Killed inside the second checkpoint's write, and at a random moment between the first checkpoint and the last
    (drawn from the uninterrupted run's timing, so on a machine busier then it may fall after the killed run's final
    checkpoint, with nothing left to resume; the seed is in the message): each resumed run equals the uninterrupted
    one (``straight``, its timing in the ``timing`` file beside it). A kill just after a checkpoint's metrics row is
    the warm-up run's ``in_rl`` below."""
    seed = random.randrange(2**32)
    delays = random.Random(seed).uniform(0, float((straight.parent / "timing").read_text()))
    for die, resumes_from in (("inside_second_checkpoint", 2), (f"random:{delays:.3f}", None)):
        out = tmp_path / die.split(":")[0]
        killed = run_process(body, out, die=die)
        if resumes_from is None and killed.returncode == 0:  # the draw outlived this (slower or faster) run
            continue
        assert killed.returncode == -signal.SIGKILL, (die, seed, killed.stderr[-3000:])
        if resumes_from is not None:
            assert last_checkpoint(out / run)["step"] == resumes_from
            assert max(r["step"] for r in read_jsonl(out / run / "metrics.jsonl")) >= resumes_from  # rows to drop
        # A random kill may land after the run's final checkpoint, on its way out: then nothing is left to resume.
        if resumes_from is not None or last_checkpoint(out / run)["step"] < steps:
            done = run_process(body, out, resume=True)
            assert done.returncode == 0, (die, seed, done.stderr[-3000:])
        assert_same_run(straight / run, out / run, steps)
        rollouts = sorted(p.name for p in (out / run / "rollouts").glob("step-*.jsonl"))
        assert rollouts == [f"step-{s:06d}.jsonl" for s in range(steps)], (die, seed)


@pytest.fixture(scope="module")
def tiny_straight(tmp_path_factory) -> Path:
    """The uninterrupted tiny run, shared: every killed run is compared with it."""
    out = tmp_path_factory.mktemp("tiny") / "straight"
    return run_to_the_end(_TINY, out, timing=out.parent / "timing")


def test_a_killed_and_resumed_tiny_run_equals_the_uninterrupted_one(tiny_straight, tmp_path):
    check_kill_and_resume(tiny_straight, tmp_path, _TINY, "run", 6)


@pytest.fixture(scope="module")
def warmed_straight(tmp_path_factory) -> Path:
    """The uninterrupted run with a warm-up that the killed ones are compared with."""
    return run_to_the_end(_WARMED, tmp_path_factory.mktemp("warmed") / "straight")


def test_a_run_with_a_warm_up_killed_in_each_phase_in_turn_resumes_to_the_uninterrupted_one(warmed_straight,
                                                                                           tmp_path):
    """One run killed three times, each resume killed at the next point: after the warm-up's first checkpoint; after
    the loop's first step (no RL checkpoint yet: the loop starts again from the warm-up's state); after the loop's
    first checkpoint, with a metrics row past it to drop. The last ``rlvr.resume`` ends where the uninterrupted run
    does, its warm-up rows, metrics rows and final adapter alike. Each resume starts from what the kill before it
    left, so one that lost or repeated anything shows in that end."""
    for resume, die in ((False, "in_warmup"), (True, "in_rl_before_its_first_checkpoint"), (True, "in_rl")):
        killed = run_process(PHASE_KILLS + _WARMED, tmp_path, resume=resume, die=die)
        assert killed.returncode == -signal.SIGKILL, (die, killed.stderr[-3000:])
        warmup_steps = [row["step"] for row in read_jsonl(tmp_path / "warmup.jsonl")]
        rl_steps = [row["step"] for row in read_jsonl(tmp_path / "metrics.jsonl")] if die != "in_warmup" else []
        rl_checkpoint = last_checkpoint(tmp_path)
        if die == "in_warmup":
            assert last_checkpoint(tmp_path, WARMUP)["step"] == 2 and warmup_steps == [0, 1], warmup_steps
            assert not (tmp_path / "metrics.jsonl").exists()
        else:  # the warm-up ended; the loop had begun
            assert warmup_steps == list(range(6)) and last_checkpoint(tmp_path, WARMUP)["step"] == 6, warmup_steps
        if die == "in_rl_before_its_first_checkpoint":
            assert rl_checkpoint is None and rl_steps == [0], (rl_checkpoint, rl_steps)
        if die == "in_rl":
            assert rl_checkpoint["step"] == 2 and rl_steps == [0, 1, 2], (rl_checkpoint, rl_steps)
    run_to_the_end(_WARMED, tmp_path, resume=True)
    assert_same_run(warmed_straight, tmp_path, 4)
    warmup_a, warmup_b = read_jsonl(warmed_straight / "warmup.jsonl"), read_jsonl(tmp_path / "warmup.jsonl")
    assert [row["step"] for row in warmup_b] == list(range(6)) and warmup_a == warmup_b
