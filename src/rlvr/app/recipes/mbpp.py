"""PostTrain-Lab's MBPP RLVR config, after a supervised warm-up on the training split's reference solutions.

Rank 32, 4 samples, temperature 0.8, 400 tokens, PPO clip 0.8/1.2, reward 1.0 / 0.5 x fraction passed / -0.5
(``code_tests``, run in the sandbox); the warm-up is about two passes over MBPP train's 374. Give ``--data`` (MBPP
JSONL).
"""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="mbpp",
    description="MBPP JSONL (`--data`); on smollm2-135m a warm-up on the reference solutions, then `code_tests` in "
                "the sandbox: 1.0 / 0.5 x fraction / -0.5; group 4, temperature 0.8, 400 tokens, PPO clip 0.8/1.2, "
                "lr 5e-5",
    origin="PostTrain-Lab's MBPP document",
    presets={
        "base_model": "smollm2-135m", "rank": 32, "steps": 20, "problems_per_step": 10, "group_size": 4,
        "temperature": 0.8, "max_tokens": 400, "learning_rate": 5e-5, "loss_fn": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "eval_problems": 32,
        "reward": "code_tests", "reward_config": {"pass_reward": 1.0, "partial_scale": 0.5, "fail_reward": -0.5},
        "task": {"test_fraction": 0.2},
        "warmup": {"steps": 100, "batch_size": 8, "learning_rate": 1e-3},
    },
    data=Data.FILE,
    problems=task_source("MbppSource"),
    other_models={"max_tokens": 768},
)
