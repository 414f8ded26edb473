"""Everything about a run that can be checked without its model, checked before the model loads.

    source = check_run(config)     # the run's problem source, or ConfigurationError / ModelLoadError naming the fix

:func:`check_run` is what ``rlvr train --check`` does, and what ``rlvr train`` and :func:`rlvr.train` do first, so a
setting that cannot work fails in seconds rather than after the model has loaded and the baseline was evaluated:

- the loss: ``loss_fn`` is a row of the loss table (``engine/train/losses.py`` ``LOSSES``) that the RL loop can
  feed (its datums carry the sampler's ``logprobs`` and ``advantages``), and ``loss_fn_config`` holds only that
  loss's keys, with numbers that fit it;
- the task: the recipe, its ``task`` keys and its ``reward`` (the reward registry), as ``sources.build_source``
  builds them; a local data file's records, each read and mapped to a problem (a missing field names the record);
- the model: ``base_model`` names something that can load (``load.check_base_model``): a built-in name, a file or
  folder that exists, or a hub id the local cache holds or the hub answers for (none asked with HF_HUB_OFFLINE=1);
- the run folder ``out``: a folder, or one that can be created, where this user may write.

What it is not: the settings' own validation of types and ranges (``settings.py``, ``rl/config.py``, done as the
config is built), or anything that needs the model (a prompt longer than its context, a chat template).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.app.recipes import get_recipe
from rlvr.app.recipes.base import Data
from rlvr.app.sources import build_source
from rlvr.errors import ConfigurationError
from rlvr.loss_inputs import fed_by

if TYPE_CHECKING:
    from rlvr.app.settings import TrainConfig

__all__ = ["check_loss", "check_out", "check_run", "rl_losses"]

RL_INPUTS = frozenset({"logprobs", "advantages"})
"""The ``loss_fn_inputs`` the RL loop's datums carry besides ``target_tokens`` (``rl/datums.py``)."""


def rl_losses() -> list[str]:
    """The built-in losses the RL loop can feed, sorted, without torch: the ones :func:`check_loss` accepts."""
    return fed_by(RL_INPUTS)


def check_run(config: TrainConfig) -> Any:
    """Check ``config`` as the module docstring lists, those that need no torch first (a typo in a task key is
    refused before torch loads); returns its problem source (or env dataset), its local data read."""
    check_out(config.out)
    source = build_source(config)
    reads_files = get_recipe(config.recipe).data in (Data.FILE, Data.PACKAGE)
    if reads_files and config.data != "hub" and hasattr(source, "splits"):
        for split in source.splits():  # every record mapped to a problem: a missing field fails here
            source.problems(split)
    check_loss(config.loss_fn, config.loss_fn_config)
    from rlvr.client import check_base_model

    check_base_model(config.base_model)
    return source


def check_loss(loss_fn: str, loss_fn_config: dict[str, Any] | None) -> None:
    """ConfigurationError unless ``loss_fn`` is a built-in loss the RL loop can train with and ``loss_fn_config``
    fits it (its keys, their values)."""
    from rlvr import client

    client.check_loss(loss_fn, loss_fn_config, RL_INPUTS)


def check_out(out: str | os.PathLike) -> None:
    """ConfigurationError unless run folder ``out`` is a folder this user may write in, or can be created as one
    (tried by making and removing an empty folder in it, or in its nearest existing parent)."""
    path = Path(out).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"out={str(out)!r} is a file, not a folder; give a folder for the run (it is "
                                 "created if missing)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigurationError(f"out={str(out)!r}: {str(existing)!r} is a file, so the run folder cannot be "
                                 "created under it; choose another out")
    try:  # a folder made and removed again: permissions, a read-only disk or /proc alike
        os.rmdir(tempfile.mkdtemp(prefix=".rlvr-check-", dir=existing))
    except OSError as exc:
        raise ConfigurationError(f"out={str(out)!r}: cannot create a folder in {str(existing)!r} ({exc.strerror}); "
                                 "choose an out folder you can write to") from None
