"""reasoning-gym's procedural datasets as a problem source: any dataset by name, or a weighted composite.

    source = ReasoningGymSource("leg_counting", config={"max_animals": 2}, num_train=500, num_test=64)
    source = ReasoningGymSource("composite", config={"datasets": [{"name": "gcd", "weight": 2},
                                                                  {"name": "lcm", "config": {"max_value": 20}}]})

What it is: :class:`ReasoningGymSource`, which builds ``reasoning_gym.create_dataset(name, seed=..., size=...,
**config)`` twice, once per split, from disjoint seeds: reasoning-gym draws entry ``i`` of a dataset seeded ``s``
from ``Random(s + i)`` (a composite's ``k``-th part is seeded ``s + k``), so the train seeds ``seed ..
seed + num_train + parts`` and the test seeds ``test_seed ..`` must not meet, and a train problem whose question is
also a test question is dropped. Problems are scored by the dataset's own ``score_answer`` through the
``reasoning_gym`` reward (``rlvr.rewards.reasoning_gym``), so timeouts and failures are counted like any reward's.
The prompt is the dataset's question plus an instruction matching ``answer_format``: ``final`` (the default: asks for
``\\boxed{}``, else takes a final-answer line or the whole reply, never a number out of prose; for numeric
answers), ``answer_tag`` (``<answer>...</answer>``) or ``plain`` (the whole response is the answer).

What it is not: reasoning-gym's curricula or its multi-turn games; the package itself is an extra
(``pip install 'rlvr[reasoning-gym]'``), imported only when a source is built.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards import Reward
from rlvr.rewards.reasoning_gym import ANSWER_FORMATS, ReasoningGymScore, build_dataset
from rlvr.tasks.base import Problem, ProblemSource

logger = logging.getLogger("rlvr.tasks")

TEST_SEED_OFFSET = 1_000_000
"""``test_seed`` defaults to ``seed + TEST_SEED_OFFSET``: the held-out set stays the same when num_train changes."""

INSTRUCTIONS = {
    "final": "Put your final answer in \\boxed{}.",
    "answer_tag": "Give your final answer between <answer> and </answer>.",
    "plain": "Answer with only the answer.",
}
"""The default instruction for each answer format."""


class ReasoningGymSource(ProblemSource):
    """Problems from one reasoning-gym dataset (or a ``composite`` of several), split by seed.

    Args:
        name: the dataset's reasoning-gym name (``leg_counting``, ``gcd``, ... or ``composite``).
        config: the dataset's config keys (e.g. ``{"max_animals": 2}``); for ``composite``, ``{"datasets":
            [{"name": ..., "weight": 1.0, "config": {...}}, ...]}``. Seeds and sizes are set by the arguments below.
        num_train, num_test: problems per split (train loses any whose question is also in test).
        seed: the train split's seed (and the few-shot draw's).
        test_seed: the test split's seed; None: ``seed + TEST_SEED_OFFSET``. Its seed range must not meet train's.
        answer_format: ``final``, ``answer_tag`` or ``plain`` (see the module docstring); sets the default
            instruction and where the ``reasoning_gym`` reward looks for the answer.
        Other keyword arguments: see :class:`ProblemSource` (the default reward is ``reasoning_gym``).
    """

    name = "reasoning-gym"

    def __init__(self, name: str, config: Mapping[str, Any] | None = None, *, num_train: int = 1000,
                 num_test: int = 200, seed: int = 0, test_seed: int | None = None, answer_format: str = "final",
                 instruction: str | None = None, **kwargs: Any) -> None:
        if answer_format not in ANSWER_FORMATS:
            raise ConfigurationError(f"ReasoningGymSource(answer_format={answer_format!r}): choose one of "
                                     f"{list(ANSWER_FORMATS)}")
        super().__init__(seed=seed, instruction=INSTRUCTIONS[answer_format] if instruction is None else instruction,
                         **kwargs)
        if config is not None and not isinstance(config, Mapping):
            raise ConfigurationError(f"ReasoningGymSource(config={config!r}): give the dataset's config as a "
                                     "mapping, e.g. task.config={max_animals: 2}")
        for label, value in (("num_train", num_train), ("num_test", num_test)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"ReasoningGymSource({label}={value!r}): must be an int >= 1")
        self.dataset_name, self.config = name, dict(config or {})
        self.answer_format = answer_format
        self.sizes = {"train": num_train, "test": num_test}
        test_seed = seed + TEST_SEED_OFFSET if test_seed is None else test_seed
        self.seeds = {"train": seed, "test": test_seed}
        parts = len(self.config.get("datasets") or []) if name == "composite" else 0
        train_end, test_end = seed + num_train + parts, test_seed + num_test + parts
        if seed < test_end and test_seed < train_end:
            raise ConfigurationError(f"ReasoningGymSource(seed={seed}, test_seed={test_seed}): the train split uses "
                                     f"seeds {seed}..{train_end - 1} and the test split {test_seed}.."
                                     f"{test_end - 1}, which overlap; leave test_seed unset (seed + "
                                     f"{TEST_SEED_OFFSET}) or move it out of the train range")
        self.specs = {split: {"name": name, "config": self.config, "seed": self.seeds[split],
                              "size": self.sizes[split]} for split in ("train", "test")}
        self.dataset("test")  # a bad name or config fails here, before any model loads

    def dataset(self, split: str) -> Any:
        """The reasoning-gym dataset behind ``split``."""
        return build_dataset(self.specs[split])

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def default_reward(self) -> Reward:
        return ReasoningGymScore(answer_format=self.answer_format)

    def load(self, split: str) -> list[Problem]:
        dataset = self.dataset(split)
        held_out = {p.question for p in self.problems("test")} if split == "train" else set()
        out: list[Problem] = []
        for index in range(self.sizes[split]):
            entry = dataset[index]
            if entry["question"] in held_out:
                continue
            source = entry.get("metadata", {}).get("source_dataset", self.dataset_name)
            answer = None if entry.get("answer") is None else str(entry["answer"])  # None: a scorer without oracle
            out.append(Problem(id=f"{self.name}/{self.dataset_name}/{split}/{index}", question=entry["question"],
                               answer=answer, meta={"rg_dataset": self.specs[split], "rg_entry": entry,
                                                    "rg_source": source}))
        if len(out) < self.sizes[split]:
            logger.info("%s: %d of %d train problems dropped: their questions are also test questions", self.name,
                        self.sizes[split] - len(out), self.sizes[split])
        return out
