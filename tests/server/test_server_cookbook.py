"""tinker-cookbook's own RL loop (``tinker_cookbook.rl.train.main``, unchanged) trains the ``tiny`` model through
``rlvr serve`` for a few steps, and the reward it logs rises.

What runs: the cookbook's synchronous loop opens its own ``tinker.ServiceClient`` on ``Config.base_url``, creates a
LoRA training client, samples groups with its ``role_colon`` renderer (stop string ``"\\n\\nUser:"``), centres rewards
within each group, trains with ``importance_sampling`` (forward_backward + optim_step, datums with provenance spans),
exports the weights for sampling after every step, saves a final checkpoint, and writes ``metrics.jsonl`` into
``log_path``. The reward is read back from that file.

What the problems and the reward are: the cookbook's arithmetic problems (``ArithmeticEnv``, "What is x + y?", with
its few-shot prefix), built by a small dataset builder defined here through the cookbook's ``RLDatasetBuilder`` /
``ProblemGroupBuilder`` API. The tiny model is a random ~330k-parameter Llama over bytes; it cannot learn to add in a
few seconds, so the cookbook's 0/1 correctness would stay at 0 and show nothing. The env therefore keeps the
cookbook's grading (its ``correct`` and ``format`` metrics are still logged) but pays a shaped format reward: the
share of the reply's characters that are digits ("answer with a number"), which a policy gradient on this model moves
within a handful of steps. The assertion compares the mean of the first two steps with the last two: typically
0.05 -> 0.95 in eight steps; with ``learning_rate=0`` it stays near 0.04 and the same run fails the assertion
(``test_cookbook_reward_flat_without_learning`` checks that).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest

# tinker-cookbook 0.6.1 (the one release that accepts tinker 0.38 and transformers 5.23) needs tml-renderers>=0.4.1,
# which the package index does not have; its rl.train path never imports it, so install the cookbook without deps.
pytest.importorskip("tinker_cookbook", reason="needs tinker-cookbook: pip install --no-deps tinker-cookbook==0.6.1 "
                    "&& pip install chz==0.4.0 blobfile==3.3.0")

import chz  # installed with tinker-cookbook
import numpy as np
from tinker_cookbook import renderers, tokenizer_utils
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
from tinker_cookbook.rl import train
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult

from rlvr.engine.models.tiny import build_tiny_tokenizer

pytestmark = pytest.mark.slow  # the cookbook's RL loop, whole, through the server

STEPS = 8
WINDOW = 2  # steps averaged at each end
MIN_RISE = 0.15  # digit share, out of 1
LEARNING_RATE = 1e-2  # high for LoRA, right for a 330k-parameter model and eight steps


class DigitAnswerEnv(ArithmeticEnv):
    """The cookbook's addition problem, paid by the share of the reply's characters that are digits."""

    async def step(self, action, *, extra=None) -> StepResult:
        result = await super().step(action, extra=extra)  # the cookbook's grading, kept as metrics
        message, _ = self.renderer.parse_response(action)
        text = renderers.get_text_content(message)
        share = sum(ch.isdigit() for ch in text) / max(len(text), 1)
        return dataclasses.replace(result, reward=share, metrics={**result.metrics, "digit_share": share})


class DigitArithmeticDataset(RLDataset):
    """Batch ``i`` is ``batch_size`` addition problems drawn from seed ``i``, each sampled ``group_size`` times."""

    def __init__(self, renderer: renderers.Renderer, batch_size: int, group_size: int, n_batches: int) -> None:
        self.renderer, self.batch_size, self.group_size, self.n_batches = renderer, batch_size, group_size, n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = np.random.RandomState(index)
        prefix = ArithmeticEnv.standard_fewshot_prefix()
        return [ProblemGroupBuilder(env_thunk=partial(DigitAnswerEnv, int(x), int(y), self.renderer, prefix),
                                    num_envs=self.group_size, dataset_name="arithmetic")
                for x, y in rng.randint(0, 101, size=(self.batch_size, 2))]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class DigitArithmeticBuilder(RLDatasetBuilder):
    """What ``rl.train.Config.dataset_builder`` takes: builds the dataset (and its renderer) when the run starts."""

    batch_size: int
    group_size: int
    n_batches: int
    model_name: str = "tiny"
    renderer_name: str = "role_colon"

    async def __call__(self) -> tuple[DigitArithmeticDataset, None]:
        renderer = renderers.get_renderer(self.renderer_name, tokenizer_utils.get_tokenizer(self.model_name))
        return DigitArithmeticDataset(renderer, self.batch_size, self.group_size, self.n_batches), None


@pytest.fixture
def cookbook(server, monkeypatch, root_logging_kept):
    """What the cookbook needs from its surroundings, set for one test and undone after it."""
    monkeypatch.setenv("TINKER_API_KEY", server.api_key)
    # The cookbook loads tokenizers by model name from the Hugging Face hub; "tiny" is rlvr's, built in code.
    tokenizer_utils.register_tokenizer("tiny", build_tiny_tokenizer)
    # It also downloads a price list for its cost metrics; tests stay offline.
    monkeypatch.setattr(train, "fetch_model_pricing", lambda *args, **kwargs: None)
    yield server  # root_logging_kept puts back the root logger's handlers, which it replaces
    tokenizer_utils.unregister_tokenizer("tiny")


def _run_cookbook(server, log_path: Path, learning_rate: float) -> list[float]:
    """One ``rl.train.main`` run against the live server; the per-step mean reward from its metrics.jsonl."""
    config = train.Config(
        learning_rate=learning_rate,
        dataset_builder=DigitArithmeticBuilder(batch_size=4, group_size=8, n_batches=STEPS),
        model_name="tiny",
        recipe_name="rlvr_test_cookbook",
        renderer_name="role_colon",
        max_tokens=6,
        log_path=str(log_path),
        base_url=server.base_url,
        lora_rank=8,
        eval_every=0,
        save_every=0,
        num_groups_to_log=0,
    )
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    steps = {row["step"]: row["env/all/reward/total"] for row in rows if "env/all/reward/total" in row}
    assert sorted(steps) == list(range(STEPS)), f"expected one reward per step, got steps {sorted(steps)}"
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert final["name"] == "final" and final["state_path"].startswith("tinker://"), final
    return [steps[i] for i in range(STEPS)]


def _rise(rewards: list[float]) -> float:
    return float(np.mean(rewards[-WINDOW:]) - np.mean(rewards[:WINDOW]))


def test_cookbook_rl_train_reward_rises(cookbook, tmp_path):
    rewards = _run_cookbook(cookbook, tmp_path / "run", learning_rate=LEARNING_RATE)
    assert _rise(rewards) > MIN_RISE, f"reward did not rise by {MIN_RISE}: per-step mean rewards {rewards}"


def test_cookbook_reward_flat_without_learning(cookbook, tmp_path):
    """The control: the same run with learning_rate=0 does not pass the assertion above."""
    rewards = _run_cookbook(cookbook, tmp_path / "run", learning_rate=0.0)
    assert _rise(rewards) <= MIN_RISE, f"reward rose without learning: {rewards}"
