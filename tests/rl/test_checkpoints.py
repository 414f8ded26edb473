"""Loop checkpoints: the newest complete entry wins, also after a write torn by a killed process; the states live in
the run folder, pruned to ``keep_checkpoints``; older runs' states under $RLVR_HOME still resume."""

import shutil
import signal

import pytest
import torch

from rlvr.fileio import read_jsonl
from rlvr.rl.checkpoints import FILENAME, last_checkpoint, record_checkpoint


def entry(step):
    return {"step": step, "state_path": f"rlvr://run/weights/step-{step:06d}", "rng": [3, [1, 2], None]}


def test_no_file_means_no_checkpoint(tmp_path):
    assert last_checkpoint(tmp_path) is None


def test_a_checkpoint_recorded_after_a_torn_line_is_the_one_resumed(tmp_path):
    record_checkpoint(tmp_path, entry(2))
    with open(tmp_path / FILENAME, "a") as handle:
        handle.write('{"step": 3, "state_pa')  # killed mid-write: no newline
    assert last_checkpoint(tmp_path) == entry(2)
    record_checkpoint(tmp_path, entry(4))
    assert last_checkpoint(tmp_path) == entry(4)
    assert (tmp_path / FILENAME).read_text().count("\n") == 2  # the fragment is gone, each entry on its own line


# -- a run's checkpoints live in its folder, pruned as keep_checkpoints says ------------------------------------------


def states(run):
    """The checkpoint states the run folder holds, by name."""
    folder = run / "checkpoints" / "weights"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.slow
def test_a_run_keeps_what_keep_checkpoints_says_and_resumes_after_pruning(tmp_path):
    from test_loop import SayA, config, metrics_of

    from rlvr.errors import RunInterrupted
    from rlvr.rl.loop import train
    from rlvr.rl.stop import StopRequest

    straight = train(config(tmp_path / "a", steps=6, save_every=1, keep_checkpoints=2), SayA())
    assert states(tmp_path / "a" / "run") == ["step-000005", "step-000006"]  # the last two; 1-4 deleted as it went
    assert len(read_jsonl(tmp_path / "a" / "run" / FILENAME)) == 6  # the record keeps every entry

    stop = StopRequest()  # stopped after step 4 (as SIGTERM would), resumed: it ends where the straight run does
    with pytest.raises(RunInterrupted):
        train(config(tmp_path / "b", steps=6, save_every=1, keep_checkpoints=2), SayA(), stop=stop,
              progress=lambda step, m: step == 2 and stop.request(signal.SIGTERM))
    run = tmp_path / "b" / "run"
    assert states(run) == ["step-000002", "step-000003"] and last_checkpoint(run)["step"] == 3
    resumed = train(config(tmp_path / "b", steps=6, save_every=1, keep_checkpoints=2, resume=True), SayA())
    assert states(run) == ["step-000005", "step-000006"]
    a, b = metrics_of(tmp_path / "a"), metrics_of(tmp_path / "b")
    assert [m["env/all/reward/mean"] for m in a] == [m["env/all/reward/mean"] for m in b]
    wa, wb = straight["training_client"].parameters(), resumed["training_client"].parameters()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_the_final_checkpoint_is_kept_when_the_run_trains_further_and_zero_keeps_all(tmp_path):
    from test_loop import SayA, config

    from rlvr.rl.loop import train

    train(config(tmp_path, steps=2, save_every=1, keep_checkpoints=1), SayA())
    assert states(tmp_path / "run") == ["step-000002"]
    train(config(tmp_path, steps=4, save_every=1, keep_checkpoints=1, resume=True), SayA())
    assert states(tmp_path / "run") == ["step-000002", "step-000004"]  # the first part's final state stays
    train(config(tmp_path / "all", steps=3, save_every=1, keep_checkpoints=0), SayA())
    assert states(tmp_path / "all" / "run") == ["step-000001", "step-000002", "step-000003"]


def test_checkpoints_live_in_the_run_folder_and_their_rlvr_paths_resolve_there(tmp_path):
    from test_loop import SayA, config

    from rlvr.home import checkpoint_root, resolve
    from rlvr.rl.loop import train

    train(config(tmp_path, steps=1), SayA())
    entry = last_checkpoint(tmp_path / "run")
    assert entry["state_path"].startswith("rlvr://")
    assert resolve(entry["state_path"]).resolve() == (tmp_path / "run" / "checkpoints" / "weights" /
                                                                  "step-000001").resolve()
    run_id = entry["state_path"].split("/")[2]
    shutil.rmtree(tmp_path / "run")  # deleting the run folder frees its checkpoints; the next run sweeps the link
    train(config(tmp_path / "next", steps=1), SayA())
    assert not (checkpoint_root() / run_id).is_symlink()


@pytest.mark.slow
def test_an_older_run_with_checkpoints_under_rlvr_home_still_resumes_and_is_not_pruned(tmp_path):
    """Runs from before run folders owned their checkpoints: the states are real folders under $RLVR_HOME."""
    from test_loop import SayA, config

    from rlvr.home import checkpoint_root
    from rlvr.rl.loop import train

    train(config(tmp_path, steps=2, save_every=1, keep_checkpoints=0), SayA())
    run = tmp_path / "run"
    run_id = last_checkpoint(run)["state_path"].split("/")[2]
    old = checkpoint_root() / run_id
    old.unlink()  # as an older rlvr left it: the states in $RLVR_HOME, none in the run folder
    shutil.move(run / "checkpoints", old)
    train(config(tmp_path, steps=4, save_every=1, keep_checkpoints=1, resume=True), SayA())
    assert sorted(p.name for p in (old / "weights").iterdir()) == ["step-000001", "step-000002"]  # left alone
    assert states(run) == ["step-000004"]


@pytest.mark.slow
def test_a_moved_run_folder_resumes_from_its_own_copy(tmp_path):
    from test_loop import SayA, config

    from rlvr.rl.loop import train

    train(config(tmp_path / "before", steps=2, save_every=1), SayA())
    shutil.move(tmp_path / "before", tmp_path / "after")
    entry = last_checkpoint(tmp_path / "after" / "run")
    assert entry["state_path"] == str(tmp_path / "after" / "run" / "checkpoints" / "weights" / "step-000002")
    train(config(tmp_path / "after", steps=3, resume=True), SayA())
    assert last_checkpoint(tmp_path / "after" / "run")["step"] == 3


def test_disk_use_counts_the_run_folder_and_older_checkpoints_outside_it(tmp_path):
    from rlvr.app.runs import format_bytes
    from rlvr.home import checkpoint_root
    from rlvr.rl.checkpoints import disk_use

    run = tmp_path / "run"
    (run / "checkpoints" / "weights" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "weights" / "step-1" / "optimizer.pt").write_bytes(b"x" * 5000)
    (run / "metrics.jsonl").write_text("{}\n")
    outside = checkpoint_root() / "run-older" / "weights" / "step-2"
    outside.mkdir(parents=True)
    (outside / "adapter_model.safetensors").write_bytes(b"y" * 7000)
    record_checkpoint(run, {"step": 2, "state_path": "rlvr://run-older/weights/step-2"})
    assert disk_use(run) == 5000 + 3 + 7000 + (run / FILENAME).stat().st_size
    assert [format_bytes(n) for n in (812, 66_200_000, 1_300_000_000)] == ["812 B", "66.2 MB", "1.3 GB"]
