"""What a run trains on: the problem source (or env dataset) of a resolved ``TrainConfig``.

    source = build_source(resolve_config(recipe="mbpp", overrides=["steps=40"]))   # the MbppSource, data and reward

:func:`build_source` builds what ``config.recipe``'s definition (``recipes/``) names: its ``ProblemSource`` class
with ``config.task`` as keyword arguments, ``config.data`` as the recipe's data rule (``recipes.Data``) allows and
``config.reward``; or, for an env recipe, its env dataset (``envs.RLDataset``). Bad settings are refused here,
before any model loads, each naming the setting and the fix.

Not here: the recipes (``recipes/``), the config machinery (``settings.py``), the loop.
"""

from __future__ import annotations

import difflib
import inspect
from typing import TYPE_CHECKING, Any

from rlvr.app.recipes import RECIPES, get_recipe
from rlvr.app.recipes.base import Data, Recipe
from rlvr.errors import ConfigurationError

if TYPE_CHECKING:
    from rlvr.app.settings import TrainConfig

__all__ = ["build_source"]


def build_source(config: TrainConfig) -> Any:
    """The problem source of ``config.recipe`` with ``config.task`` as keyword arguments, its data and reward; or
    its env dataset."""
    recipe = get_recipe(config.recipe)
    if recipe.env is not None:
        _check_env_settings(config)
        return recipe.env(config)
    return _problem_source(recipe, config)


def _problem_source(recipe: Recipe, config: TrainConfig) -> Any:
    """``recipe.problems()`` built from ``config``: its data as ``recipe.data`` allows, its reward, its task keys."""
    from rlvr.rewards import resolve_reward

    assert recipe.problems is not None, f"recipe {recipe.name!r} has no problem source"
    cls = recipe.problems()
    kwargs = dict(config.task)
    if config.reward is not None:
        kwargs["reward"] = resolve_reward(config.reward, **config.reward_config)
    elif config.reward_config:
        raise ConfigurationError("reward_config is set but reward is not: name the reward it configures "
                                 "(reward=code_tests, reward=rpn_combined, ...)")
    args: list[Any] = []
    if recipe.data is Data.GENERATED:
        if config.data is not None:
            readers = [name for name, r in RECIPES.items() if r.data in (Data.FILE, Data.PACKAGE)]
            raise ConfigurationError(f"data={config.data!r}: recipe {config.recipe!r} generates its problems; data "
                                     f"files go with {', '.join(readers)}")
    elif recipe.data is Data.PACKAGE:
        if isinstance(config.data, dict):
            raise ConfigurationError(f"data: {config.recipe} takes one file (its problems ship in a package; a file "
                                     "of the same format replaces them), not {split: file}")
        kwargs["path"] = config.data
    else:
        if config.data is None:
            raise ConfigurationError(f"recipe {config.recipe!r} needs data: --data PATH (a local {config.recipe} "
                                     "JSONL/JSON/Parquet file, or split: file pairs in the config), or data=hub "
                                     "on a machine that reaches the Hugging Face hub")
        if config.data == "hub":
            hub = getattr(cls, "hub", None)
            if hub is None:
                raise ConfigurationError(f"data=hub: recipe {config.recipe!r} names no hub data set; give a local "
                                         "file")
            args.append(hub())
        else:
            args.append(config.data)
        if isinstance(config.data, dict):
            kwargs.pop("test_fraction", None)
    try:
        return cls(*args, **kwargs)
    except TypeError as exc:
        valid = {p for klass in cls.__mro__ if "__init__" in vars(klass)
                 for p in inspect.signature(vars(klass)["__init__"]).parameters if p not in ("self", "args", "kwargs")}
        unknown = [key for key in kwargs if key not in valid]
        hint = "".join(f" (task.{key}: did you mean task.{close[0]}?)" for key in unknown
                       if (close := difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.5)))
        raise ConfigurationError(f"task: {exc}{hint}; {cls.__name__} takes {sorted(valid - {'data'})}") from None


def _check_env_settings(config: TrainConfig) -> None:
    """An env recipe's envs make and score their episodes: no data file, reward or warm-up applies."""
    for key in ("data", "reward", "reward_config"):
        if getattr(config, key):
            raise ConfigurationError(f"{key}={getattr(config, key)!r}: recipe {config.recipe!r} plays games; the "
                                     "game's outcome is its reward and it reads no data file")
    if config.warmup.steps:
        raise ConfigurationError(f"warmup.steps={config.warmup.steps}: recipe {config.recipe!r} has no worked "
                                 "solutions to warm up on; set warmup.steps=0")
