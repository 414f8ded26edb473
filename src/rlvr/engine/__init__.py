"""The engine: models, LoRA, losses, optimizer, sampler and checkpoints, in PyTorch. See ``engine.py`` (and its
docstring for the sub-packages: ``models/``, ``train/``, ``sample/``, ``cpu/``, ``gpu/``)."""

from rlvr.engine.engine import Engine
from rlvr.engine.train.losses import LOSSES

__all__ = ["LOSSES", "Engine"]
