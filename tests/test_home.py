"""The run index under $RLVR_HOME: one atomic entry per run folder, safe when runs start at once, pruned of folders
that are gone."""

import json
import threading

import pytest

from rlvr.home import index_run, indexed_runs, run_index


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def run_folder(path):
    path.mkdir(parents=True)
    (path / "status.json").write_text('{"status": "running"}')
    return path


def test_a_run_indexed_twice_is_one_entry_and_deleted_folders_are_pruned(home, tmp_path, monkeypatch):
    a, b = run_folder(tmp_path / "a"), run_folder(tmp_path / "x" / "b")
    monkeypatch.chdir(tmp_path / "x")
    index_run("b")  # a relative folder is indexed by its absolute path
    index_run(a)
    index_run(a)  # resumed: the same entry
    assert sorted(indexed_runs()) == sorted([a, b])
    assert len(list(run_index().iterdir())) == 2
    (b / "status.json").unlink()
    b.rmdir()
    (a / "status.json").unlink()  # a folder that no longer holds a run
    assert indexed_runs() == []
    assert list(run_index().iterdir()) == []


def test_runs_starting_at_once_each_get_a_whole_entry(home, tmp_path):
    """Eight threads index 25 folders each, all of them also the same shared folder, at once: every entry is whole
    JSON, none is lost, no temporary file is left."""
    shared = run_folder(tmp_path / "shared")
    folders = [[run_folder(tmp_path / f"t{t}" / f"run{i}") for i in range(25)] for t in range(8)]
    start = threading.Barrier(8)

    def index(mine):
        start.wait()
        for folder in mine:
            index_run(folder)
            index_run(shared)

    threads = [threading.Thread(target=index, args=(mine,)) for mine in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = list(run_index().iterdir())
    assert len(entries) == 8 * 25 + 1 and all(e.suffix == ".json" for e in entries)
    assert {json.loads(e.read_text())["path"] for e in entries} == {str(f) for m in folders for f in m} | {str(shared)}
    assert sorted(indexed_runs()) == sorted([shared, *(f for m in folders for f in m)])


def test_an_entry_not_written_by_rlvr_is_skipped(home, tmp_path):
    index_run(run_folder(tmp_path / "a"))
    (run_index() / "junk.json").write_text("not json")
    (run_index() / "list.json").write_text("[1, 2]")
    assert indexed_runs() == [tmp_path / "a"]
