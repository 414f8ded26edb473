"""The torch-free copy of the loss table's names and inputs (``rlvr/loss_inputs.py``) is the table's."""

from rlvr.app.checks import RL_INPUTS
from rlvr.engine.train.losses import LOSSES
from rlvr.loss_inputs import LOSS_INPUTS, LossInputs, fed_by


def test_each_row_is_the_loss_tables():
    assert LOSS_INPUTS == {name: LossInputs(spec.inputs, spec.provenance) for name, spec in LOSSES.items()}


def test_fed_by_chooses_as_check_loss_does():
    assert fed_by(RL_INPUTS) == sorted(name for name, spec in LOSSES.items()
                                       if set(spec.inputs) <= RL_INPUTS and not spec.provenance)
    assert fed_by(RL_INPUTS) == ["cispo", "dro", "importance_sampling", "ppo"]
    assert fed_by(frozenset({"weights"})) == ["cross_entropy"]
    assert "gspo" in fed_by(RL_INPUTS | {"sequence_ratio_mask"}) and "stable_reinforce" not in fed_by(RL_INPUTS)
