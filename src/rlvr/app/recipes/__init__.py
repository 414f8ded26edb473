"""The recipe registry: the named runs of ``rlvr train --recipe NAME``, one module each in this package.

    recipe = get_recipe("mbpp")                      # its Recipe: presets, data rule, problem source, description
    config = resolve_config(recipe="mbpp", overrides=["steps=40"])   # settings.py: defaults < recipe < file < ...

Every module of this package but ``base`` defines one ``RECIPE = Recipe(...)`` (``base.py`` says what a recipe
holds); importing the package imports them all, in name order, into :data:`RECIPES`. Adding a recipe means one
module here and its test: ``rlvr train --help`` lists it, ``recipe=`` takes it, ``sources.build_source`` builds its
source, and ``tests/app/test_recipes.py`` asks for its row in the README's recipe table. :func:`register` adds one
from elsewhere (a plugin, a test). Cheap to import: no task, model or torch.

Not here: the config machinery (``settings.py``), building a config's source (``sources.py``), the loop.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from typing import Any

from rlvr.app.recipes.base import Data, Recipe
from rlvr.errors import ConfigurationError

__all__ = ["DEFAULT", "PRESETS", "RECIPES", "Data", "Recipe", "get_recipe", "register"]

DEFAULT = "arithmetic"
"""The recipe ``rlvr train`` runs when none is named."""


def _discover() -> dict[str, Recipe]:
    """The ``RECIPE`` of each module of this package, by recipe name."""
    found: dict[str, Recipe] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module_info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        recipe = getattr(module, "RECIPE", None)
        if not isinstance(recipe, Recipe):
            raise ConfigurationError(f"{module.__name__} defines no RECIPE = Recipe(...); each module of "
                                     f"{__name__} is one recipe")
        if recipe.name in found:
            raise ConfigurationError(f"{module.__name__}: recipe {recipe.name!r} is defined twice; rename one")
        found[recipe.name] = recipe
    return dict(sorted(found.items()))


RECIPES: dict[str, Recipe] = _discover()
"""Recipe name -> its :class:`Recipe`, in the order ``rlvr train --help`` and the README list them."""


def register(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES` (after the built-in ones); a name taken already is refused."""
    if recipe.name in RECIPES:
        raise ConfigurationError(f"recipe {recipe.name!r} is registered already; give yours another name")
    RECIPES[recipe.name] = recipe
    return recipe


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``, or a ConfigurationError naming the recipes there are (and the nearest one)."""
    if name not in RECIPES:
        close = difflib.get_close_matches(str(name), list(RECIPES), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigurationError(f"recipe={name!r}: choose one of {sorted(RECIPES)}{hint}")
    return RECIPES[name]


class _Presets(Mapping[str, dict[str, Any]]):
    """Recipe name -> the settings it presets, ``other_models`` among them when it has some (a copy each time)."""

    def __getitem__(self, name: str) -> dict[str, Any]:
        recipe = RECIPES[name]
        presets = copy.deepcopy(dict(recipe.presets))
        return {**presets, "other_models": dict(recipe.other_models)} if recipe.other_models else presets

    def __iter__(self) -> Iterator[str]:
        return iter(RECIPES)

    def __len__(self) -> int:
        return len(RECIPES)


PRESETS: Mapping[str, dict[str, Any]] = _Presets()
"""Recipe name -> the settings it presets (everything else keeps the dataclass default), read from :data:`RECIPES`;
``other_models``: settings that replace the recipe's own on any other ``base_model``."""
