"""The parts of ``rlvr train --help`` that are facts of the code, written from it: the recipes (from the registry),
the config keys with the defaults ``rlvr train`` runs with, and the choices of ``recipe`` and ``loss_fn``.

    typer.echo(train_epilog())    # markdown: the recipe list, then one line per config key

A key's default is the one ``rlvr train`` runs with when nothing is given: the dataclass default under the default
recipe's presets (``out``: the run-folder rule, ``settings.RUN_FOLDER``); the other recipes' own values follow it.
``loss_fn`` lists the loss table's rows the RL loop can feed (``checks.rl_losses``, torch-free). Nothing here
imports torch or a task: the help is shown in a fraction of a second.

Not here: the command line itself (``cli.py``), the settings and their docs (``settings.py``, ``rl/config.py``).
"""

from __future__ import annotations

from typing import Any

from rlvr.app.checks import rl_losses
from rlvr.app.recipes import DEFAULT, RECIPES
from rlvr.app.recipes.base import Recipe
from rlvr.app.settings import RUN_FOLDER, TrainConfig, options
from rlvr.loss_inputs import LOSS_INPUTS

__all__ = ["RECIPES_FOLDER", "default_values", "recipe_line", "recipe_model", "run_values", "train_epilog"]

RECIPES_FOLDER = "src/rlvr/app/recipes/"
"""Where the recipes are defined, one module each (a path of the repository)."""

_UNSET = object()


def recipe_model(recipe: Recipe) -> str:
    """The model a recipe is for and its LoRA rank: ``smollm2-135m, LoRA 16``."""
    rank = recipe.presets.get("rank", TrainConfig.rank)
    return f"{recipe.presets['base_model']}, LoRA {rank}"


def recipe_line(recipe: Recipe) -> str:
    """The recipe's bullet in ``rlvr train --help`` (markdown)."""
    default = "default; " if recipe.name == DEFAULT else ""
    return f"- `{recipe.name}` ({default}{recipe_model(recipe)}): {recipe.description}"


def run_values(recipe: Recipe, keys: list[tuple[str, str, Any, str]] | None = None) -> dict[str, Any]:
    """Every config key (dotted) -> the value ``rlvr train --recipe NAME`` runs with when nothing else is set (the
    dataclass default, or the recipe's preset); ``keys``: ``settings.options()``, read once by the caller."""
    presets = recipe.presets_under([])
    values = {}
    for key, _, default, _ in keys or options():
        preset = _lookup(presets, key)
        values[key] = default if preset is _UNSET else preset
    values["recipe"] = recipe.name
    return values


def default_values(keys: list[tuple[str, str, Any, str]] | None = None) -> dict[str, Any]:
    """Every config key (dotted) -> the value ``rlvr train`` runs with when nothing is set (``out``: the rule that
    names a new run folder)."""
    return {**run_values(RECIPES[DEFAULT], keys), "out": RUN_FOLDER.format(recipe="<recipe>", time="<time>")}


def train_epilog() -> str:
    """The end of ``rlvr train --help``: the recipes, then every config key with its type, default and meaning."""
    lines = [f"**Recipes** (`--recipe NAME`; each a module of `{RECIPES_FOLDER}`, presetting some of the keys "
             "below):", "", *(recipe_line(recipe) for recipe in RECIPES.values()), "",
             f"**Config keys** (YAML file or key=value). A default is what `rlvr train` runs with: the default "
             f"recipe's ({DEFAULT}) where it presets one; the other recipes' own values follow it:", ""]
    keys = options()
    defaults = default_values(keys)
    each = {name: run_values(recipe, keys) for name, recipe in RECIPES.items()}
    losses = rl_losses()
    others = sorted(set(LOSS_INPUTS) - set(losses))
    choices = {"recipe": ", ".join(RECIPES),
               "loss_fn": f"{', '.join(losses)} ({', '.join(others)} need inputs the RL loop does not make)"}
    for key, kind, _, doc in keys:
        default = defaults[key]
        shown = f"`{default}`" if key == "out" else f"`{default!r}`"
        doc = doc.replace("``", "`")
        if key in choices:
            doc += f" One of: {choices[key]}."
        lines.append(f"- `{key}` ({kind}, default {shown}{_other_recipes(key, default, each)}): {doc}")
    return "\n".join(lines)


def _other_recipes(key: str, default: Any, each: dict[str, dict[str, Any]]) -> str:
    """``; mbpp `32`, textarena `16```: the recipes that run with another value of ``key`` than ``default`` (by
    name only where the value is a mapping or list); ``each``: recipe name -> :func:`run_values`."""
    if key in ("out", "recipe"):
        return ""
    others = []
    for name, values in each.items():
        if values[key] != default:
            value = values[key]
            others.append(name if isinstance(value, (dict, list)) else f"{name} `{value!r}`")
    return f"; {', '.join(others)}" if others else ""


def _lookup(presets: dict[str, Any], key: str) -> Any:
    """The preset of dotted ``key`` (``warmup.steps``), or ``_UNSET``."""
    node: Any = presets
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _UNSET
        node = node[part]
    return node
