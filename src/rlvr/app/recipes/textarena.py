"""A textarena two-player game against a random legal-move opponent (``integrations/textarena.py``).

The outcome for the model's seat is the reward (win 1, draw 0, loss -1). ``problems_per_step`` is games per step
(each played ``group_size`` times with one seed), ``eval_problems`` held-out games; ``task``: ``env_id``, ``seat``
(0, 1 or null: alternate) and ``instruction`` (after the game's first message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlvr.app.recipes.base import Data, Recipe
from rlvr.errors import ConfigurationError

if TYPE_CHECKING:
    from rlvr.app.settings import TrainConfig

TASK_KEYS = ("env_id", "seat", "instruction")


def _games(config: TrainConfig) -> Any:
    """The env dataset of ``config``: its games, their seeds and held-out games; its tokenizer is the loop's model's
    (bound when the run starts)."""
    task = dict(config.task)
    unknown = sorted(set(task) - set(TASK_KEYS))
    if unknown:
        raise ConfigurationError(f"task: {config.recipe} takes env_id, seat and instruction, not {unknown}")
    if "env_id" not in task:
        raise ConfigurationError(f"recipe {config.recipe!r} needs task.env_id (e.g. task.env_id=TicTacToe-v0)")
    from rlvr.integrations.textarena import TextArenaDataset

    return TextArenaDataset(task["env_id"], games_per_batch=config.problems_per_step, group_size=config.group_size,
                            num_batches=config.steps, seed=config.seed, seat=task.get("seat"),
                            test_games=config.eval_problems, instruction=task.get("instruction", ""))


RECIPE = Recipe(
    name="textarena",
    description="a two-player [textarena](https://github.com/LeonGuertler/TextArena) game (`task.env_id`: "
                "TicTacToe-v0, Nim-v0, ConnectFour-v0 and their variants) against a random legal-move opponent, "
                "turn by turn; the outcome for the model's seat: win 1, draw 0, loss -1 (two invalid moves in a row "
                "lose); `pip install 'rlvr[textarena]'`",
    origin="textarena's env API",
    presets={
        # SmolLM2 names a valid TicTacToe cell in about a quarter of its 16-token replies; 10 turns cover 5 moves
        # with a retry each
        "base_model": "smollm2-135m", "steps": 20, "problems_per_step": 4, "group_size": 8, "max_tokens": 16,
        "max_turns": 10, "learning_rate": 1e-4, "eval_problems": 16,
        "task": {"env_id": "TicTacToe-v0", "instruction": "Reply with only your move."},
    },
    data=Data.NONE,
    env=_games,
)
