"""The run application's settings: ``TrainConfig`` (the loop's settings plus the task, its data, its reward and a
supervised warm-up) and their YAML + ``key=value`` form (the recipes that preset them: ``recipes.py``).

    config = resolve_config(recipe="mbpp", config_file="my.yaml", overrides=["steps=40", "task.few_shot=1"])

Precedence, lowest first: the dataclass defaults, the recipe's presets, the YAML file, the overrides. Dotted keys
reach nested settings (``distributed.backend=ray``, ``loss_fn_config.clip_low_threshold=0.8``); values are read as
YAML (``task.levels=[1,2]``, ``reward=null``). Validation is strict and fast (this module imports neither torch nor
the engine): an unknown key names the nearest valid one, a value of the wrong type names the key and the type.

What it is not: the loop's own settings (``rlvr.rl.config.LoopConfig``), the recipes, or the building of problem
sources from a config (``sources.py``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import inspect
import itertools
import re
import types as pytypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from rlvr.app.recipes import RECIPES, quick_presets, recipe_presets
from rlvr.errors import ConfigurationError
from rlvr.rl.config import LoopConfig


@dataclass
class WarmupConfig:
    """Supervised warm-up on the task's worked solutions before RL (cross_entropy; 0 steps = none)."""

    steps: int = 0
    """Supervised steps before RL. A recipe's warm-up is for its own model: with another base_model it runs only
    when this is set."""
    batch_size: int = 16
    """Problems per supervised step."""
    learning_rate: float = 1e-3
    """AdamW learning rate of the warm-up."""
    save_every: int = 50
    """Checkpoint the warm-up every this many steps (and at its end), so that ``rlvr resume`` continues it."""


@dataclass
class TrainConfig(LoopConfig):
    """Everything ``rlvr train`` needs: the loop's settings plus the task, its data and its reward."""

    recipe: str = "arithmetic"
    """Preset to start from: arithmetic, rpn, gsm8k, math, mbpp, humaneval, reasoning-gym."""
    task: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the recipe's problem source (levels, num_train, instruction, few_shot, ...)."""
    data: str | dict[str, str] | None = None
    """Local problem file (JSONL/JSON/Parquet), or {split: file}; recipes over data sets need it."""
    reward: str | None = None
    """Reward name (see rlvr.rewards); None keeps the task's default."""
    reward_config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the reward (e.g. boxed_weight, correct_weight for rpn_combined)."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Supervised warm-up before RL."""

    def __post_init__(self) -> None:
        if isinstance(self.warmup, dict):
            self.warmup = WarmupConfig(**self.warmup)
        super().__post_init__()
        files = self.data.values() if isinstance(self.data, dict) else [self.data] if self.data else []
        for file in files:
            if file != "hub" and not Path(file).is_file():
                raise ConfigurationError(f"data: file {file!r} does not exist (give a local JSONL/JSON/Parquet "
                                         "file, or data=hub where the Hugging Face hub is reachable)")
        if self.recipe not in RECIPES:
            raise ConfigurationError(f"recipe={self.recipe!r}: choose one of {sorted(RECIPES)}"
                                     f"{_nearest(self.recipe, RECIPES)}")


def resolve_config(recipe: str | None = None, config_file: str | Path | None = None,
                   overrides: list[str] | None = None, base: dict[str, Any] | None = None,
                   quick: bool = False) -> TrainConfig:
    """The validated config from defaults < recipe < ``base`` (e.g. a saved run's config) < file < overrides;
    ``quick``: the recipe's presets cut to a first look (``recipes.quick_presets``: a few steps and problems)."""
    layers: list[dict[str, Any]] = []
    if base:
        layers.append(base)
    if config_file is not None:
        layers.append(read_config_file(config_file))
    layers.append(parse_overrides(overrides or []))
    if recipe is not None:
        layers.append({"recipe": recipe})
    name = next((layer["recipe"] for layer in reversed(layers) if "recipe" in layer), "arithmetic")
    if name not in RECIPES:
        raise ConfigurationError(f"recipe={name!r}: choose one of {sorted(RECIPES)}{_nearest(name, RECIPES)}")
    merged: dict[str, Any] = {"recipe": name}
    presets = recipe_presets(name, layers)
    for layer in [quick_presets(presets) if quick else presets, *layers]:
        merged = merge_layers(merged, layer)
    return build_config(merged)


def as_config(config: TrainConfig | dict[str, Any] | str | Path | None,
              overrides: list[str] | None = None) -> TrainConfig:
    """A TrainConfig from one (with ``overrides`` applied), a dict of settings or a YAML file's path."""
    if isinstance(config, TrainConfig):
        return resolve_config(base=dataclasses.asdict(config), overrides=overrides) if overrides else config
    if isinstance(config, (str, Path)):
        return resolve_config(config_file=config, overrides=overrides)
    return resolve_config(base=config or {}, overrides=overrides)


def build_config(values: dict[str, Any], cls: type = TrainConfig) -> Any:
    """``cls`` from a plain dict, refusing unknown keys (with the nearest valid one) and values of the wrong type."""
    check_keys(values, cls)
    from pydantic import TypeAdapter, ValidationError  # pydantic validates stdlib dataclasses, nested ones too

    try:
        return TypeAdapter(cls).validate_python(values, strict=False)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {message} (got {error.get('input')!r:.60})" if key else message)
        raise ConfigurationError("invalid config: " + "; ".join(problems)) from None


def check_keys(values: dict[str, Any], cls: type, prefix: str = "") -> None:
    """Raise ConfigurationError for a key ``cls`` does not have, naming the nearest valid key."""
    if not isinstance(values, dict):
        raise ConfigurationError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of settings, got "
                                 f"{type(values).__name__} {values!r:.60}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            raise ConfigurationError(f"unknown config key {prefix + str(key)!r}{_nearest(str(key), fields, prefix)}; "
                                     "`rlvr train --help` lists every key")
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            check_keys(value, hints[key], prefix=f"{prefix}{key}.")


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1,2]"]`` -> ``{"a": {"b": 1}, "c": [1, 2]}`` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"override {item!r}: write key=value (dotted keys for nested settings, e.g. "
                                     "distributed.backend=ray)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
            if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads 1e-3 as a string
                value = float(value)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"override {item!r}: the value is not valid YAML ({exc})") from None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigurationError(f"override {item!r}: {part!r} was given a value and nested keys")
        node[parts[-1]] = value
    return out


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML (or JSON) config file as a dict; a missing or malformed file is a ConfigurationError. A run folder's
    ``config.yaml`` also records the numerics its run resolved (``numerics:``, ``rlvr.numerics``): a record, not a
    setting, so it is left out."""
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"config file {str(path)!r} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigurationError(f"config file {str(path)!r}: expected a mapping of settings at the top level")
    values.pop("numerics", None)
    return values


def options(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, doc) of every setting, nested ones flattened, for ``--help``."""
    docs = _field_docs(cls)
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += options(kind, prefix=f"{prefix}{f.name}.")
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append((prefix + f.name, _type_name(kind), default, docs.get(f.name, "")))
    return out


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string after each field) of ``cls`` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(kind: Any) -> str:
    if get_origin(kind) in (Union, pytypes.UnionType):
        return " | ".join(_type_name(k) for k in get_args(kind))
    if kind is type(None):
        return "null"
    return getattr(kind, "__name__", str(kind)) if get_origin(kind) is None else str(kind).replace("typing.", "")


def merge_layers(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``; nested dicts merge key by key (so ``task.few_shot=1`` keeps the recipe's task)."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_layers(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _nearest(key: str, valid: Any, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""
