"""The engine: models, LoRA, losses, optimizer, sampler and checkpoints, in PyTorch. See ``engine.py``."""

from rlvr.engine.engine import Engine
from rlvr.engine.losses import LOSSES

__all__ = ["LOSSES", "Engine"]
