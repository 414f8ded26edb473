"""The run record (``rl/run_record.py``): typed checkpoint entries on the same lines as before, the run's kind and
numerics in config.yaml, saving + recording + pruning in one call for the RL loop, the warm-up and sft alike, and
run folders written before it (``tests/fixtures/old_runs``, by a44f118) resuming to an uninterrupted run's end."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from test_loop import SayA, config

import rlvr
from rlvr.errors import ConfigurationError, RunFileError
from rlvr.fileio import read_jsonl
from rlvr.rl import checkpoints
from rlvr.rl.run_record import Checkpoint, RunRecord, state_name

OLD_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "old_runs"
TIMINGS = ("time/", "tokens_per_s")


def states(run: Path) -> list[str]:
    """The states the run folder holds, by name."""
    folder = run / "checkpoints" / "weights"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# -- entries and config.yaml, without a model ------------------------------------------------------------------------


def test_entries_read_back_typed_and_older_lines_take_their_files_kind(tmp_path):
    rng = random.Random(5)
    rng.random()
    entry = Checkpoint(kind="rl", step=3, state_path="rlvr://r/weights/step-000003", final=True,
                       rng=json.loads(json.dumps(rng.getstate())), numerics={"precision": "float32"})
    checkpoints.record_checkpoint(tmp_path, entry.to_json())
    # the lines the code before the record wrote: the loop's (rng, no kind), the warm-up's (no kind), sft's (kind)
    checkpoints.record_checkpoint(tmp_path, {"step": 4, "state_path": "p4", "rng": entry.rng})
    checkpoints.record_checkpoint(tmp_path, {"step": 2, "state_path": "w2", "final": True}, checkpoints.WARMUP)
    record = RunRecord(tmp_path)
    assert record.checkpoints("rl") == [entry, Checkpoint("rl", 4, "p4", rng=entry.rng)]
    assert record.last("warmup") == Checkpoint("warmup", 2, "w2", final=True)
    assert record.checkpoints("sft") == []  # checkpoints.jsonl here holds the loop's entries only
    restored = random.Random()
    restored.setstate(record.last("rl").random_state())
    assert restored.random() == rng.random()  # the loop's RNG continues where it was saved
    line = json.loads((tmp_path / checkpoints.FILENAME).read_text().splitlines()[0])
    assert line == {"step": 3, "state_path": "rlvr://r/weights/step-000003", "rng": entry.rng, "final": True,
                    "kind": "rl", "numerics": {"precision": "float32"}}  # today's keys, two added
    assert checkpoints.last_checkpoint(tmp_path)["step"] == 4  # the untyped reader still reads it


def test_a_damaged_entry_is_an_error_naming_the_fix(tmp_path):
    checkpoints.record_checkpoint(tmp_path, {"state_path": "p"})
    with pytest.raises(RunFileError, match="lacks a valid 'step'.*remove the line"):
        RunRecord(tmp_path).last("rl")


def test_config_records_the_kind_and_numerics_and_reads_back_as_settings(tmp_path):
    from rlvr.app.settings import resolve_config

    record = RunRecord(tmp_path / "run")
    settings = resolve_config(overrides=["base_model=tiny", "steps=3"])
    record.write_config(settings, "rl", numerics={"precision": "float32"})
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["kind"] == "rl" and saved["numerics"] == {"precision": "float32"} and saved["steps"] == 3
    assert RunRecord(tmp_path / "run").kind == "rl" and RunRecord(tmp_path / "run").numerics == {"precision":
                                                                                                   "float32"}
    assert "kind" not in record.settings() and "numerics" not in record.settings()
    # a run's config.yaml given back to rlvr train (--config) or rlvr eval: the settings, not the record's keys
    assert resolve_config(config_file=tmp_path / "run" / "config.yaml") == settings
    with pytest.raises(ValueError, match="kind='warmup'"):
        record.write_config(settings, "warmup")  # type: ignore[arg-type]


def test_folders_from_before_the_kind_was_recorded_are_guessed_as_before(tmp_path):
    """rlvr train's config names a recipe, the loop's has a group size, sft's neither; the numerics of an older
    folder are its recorded precision."""
    for name, values, kind in (("train", {"recipe": "rpn", "group_size": 8, "precision": "bfloat16"}, "rl"),
                               ("loop", {"group_size": 8}, "rl"), ("sft", {"data": "p.jsonl", "rank": 4}, "sft")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(values))
        assert RunRecord(tmp_path / name).kind == kind, name
    assert RunRecord(tmp_path / "train").numerics == {"precision": "bfloat16"}
    assert RunRecord(tmp_path / "loop").numerics is None
    (tmp_path / "sft" / "config.yaml").write_text(yaml.safe_dump({"kind": "ppo"}))
    with pytest.raises(RunFileError, match="kind='ppo' is not one of"):
        _ = RunRecord(tmp_path / "sft").kind
    with pytest.raises(ConfigurationError, match="is not a run folder"):
        RunRecord(tmp_path / "none").settings()


class SavingClient:
    """A training client that saves an empty state into the run folder (a plain path, as a moved run's are)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def save_state(self, name: str):
        folder = self.run_dir / "checkpoints" / "weights" / name
        folder.mkdir(parents=True)
        (folder / "rlvr.json").write_text("{}")

        class Done:
            def result(self):
                return type("Saved", (), {"path": str(folder)})()

        return Done()


def test_save_records_and_prunes_each_kind_in_its_own_list(tmp_path):
    record = RunRecord(tmp_path)
    record.write_config(config(tmp_path), "rl", numerics={"precision": "float32"})
    client = SavingClient(tmp_path)
    for step in (1, 2, 3):
        record.save(client, "warmup", step, final=step == 3, keep=1)
    for step in (1, 2, 3):
        record.save(client, "rl", step, keep=2, rng=random.Random(step))
    assert states(tmp_path) == ["step-000002", "step-000003", "warmup-000003"]
    assert [e.step for e in record.checkpoints("warmup")] == [1, 2, 3]  # the record keeps every entry
    assert all(e.numerics == {"precision": "float32"} for e in record.checkpoints("rl") + record.checkpoints("warmup"))
    assert record.last("rl").random_state() == random.Random(3).getstate()
    assert record.reached() == record.last("rl")
    with pytest.raises(ConfigurationError, match="at step 3 and steps=3: nothing remains"):
        record.resume_point("rl", 3)
    assert record.resume_point("rl", 4).step == 3
    assert [state_name("rl", 3), state_name("warmup", 3), state_name("sft", 3), state_name("sft", 9, final=True)] \
        == ["step-000003", "warmup-000003", "sft-000003", "sft-final"]


def test_summary_reads_back_what_was_written(tmp_path):
    record = RunRecord(tmp_path)
    assert record.summary() == {}
    record.write_summary({"baseline": {"test/correct": 0.25}, "after": {}})
    assert RunRecord(tmp_path).summary() == {"baseline": {"test/correct": 0.25}, "after": {}}


# -- the three writers on tiny -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_loop_the_warm_up_and_sft_save_through_one_record(tmp_path, monkeypatch):
    """Each writer saves every step, keeping 1: each entry comes through ``RunRecord.save``, reads back as the one
    entry type with its kind and the run's numerics, and only the kept states (the last, and the final ones) stay."""
    from rich.console import Console

    from rlvr.app.sft import SftConfig, sft
    from rlvr.rl.loop import train

    saves: list[tuple[str, str, int]] = []
    real_save = RunRecord.save

    def spied(self, training_client, kind, step, **kwargs):
        saves.append((self.run_dir.name, kind, step))
        return real_save(self, training_client, kind, step, **kwargs)

    monkeypatch.setattr(RunRecord, "save", spied)

    train(config(tmp_path / "loop", rank=2, steps=3, save_every=1, keep_checkpoints=1), SayA())
    rlvr.train({"recipe": "rpn", "rank": 2, "steps": 1, "problems_per_step": 2, "group_size": 2, "max_tokens": 4,
                "eval_problems": 2, "keep_checkpoints": 1, "task": {"num_train": 20, "num_test": 2},
                "warmup": {"steps": 3, "batch_size": 2, "save_every": 1}, "out": str(tmp_path / "warm")},
               console=Console(quiet=True))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{i}?", "completion": f"{i}!"}) + "\n" for i in range(4)))
    sft(SftConfig(data=str(pairs), base_model="tiny", rank=2, steps=3, batch_size=2, save_every=1,
                  keep_checkpoints=1, out=str(tmp_path / "sft")))

    assert saves == [("run", "rl", 1), ("run", "rl", 2), ("run", "rl", 3),
                     ("warm", "warmup", 1), ("warm", "warmup", 2), ("warm", "warmup", 3), ("warm", "rl", 1),
                     ("sft", "sft", 1), ("sft", "sft", 2), ("sft", "sft", 3)]
    loop, warm, tuned = RunRecord(tmp_path / "loop" / "run"), RunRecord(tmp_path / "warm"), RunRecord(tmp_path / "sft")
    for record, kind, steps in ((loop, "rl", [1, 2, 3]), (warm, "warmup", [1, 2, 3]), (warm, "rl", [1]),
                                (tuned, "sft", [1, 2, 3])):
        entries = record.checkpoints(kind)
        assert [type(e) for e in entries] == [Checkpoint] * len(steps) and [e.kind for e in entries] == [kind] * len(
            steps), (record.run_dir, kind)
        assert [e.step for e in entries] == steps and [e.final for e in entries] == [False] * (len(steps) - 1) + [True]
        assert all(e.numerics == record.numerics and e.numerics["precision"] for e in entries)
        assert all((e.rng is not None) == (kind == "rl") for e in entries)
    assert [loop.kind, warm.kind, tuned.kind] == ["rl", "rl", "sft"]
    assert states(loop.run_dir) == ["step-000003"]
    assert states(warm.run_dir) == ["step-000001", "warmup-000003"]
    assert states(tuned.run_dir) == ["sft-final"]


# -- run folders written before the record ---------------------------------------------------------------------------


def copy_old_run(name: str, to: Path) -> Path:
    shutil.copytree(OLD_RUNS / name, to)
    return to


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMINGS)}


@pytest.mark.slow
def test_an_rl_run_folder_from_before_the_record_resumes_to_the_uninterrupted_runs_end(tmp_path):
    """The fixture's loop run (2 steps, its final state kept) trained on to 4 steps equals a 4-step run, its older
    entries read as the loop's, its new ones typed and pruned."""
    from rlvr.rl.loop import train

    settings = dict(rank=1, steps=4, save_every=1, keep_checkpoints=1)
    old = copy_old_run("rl", tmp_path / "old" / "run")
    straight = train(config(tmp_path / "straight", **settings), SayA())
    before = read_jsonl(OLD_RUNS / "rl" / "metrics.jsonl")
    # Bit for bit only where this machine computes the fixture's first steps as the one that wrote it did (another
    # matmul kernel rounds otherwise); the rest holds everywhere.
    same_arithmetic = [comparable(r) for r in before] == [comparable(r) for r in read_jsonl(
        tmp_path / "straight" / "run" / "metrics.jsonl")[:2]]
    record = RunRecord(old)
    assert record.kind == "rl" and [e.kind for e in record.checkpoints("rl")] == ["rl", "rl"]
    resumed = train(config(tmp_path / "old", **settings, resume=True), SayA())

    rows_a, rows_b = read_jsonl(tmp_path / "straight" / "run" / "metrics.jsonl"), read_jsonl(old / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == [0, 1, 2, 3]
    assert rows_b[:2] == before  # the fixture's own rows are kept, the resumed ones follow
    if same_arithmetic:
        assert [comparable(r) for r in rows_a] == [comparable(r) for r in rows_b]
        wa, wb = straight["training_client"].parameters(), resumed["training_client"].parameters()
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [(e.step, e.numerics is None) for e in record.checkpoints("rl")] == [(1, True), (2, True), (3, False),
                                                                               (4, False)]
    assert states(old) == ["step-000002", "step-000004"]  # the old final state stays, step 3 was pruned
    assert yaml.safe_load((old / "config.yaml").read_text())["kind"] == "rl"


@pytest.mark.slow
def test_an_sft_run_folder_from_before_the_record_resumes_to_the_uninterrupted_runs_end(tmp_path):
    """The fixture's ``rlvr sft`` run, stopped after its first step, continued by ``rlvr.resume`` (its kind guessed
    as before) ends with the weights of a run that was never stopped."""
    from rlvr.app.sft import SftConfig, sft

    pairs = shutil.copy(OLD_RUNS / "pairs.jsonl", tmp_path / "pairs.jsonl")
    old = copy_old_run("sft", tmp_path / "old")
    straight = sft(SftConfig(data=str(pairs), base_model="tiny", rank=1, steps=3, batch_size=2, seed=3,
                             out=str(tmp_path / "straight")))
    before = read_jsonl(old / "metrics.jsonl")
    same_arithmetic = before == read_jsonl(tmp_path / "straight" / "metrics.jsonl")[:1]  # (as in the RL test)
    assert RunRecord(old).kind == "sft" and RunRecord(old).last("sft").step == 1
    resumed = rlvr.resume(old, overrides=[f"data={pairs}"])

    assert [r["step"] for r in read_jsonl(old / "metrics.jsonl")] == [0, 1, 2]
    if same_arithmetic:
        service = rlvr.ServiceClient()
        a = service.create_training_client_from_state(straight).parameters()
        b = service.create_training_client_from_state(resumed).parameters()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert read_jsonl(old / "metrics.jsonl") == read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert [(e.kind, e.step, e.final) for e in RunRecord(old).checkpoints("sft")] == [("sft", 1, False),
                                                                                     ("sft", 3, True)]
    assert yaml.safe_load((old / "config.yaml").read_text())["kind"] == "sft"
