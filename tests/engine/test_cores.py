"""engine/cores.py: an engine takes ``threads // (1 + others)`` threads while other rlvr processes compute (their
file in the busy folder touched lately), all of them again once they stop, and ``RLVR_THREADS`` when it is set.
Another process is played by a file named like a pid that the test touches."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch

from rlvr.engine import cores
from rlvr.engine.cores import CoreShare, fixed_threads
from rlvr.errors import ConfigurationError


def _share(tmp_path, threads=4, fixed=None, fresh_s=60.0):
    counts: list[int] = []
    share = CoreShare(tmp_path / "busy", threads, fixed, set_threads=counts.append, every_s=0.0, fresh_s=fresh_s)
    return share, counts


def _another_process(tmp_path, name="4000001", age_s=0.0):
    path = tmp_path / "busy" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_alone_an_engine_keeps_every_thread_and_marks_itself_computing(tmp_path):
    share, counts = _share(tmp_path)
    assert share.claim() == 4 and counts == [4]
    assert (tmp_path / "busy" / str(os.getpid())).exists()
    assert share.claim() == 4 and counts == [4]  # set once, not on every claim


def test_other_computing_processes_split_the_threads_and_give_them_back(tmp_path):
    share, counts = _share(tmp_path, threads=4, fresh_s=1.0)
    share.claim()
    one = _another_process(tmp_path, "4000001")
    assert share.claim() == 2
    _another_process(tmp_path, "4000002")
    _another_process(tmp_path, "4000003")
    assert share.claim() == 1  # 4 // 4
    _another_process(tmp_path, "4000004")
    assert share.claim() == 1  # never fewer than one
    time.sleep(1.2)  # they stop touching their files
    one.touch()
    assert share.claim() == 2
    time.sleep(1.2)
    assert share.claim() == 4
    assert counts == [4, 2, 1, 2, 4]


def test_a_file_left_by_a_killed_process_is_removed_and_not_counted(tmp_path):
    share, _ = _share(tmp_path)
    left = _another_process(tmp_path, age_s=cores.STALE_S + 10)
    assert share.claim() == 4 and not left.exists()


def test_claims_between_two_counts_cost_a_clock_reading(tmp_path):
    counts: list[int] = []
    share = CoreShare(tmp_path / "busy", 4, set_threads=counts.append, every_s=60.0)
    assert share.claim() == 4
    _another_process(tmp_path)
    assert share.claim() == 4  # not counted again within every_s
    share._next = 0.0
    assert share.claim() == 2


def test_rlvr_threads_fixes_the_count(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_THREADS", "3")
    share, counts = _share(tmp_path, threads=4, fixed=fixed_threads())
    _another_process(tmp_path)
    assert share.claim() == 3 and counts == [3]
    assert (tmp_path / "busy" / str(os.getpid())).exists()  # others still see it computing and share with it
    monkeypatch.delenv("RLVR_THREADS")
    assert fixed_threads() is None
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv("RLVR_THREADS", bad)
        with pytest.raises(ConfigurationError, match="RLVR_THREADS"):
            fixed_threads()


def test_a_folder_it_cannot_write_keeps_the_threads_and_says_so_once(tmp_path, caplog):
    (tmp_path / "busy").write_text("a file where the folder should be")
    share, counts = _share(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rlvr.engine.cores"):
        assert share.claim() == 4 and share.claim() == 4
    assert counts == [4]
    assert len([r for r in caplog.records if "RLVR_THREADS" in r.getMessage()]) == 1


def test_tick_inside_a_job_claims_again_and_does_nothing_outside_one(tmp_path):
    share, counts = _share(tmp_path)

    def long_job() -> int:
        _another_process(tmp_path)  # another process starts computing mid-job
        cores.tick()
        return counts[-1]

    assert share.run(long_job) == 2
    cores.tick()  # no job running on this thread: nothing to claim
    assert counts == [4, 2]


def test_an_engine_job_runs_on_its_share(tmp_path, monkeypatch):
    """A CPU engine's jobs run with half torch's threads (the count on the thread that made it) while another
    process computes, and all of them after."""
    from rlvr.engine.engine import Engine

    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    monkeypatch.delenv("RLVR_THREADS", raising=False)
    engine = Engine(device="cpu")
    threads = engine._executor.share.threads
    try:
        if threads < 2:
            pytest.skip(f"torch has {threads} thread here: nothing to split")
        assert engine.run(torch.get_num_threads) == threads
        time.sleep(cores.EVERY_S + 0.1)  # the engine counts again at most once a second
        other = _another_process(tmp_path)
        assert engine.run(torch.get_num_threads) == threads // 2
        os.utime(other, (time.time() - 60, time.time() - 60))
        time.sleep(cores.EVERY_S + 0.1)
        assert engine.run(torch.get_num_threads) == threads
    finally:
        engine._executor.shutdown()
