"""GSM8K word problems (``--data``: a JSONL with question/answer, answers ending in ``#### n``).

SmolLM2-135M never ends a GSM8K answer in ``\\boxed{}`` on its own, so a supervised warm-up on the training solutions
(rewritten to end in ``\\boxed{n}``) comes first, then RL on ``format_correct``; the settings were chosen on a
validation split cut from GSM8K train (docs/training.md#gsm8k-and-mbpp-on-2-cores).
"""

from __future__ import annotations

from rlvr.app.recipes.base import Data, Recipe, task_source

RECIPE = Recipe(
    name="gsm8k",
    description="GSM8K-format JSONL (`--data`); on smollm2-135m a supervised warm-up on the training solutions "
                "(ending in `\\boxed{n}`), then RL on `format_correct` (correct + 0.1 x (boxed - 1))",
    origin="measured on a validation split ([training](docs/training.md#gsm8k-and-mbpp-on-2-cores))",
    presets={
        "base_model": "smollm2-135m", "rank": 32, "steps": 15, "problems_per_step": 4, "group_size": 8,
        "max_tokens": 200, "learning_rate": 2e-4, "temperature": 0.7, "eval_problems": 64,
        "task": {"test_fraction": 0.1},
        "warmup": {"steps": 100, "batch_size": 8, "learning_rate": 1e-3},
    },
    data=Data.FILE,
    problems=task_source("Gsm8kSource"),
    # 200 tokens cut 61% of a real Qwen2.5-0.5B-Instruct's baseline answers (it reasons step by step at length)
    other_models={"max_tokens": 512},
)
