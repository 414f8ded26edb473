"""What a problem is and what every problem source does: :class:`Problem` and :class:`ProblemSource`.

What it is: the small interface the RL loop programs against. A source lists its problems per split
(``problems("train")``, deterministic, optionally shuffled with a seed and filtered by difficulty), turns one into
chat messages (optional system prompt and few-shot examples, then the question and the source's answer-format
instruction), renders those through the model's chat template (any tokenizer with ``apply_chat_template``), and
scores a response with its reward (``score``; the batch scorer takes ``reward()`` and ``problem.reward_meta()``).

What it is not: any particular data set (``arithmetic``, ``rpn``, ``gsm8k``, ``math``, ``code``, ``files``), a
sampler or a trainer. Sources never download anything unless told to read a hub data set (``files.HubDataset``).
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards import Reward, resolve_reward

logger = logging.getLogger("rlvr.tasks")
_warned_plain = False


def render_messages(messages: list[dict[str, str]], tokenizer: Any) -> str:
    """A conversation through ``tokenizer``'s chat template, ending where the assistant's next turn begins. A
    tokenizer without a chat template gets plain ``User:``/``Assistant:`` turns (with a warning, once)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    global _warned_plain
    if not _warned_plain:
        _warned_plain = True
        logger.warning("tokenizer %s has no chat template; rendering prompts as plain 'User:'/'Assistant:' "
                       "turns", type(tokenizer).__name__)
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join([*turns, "Assistant:"])


@dataclass(frozen=True)
class Problem:
    """One problem: what the model is asked and what a program checks its answer against."""

    id: str
    """Stable identifier, unique within its source (e.g. ``gsm8k/train/17``, ``mbpp/601``)."""

    question: str
    """The problem text as the data set states it, before the source's format instruction is added."""

    answer: str | None = None
    """The reference final answer (``"72"``, ``"\\frac{1}{2}"``), for answer-checking rewards; None for code."""

    tests: tuple[str, ...] = ()
    """Test statements (``assert f(1) == 2``) for code rewards; empty for answer problems."""

    solution: str | None = None
    """A reference worked solution or program, when the data set has one (few-shot examples, sanity checks)."""

    difficulty: float | None = None
    """The source's difficulty measure where it has one (arithmetic level, MATH level, RPN operator count,
    GSM8K solution steps); None where it has none. Higher is harder."""

    meta: Mapping[str, Any] = field(default_factory=dict)
    """Anything else the reward needs or a user may want (``test_setup_code``, ``entry_point``, the raw record's
    extra fields); merged into :meth:`reward_meta`."""

    def reward_meta(self) -> dict[str, Any]:
        """The ``meta`` a reward receives: :attr:`meta` plus ``answer``, ``tests`` and ``problem_id``."""
        out = dict(self.meta)
        if self.answer is not None:
            out.setdefault("answer", self.answer)
        if self.tests:
            out.setdefault("tests", list(self.tests))
        out.setdefault("problem_id", self.id)
        return out


def select(problems: Sequence[Problem], *, min_difficulty: float | None = None,
           max_difficulty: float | None = None) -> list[Problem]:
    """The problems whose difficulty lies in ``[min_difficulty, max_difficulty]`` (for curricula); problems
    without a difficulty are kept only when no bound is given."""
    if min_difficulty is None and max_difficulty is None:
        return list(problems)
    return [p for p in problems if p.difficulty is not None
            and (min_difficulty is None or p.difficulty >= min_difficulty)
            and (max_difficulty is None or p.difficulty <= max_difficulty)]


class ProblemSource(ABC):
    """A set of problems with a prompt format and a reward.

    Args:
        system_prompt: a system message placed before everything else; None for none.
        instruction: the answer-format instruction appended to each question; None keeps the source's default
            (:attr:`default_instruction`), ``""`` adds none.
        few_shot: how many worked examples from the ``train`` split precede the question (as user/assistant
            turns), or the examples themselves; they never include the problem being asked.
        reward: the reward for this source's problems (a name, :class:`rlvr.rewards.Reward` or function); None
            keeps the source's default (:meth:`default_reward`).
        seed: seeds the few-shot draw (and, in generated sources, the problems).
    """

    name: str = "problems"
    """Short name used in problem ids and messages."""

    default_instruction: str = ""
    """Appended to each question unless ``instruction`` is given."""

    def __init__(self, *, system_prompt: str | None = None, instruction: str | None = None,
                 few_shot: int | Sequence[Problem] = 0, reward: Any = None, seed: int = 0) -> None:
        if isinstance(few_shot, int) and (isinstance(few_shot, bool) or few_shot < 0):
            raise ConfigurationError(f"{type(self).__name__}(few_shot={few_shot!r}): give a count >= 0 or a list "
                                     "of Problems")
        self.system_prompt = system_prompt
        self.instruction = self.default_instruction if instruction is None else instruction
        self.few_shot = few_shot if isinstance(few_shot, int) else list(few_shot)
        self.seed = seed
        self._reward = resolve_reward(reward) if reward is not None else None
        self._cache: dict[str, list[Problem]] = {}
        self._shots: list[Problem] | None = None

    # -- problems ------------------------------------------------------------------------------------------------
    @abstractmethod
    def splits(self) -> tuple[str, ...]:
        """The split names this source has (e.g. ``("train", "test")``)."""

    @abstractmethod
    def load(self, split: str) -> list[Problem]:
        """All problems of ``split`` in the source's canonical order (called once per split, then cached)."""

    def eval_split(self) -> str:
        """The held-out split evaluation scores: ``test``, else ``validation``, else ``val``."""
        splits = self.splits()
        for name in ("test", "validation", "val"):
            if name in splits:
                return name
        raise ConfigurationError(f"{type(self).__name__} has splits {list(splits)}; evaluation needs a 'test' (or "
                                 "'validation') split")

    def problems(self, split: str = "train", *, shuffle: bool = False, seed: int | None = None,
                 limit: int | None = None, min_difficulty: float | None = None,
                 max_difficulty: float | None = None) -> list[Problem]:
        """The problems of ``split``: in canonical order, or shuffled deterministically (``seed`` defaults to
        the source's), filtered by difficulty, then cut to ``limit``."""
        if split not in self.splits():
            raise ConfigurationError(f"{type(self).__name__}.problems(split={split!r}): this source has splits "
                                     f"{list(self.splits())}")
        if split not in self._cache:
            self._cache[split] = self.load(split)
        chosen = select(self._cache[split], min_difficulty=min_difficulty, max_difficulty=max_difficulty)
        if shuffle:
            random.Random(f"{self.seed if seed is None else seed}:{split}").shuffle(chosen)
        return chosen if limit is None else chosen[:limit]

    # -- prompts -------------------------------------------------------------------------------------------------
    def prompt_text(self, problem: Problem) -> str:
        """The user message for ``problem``: its question and the format instruction."""
        return f"{problem.question}\n\n{self.instruction}" if self.instruction else problem.question

    def demonstration(self, problem: Problem) -> str:
        """The ideal response to ``problem`` (a few-shot example's assistant turn); default: its solution."""
        if problem.solution is None:
            raise ConfigurationError(f"{type(self).__name__}: problem {problem.id!r} has no solution, so it cannot "
                                     "be a few-shot example; pass few_shot=0 or examples that have one")
        return problem.solution

    def examples(self, problem: Problem) -> list[Problem]:
        """The few-shot examples shown before ``problem`` (never ``problem`` itself)."""
        if isinstance(self.few_shot, list):
            return [p for p in self.few_shot if p.id != problem.id]
        if self.few_shot == 0:
            return []
        if self._shots is None:
            if "train" not in self.splits():
                raise ConfigurationError(f"{type(self).__name__}(few_shot={self.few_shot}): this source has no "
                                         "train split to draw examples from; pass the examples as a list")
            self._shots = self.problems("train", shuffle=True, seed=self.seed, limit=self.few_shot + 1)
        return [p for p in self._shots if p.id != problem.id][: self.few_shot]

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """Chat messages for ``problem``: system prompt, few-shot turns, then the question."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for example in self.examples(problem):
            out += [{"role": "user", "content": self.prompt_text(example)},
                    {"role": "assistant", "content": self.demonstration(example)}]
        out.append({"role": "user", "content": self.prompt_text(problem)})
        return out

    def render(self, problem: Problem, tokenizer: Any) -> str:
        """The prompt text for ``problem`` through ``tokenizer``'s chat template, ending where the assistant's
        answer begins. A tokenizer without a chat template gets plain ``User:``/``Assistant:`` turns (with a
        warning): set ``tokenizer.chat_template`` for base models you mean to prompt in a chat format."""
        return self.render_messages(self.messages(problem), tokenizer)

    def render_messages(self, messages: list[dict[str, str]], tokenizer: Any) -> str:
        """Any conversation as :meth:`render` renders a problem's (multi-turn envs continue one with it)."""
        return render_messages(messages, tokenizer)

    def render_ids(self, problem: Problem, tokenizer: Any) -> list[int]:
        """:meth:`render` as token ids (special tokens in the template are kept, none are added)."""
        return list(tokenizer.encode(self.render(problem, tokenizer), add_special_tokens=False))

    # -- rewards -------------------------------------------------------------------------------------------------
    def default_reward(self) -> Reward:
        """The reward this kind of source uses unless told otherwise."""
        return resolve_reward("format_correct", format="boxed_answer", correct="math_correct", format_coef=0.1)

    def reward(self) -> Reward:
        """The reward for this source's problems; call it with ``problem.reward_meta()`` as meta."""
        if self._reward is None:
            self._reward = self.default_reward()
        return self._reward

    def score(self, problem: Problem, response: str) -> float:
        """Score one response in this process (unbounded; batches go through :func:`rlvr.rewards.score_batch`), on
        what the run's reward runner scores it on: the question, the response, the problem's reward meta."""
        return self.reward()(problem.question, response, problem.reward_meta())
