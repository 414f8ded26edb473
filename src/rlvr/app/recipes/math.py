"""MATH-style problems with ``\\boxed{}`` answers (``--data``)."""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="math",
    description="MATH-style `\\boxed{}` answers (`--data`)",
    origin="tinker-cookbook's RL page",
    presets={
        "base_model": "smollm2-135m", "steps": 50, "problems_per_step": 8, "group_size": 8, "max_tokens": 384,
        "learning_rate": 1e-4, "eval_problems": 64, "task": {"test_fraction": 0.1},
    },
    data=Data.FILE,
    problems=task_source("MathSource"),
    other_models={"max_tokens": 1024},
)
