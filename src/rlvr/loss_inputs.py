"""What each built-in loss needs from its datums, without torch: the loss table's names and ``loss_fn_inputs``.

    fed_by(frozenset({"logprobs", "advantages"}))   # ['cispo', 'dro', 'importance_sampling', 'ppo']: the RL loop's

The loss table itself (``engine/train/losses.py``, ``LOSSES``) imports torch; this copy of its names and inputs is
what ``rlvr train --help`` lists without loading torch. A test checks that it matches ``LOSSES`` row for row, and
that :func:`fed_by` accepts the losses ``client.check_loss`` accepts.

Not here: the losses, their configs and their checks (``engine/train/losses.py``, ``client.check_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LOSS_INPUTS", "LossInputs", "fed_by"]


@dataclass(frozen=True)
class LossInputs:
    """What one loss needs besides ``target_tokens``."""

    inputs: tuple[str, ...]
    """Its ``loss_fn_inputs`` keys (``LossSpec.inputs``)."""
    provenance: bool = False
    """Every datum must carry provenance (``LossSpec.provenance``)."""


LOSS_INPUTS: dict[str, LossInputs] = {
    "cross_entropy": LossInputs(("weights",)),
    "importance_sampling": LossInputs(("logprobs", "advantages")),
    "ppo": LossInputs(("logprobs", "advantages")),
    "cispo": LossInputs(("logprobs", "advantages")),
    "dro": LossInputs(("logprobs", "advantages")),
    "gspo": LossInputs(("logprobs", "advantages", "sequence_ratio_mask")),
    "stable_reinforce": LossInputs(("logprobs", "advantages"), provenance=True),
}
"""Loss name -> what it needs, one row per row of ``LOSSES``."""


def fed_by(inputs: frozenset[str]) -> list[str]:
    """The losses, sorted, that a caller making ``inputs`` (besides ``target_tokens``) and no provenance can feed."""
    return sorted(name for name, row in LOSS_INPUTS.items() if set(row.inputs) <= inputs and not row.provenance)
