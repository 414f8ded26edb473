"""What a recipe is: one named run of ``rlvr train --recipe NAME``, defined once (:class:`Recipe`).

    RECIPE = Recipe(name="arithmetic", description="procedural `a + b` / `a - b`, ...", origin="a measured run",
                    presets={"base_model": "smollm2-135m", "steps": 20, ...}, data=Data.GENERATED,
                    problems=task_source("ArithmeticSource"))   # the rlvr.tasks class, imported when asked for

A recipe owns its presets (settings over ``TrainConfig``'s defaults, for the model it names), how its problems are
made (``problems``: a ``ProblemSource`` class, with ``task`` as its keyword arguments; or ``env``: a function from
the config to an env dataset), its data rule (:class:`Data`: what ``data=`` it takes) and one line saying what it
trains on. The registry (``recipes/__init__.py``) collects them; ``sources.build_source`` builds the source.

Invariants, checked as a recipe is made: a name without spaces; exactly one of ``problems`` and ``env``, and
``data`` is :attr:`Data.NONE` exactly for ``env``; ``presets`` names ``base_model``; the description is one line.
Importing this module imports no task, model or torch: ``problems`` and ``env`` import what they need when called.

Not here: the registry, the config machinery (``settings.py``), building a source from a config (``sources.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlvr.errors import ConfigurationError
from rlvr.model_names import unaliased

if TYPE_CHECKING:
    from rlvr.app.settings import TrainConfig
    from rlvr.tasks.base import ProblemSource

__all__ = ["Data", "Recipe", "task_source"]


def task_source(name: str) -> Callable[[], type[ProblemSource]]:
    """``Recipe.problems`` for the ``ProblemSource`` class ``rlvr.tasks.<name>``, imported when a run builds its
    source, not when the registry loads."""
    def load() -> type[ProblemSource]:
        import rlvr.tasks

        source: type[ProblemSource] = getattr(rlvr.tasks, name)
        return source

    return load


class Data(enum.Enum):
    """A recipe's data rule: where its problems come from, and so what ``data=`` it takes."""

    GENERATED = "generated"
    """The source generates its problems from ``task`` settings; ``data=`` is refused."""
    FILE = "file"
    """A data set: ``data=`` is required (a local JSONL/JSON/Parquet file, ``{split: file}``, or ``hub``)."""
    PACKAGE = "package"
    """Problems shipped in a Python package; ``data=`` may name one file of the same format instead."""
    NONE = "none"
    """An env recipe: its envs make and score the episodes; ``data=``, ``reward=`` and a warm-up are refused."""


@dataclass(frozen=True)
class Recipe:
    """One recipe: its name, presets, problem source or env dataset, data rule and description."""

    name: str
    """What ``--recipe`` / ``recipe=`` takes."""
    description: str
    """One line, in markdown: what it trains on and how it is rewarded (``rlvr train --help``, the README table)."""
    origin: str
    """Where its settings come from (the README table's "defaults from" column)."""
    presets: Mapping[str, Any]
    """Settings over ``TrainConfig``'s defaults (nested ones as dicts: ``task``, ``warmup``, ``reward_config``),
    for the model it names in ``base_model``."""
    data: Data
    """What ``data=`` it takes."""
    problems: Callable[[], type[ProblemSource]] | None = None
    """Returns its ``ProblemSource`` class (imported when called); ``task`` is the class's keyword arguments."""
    env: Callable[[TrainConfig], Any] | None = None
    """For an env recipe: the config -> its env dataset (``envs.RLDataset``), its ``task`` keys checked."""
    other_models: Mapping[str, Any] = field(default_factory=dict)
    """Settings that replace its own on any other ``base_model`` (a larger ``max_tokens``: a larger model writes
    longer answers than the one the budget was chosen for)."""

    def __post_init__(self) -> None:
        where = f"Recipe(name={self.name!r})"
        if not self.name or any(c.isspace() for c in self.name):
            raise ConfigurationError(f"{where}: name must be one word (what --recipe takes)")
        if (self.problems is None) == (self.env is None):
            raise ConfigurationError(f"{where}: give exactly one of problems= (a ProblemSource class) and env= "
                                     "(a function from the config to an env dataset)")
        if (self.env is not None) != (self.data is Data.NONE):
            raise ConfigurationError(f"{where}: data=Data.NONE goes with env=, and only with it (got {self.data})")
        if "base_model" not in self.presets:
            raise ConfigurationError(f"{where}: presets must name base_model, the model its settings are for")
        for key in ("description", "origin"):
            text = getattr(self, key)
            if not text or "\n" in text or "|" in text:
                raise ConfigurationError(f"{where}: {key} must be one line of text without '|' (a table cell)")

    def presets_under(self, layers: list[dict[str, Any]]) -> dict[str, Any]:
        """The presets under ``layers`` (file, overrides...), less those that belong to a setting the layers change:

        - a recipe's ``task.config`` configures its ``task.name``, so it is left out when a layer names another
          dataset (``task.name=gcd`` starts from gcd's own defaults instead of failing on the preset dataset's keys);
        - a recipe's warm-up is for the model it names, which needs it (SmolLM2-135M never ends a GSM8K answer in
          ``\\boxed{}`` on its own; rpn's ``tiny`` starts from random weights), so on another ``base_model`` it runs
          only when asked (a layer sets ``warmup.steps``): an instruct model given by folder, GGUF file or hub id
          starts RL at once. The warm-up's other presets stay, for ``warmup.steps=N`` to use;
        - :attr:`other_models` (a larger ``max_tokens``) replaces its own settings on another ``base_model`` (a
          layer's own value still wins); a recipe without them keeps its budget there, and the run warns when more
          than a quarter of the answers hit it (``progress.clipped_warning``).
        """
        presets = dict(self.presets)
        task = presets.get("task", {})
        named = [layer["task"]["name"] for layer in layers
                 if isinstance(layer.get("task"), dict) and "name" in layer["task"]]
        if "config" in task and named and named[-1] != task.get("name"):
            presets = {**presets, "task": {k: v for k, v in task.items() if k != "config"}}
        models = [layer["base_model"] for layer in layers if "base_model" in layer]
        asked = any(isinstance(layer.get("warmup"), dict) and "steps" in layer["warmup"] for layer in layers)
        warmup = presets.get("warmup", {})
        another = bool(models) and unaliased(models[-1]) != presets["base_model"]
        if warmup.get("steps") and another and not asked:
            presets = {**presets, "warmup": {**warmup, "steps": 0}}
        if another:  # a layer that sets one of these wins over it, as over any preset
            presets = {**presets, **self.other_models}
        return presets
