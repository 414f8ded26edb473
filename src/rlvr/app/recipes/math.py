"""MATH-style problems with ``\\boxed{}`` answers (``--data``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlvr.app.recipes.base import Data, Recipe

if TYPE_CHECKING:
    from rlvr.tasks.base import ProblemSource


def _problems() -> type[ProblemSource]:
    from rlvr.tasks import MathSource

    return MathSource


RECIPE = Recipe(
    name="math",
    description="MATH-style `\\boxed{}` answers (`--data`)",
    origin="tinker-cookbook's RL page",
    presets={
        "base_model": "smollm2-135m", "steps": 50, "problems_per_step": 8, "group_size": 8, "max_tokens": 384,
        "learning_rate": 1e-4, "eval_problems": 64, "task": {"test_fraction": 0.1},
    },
    data=Data.FILE,
    problems=_problems,
    other_models={"max_tokens": 1024},
)
