"""Simplexity's setup: a small transformer from scratch, a supervised warm-up on worked solutions, then RL.

The tiny byte-level model with full-rank LoRA on every layer, arithmetic mod 5 (Simplexity's modular processes) with
one or two operators, rewarded by the combined boxed/correct reward. The held-out expressions are new combinations of
steps seen in training, so held-out accuracy measures composition, not recall.
"""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="rpn",
    description="reverse-Polish expressions mod 5 with 1-2 operators, `tiny` from random weights (LoRA on every "
                "layer): a supervised warm-up on worked solutions, then RL with `rpn_combined` (0.2 x format + 0.8 x "
                "correct; `rpn_format`, `rpn_correct` alone)",
    origin="Simplexity's RLVR document",
    presets={
        # on 2 cores: warm-up (600 steps) ~1.5 min, RL ~1.5 min; tuned by hand (warm-up 300 steps or RL lr 1e-3 lost
        # held-out accuracy; 30 RL steps gained +0.09, 60 steps +0.13)
        "base_model": "tiny", "rank": 96, "steps": 60, "problems_per_step": 16, "group_size": 8, "max_tokens": 64,
        "learning_rate": 2e-4, "eval_problems": 64, "reward": "rpn_combined",
        "reward_config": {"boxed_weight": 0.2, "correct_weight": 0.8},
        "task": {"complexity_range": [1, 2], "max_operand": 4, "modulus": 5, "operators": "+-", "num_train": 2000,
                 "num_test": 64, "instruction": ""},
        "warmup": {"steps": 600, "batch_size": 32, "learning_rate": 3e-3},
    },
    data=Data.GENERATED,
    problems=task_source("RpnSource"),
)
