"""The public data types, which are Tinker's own (``tinker.types``), so code written for Tinker builds its inputs
unchanged: ``from rlvr import types`` works wherever ``from tinker import types`` did."""

from tinker import types as _tinker_types
from tinker.types import *  # noqa: F403

__all__ = sorted(name for name in vars(_tinker_types) if not name.startswith("_"))
