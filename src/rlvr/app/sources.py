"""What a run trains on: the problem source (or env dataset) of a resolved ``TrainConfig``.

    source = build_source(resolve_config(recipe="mbpp", overrides=["steps=40"]))   # the MbppSource, data and reward

:func:`build_source` turns ``config.recipe``, ``config.task`` (keyword arguments of the source), ``config.data`` and
``config.reward`` into a ``ProblemSource``, or, for the env recipes (``recipes.ENV_RECIPES``: textarena),
``config.task`` into an env dataset (``envs.RLDataset``). Bad settings are refused here, before any model loads.

Not here: the recipes' settings (``recipes.py``), the config machinery (``config.py``), the loop.
"""

from __future__ import annotations

import difflib
import inspect
from typing import TYPE_CHECKING, Any

from rlvr.app.recipes import ENV_RECIPES, GENERATED
from rlvr.errors import ConfigurationError

if TYPE_CHECKING:
    from rlvr.app.settings import TrainConfig

__all__ = ["build_source"]


def build_source(config: TrainConfig) -> Any:
    """The problem source of ``config.recipe`` with ``config.task`` as keyword arguments, its data and reward."""
    from rlvr import tasks
    from rlvr.rewards import resolve_reward

    if config.recipe in ENV_RECIPES:
        return _env_dataset(config)
    # the data recipes' classes have a hub() (their dataset on the Hugging Face hub)
    kinds: dict[str, Any] = {"arithmetic": tasks.ArithmeticSource, "rpn": tasks.RpnSource, "gsm8k": tasks.Gsm8kSource,
                             "math": tasks.MathSource, "mbpp": tasks.MbppSource, "humaneval": tasks.HumanEvalSource,
                             "reasoning-gym": tasks.ReasoningGymSource}
    cls = kinds[config.recipe]
    kwargs = dict(config.task)
    if config.reward is not None:
        kwargs["reward"] = resolve_reward(config.reward, **config.reward_config)
    elif config.reward_config:
        raise ConfigurationError("reward_config is set but reward is not: name the reward it configures "
                                 "(reward=code_tests, reward=rpn_combined, ...)")
    args: list[Any] = []
    if config.recipe in GENERATED:
        if config.data is not None:
            raise ConfigurationError(f"data={config.data!r}: recipe {config.recipe!r} generates its problems; data "
                                     "files go with gsm8k, math, mbpp and humaneval")
    elif config.recipe == "humaneval":
        if isinstance(config.data, dict):
            raise ConfigurationError("data: humaneval takes one file (HumanEval.jsonl[.gz])")
        kwargs["path"] = config.data
    else:
        if config.data is None:
            raise ConfigurationError(f"recipe {config.recipe!r} needs data: --data PATH (a local {config.recipe} "
                                     "JSONL/JSON/Parquet file, or split: file pairs in the config), or data=hub "
                                     "on a machine that reaches the Hugging Face hub")
        args.append(cls.hub() if config.data == "hub" else config.data)
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


def _env_dataset(config: TrainConfig) -> Any:
    """The env dataset of an env recipe; its tokenizer is the loop's model's (bound when the run starts)."""
    from rlvr.integrations.textarena import TextArenaDataset

    for key in ("data", "reward", "reward_config"):
        if getattr(config, key):
            raise ConfigurationError(f"{key}={getattr(config, key)!r}: recipe {config.recipe!r} plays games; the "
                                     "game's outcome is its reward and it reads no data file")
    if config.warmup.steps:
        raise ConfigurationError(f"warmup.steps={config.warmup.steps}: recipe {config.recipe!r} has no worked "
                                 "solutions to warm up on; set warmup.steps=0")
    task = dict(config.task)
    unknown = sorted(set(task) - {"env_id", "seat", "instruction"})
    if unknown:
        raise ConfigurationError(f"task: {config.recipe} takes env_id, seat and instruction, not {unknown}")
    if "env_id" not in task:
        raise ConfigurationError(f"recipe {config.recipe!r} needs task.env_id (e.g. task.env_id=TicTacToe-v0)")
    return TextArenaDataset(task["env_id"], games_per_batch=config.problems_per_step, group_size=config.group_size,
                            num_batches=config.steps, seed=config.seed, seat=task.get("seat"),
                            test_games=config.eval_problems, instruction=task.get("instruction", ""))
