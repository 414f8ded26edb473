"""The default recipe: one-digit addition and subtraction on SmolLM2, visible held-out gains in minutes on 2 cores.

The prompt asks for only the number, and the grader credits just that: the whole reply is the answer
(``answer_form="whole"``).
"""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="arithmetic",
    description='procedural `a + b` / `a - b`, "Answer with only the number.", `math_correct` on the whole reply',
    origin="a measured run ([Benchmarks](#benchmarks))",
    presets={
        "base_model": "smollm2-135m", "steps": 20, "problems_per_step": 4, "group_size": 8, "max_tokens": 16,
        "learning_rate": 2e-4, "eval_problems": 64, "save_every": 10, "reward": "math_correct",
        "reward_config": {"answer_form": "whole"},
        "task": {"levels": [1], "num_train": 120, "num_test": 64, "instruction": "Answer with only the number."},
    },
    data=Data.GENERATED,
    problems=task_source("ArithmeticSource"),
)
