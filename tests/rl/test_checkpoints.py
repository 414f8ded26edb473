"""Loop checkpoints: the newest complete entry wins, also after a write torn by a killed process."""

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
