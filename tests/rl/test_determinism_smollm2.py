"""Same seed, same run on SmolLM2-135M as ``rlvr train`` runs it, as briefly as shows the point (3 steps, 2 problems of
4 samples, 4 tokens, a checkpoint every step, one held-out problem): a run killed (SIGKILL) inside its second
checkpoint's write resumes to the uninterrupted run's end, bit for bit. That is also a comparison of three processes
with one seed: the killed one's first two steps, and the resuming one's last two, against the uninterrupted one's.

Every kill point (after a checkpoint, inside one, at a random moment) is shown on tiny in ``test_determinism.py``;
what a kill can break is the run's bookkeeping, which is the same for every model, so here the real model goes
through the hardest one: the write of the state a resume would read.
"""

import signal
from pathlib import Path

import pytest
from test_determinism import _SMOLLM2, assert_same_run, run_process, run_to_the_end

from rlvr.rl.checkpoints import last_checkpoint

STEPS = 3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run that the killed and resumed one is compared with."""
    return run_to_the_end(_SMOLLM2, tmp_path_factory.mktemp("smollm2") / "straight")


def test_a_smollm2_run_killed_inside_a_checkpoint_write_resumes_to_the_uninterrupted_one(straight, tmp_path):
    out = tmp_path / "killed"
    killed = run_process(_SMOLLM2, out, die="inside_second_checkpoint")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert last_checkpoint(out)["step"] == 1  # the second checkpoint (step 2) never completed
    run_to_the_end(_SMOLLM2, out, resume=True)
    assert_same_run(straight, out, STEPS)
