"""Any reasoning-gym dataset (the ``rlvr[reasoning-gym]`` extra), scored by the dataset's own ``score_answer``.

``task.name=NAME task.config={...}``, or ``task.name=composite task.config={datasets: [{name: ..., weight: ...}]}``.
The preset ``task.config`` belongs to the preset ``task.name``: naming another dataset starts from that dataset's
defaults (``Recipe.presets_under``). The default, one-digit ``a + b`` / ``a - b`` (``basic_arithmetic``), was
picked among chain_sum, leg_counting, gcd and basic_arithmetic as the one whose SmolLM2 baseline is in 10-60%, with
the arithmetic recipe's loop settings (docs/training.md).
"""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="reasoning-gym",
    description="any [reasoning-gym](https://github.com/open-thought/reasoning-gym) dataset or weighted composite "
                "(`rlvr[reasoning-gym]`), scored by its own `score_answer`; default one-digit `basic_arithmetic`",
    origin="a measured run ([Benchmarks](#benchmarks))",
    presets={
        "base_model": "smollm2-135m", "steps": 20, "problems_per_step": 4, "group_size": 8, "max_tokens": 16,
        "learning_rate": 2e-4, "eval_problems": 64, "save_every": 10,
        "task": {"name": "basic_arithmetic", "num_train": 500, "num_test": 64, "answer_format": "final",
                 "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
                            "allow_parentheses": False, "allow_negation": False},
                 "instruction": "Answer with only the number."},
    },
    data=Data.GENERATED,
    problems=task_source("ReasoningGymSource"),
)
