"""Environments: a task as turns, so single-turn problems, multi-turn refinement (the model sees what failed and
tries again) and tool use share one rollout and one way of becoming training data.

An ``Env`` gives a first observation (prompt tokens) and answers each action (sampled tokens) with a reward, whether
the episode is over, and the next observation. An ``EnvGroupBuilder`` makes the envs of one group (the same problem,
``group_size`` times, so advantages can be centred within it) and may add group-level rewards (a ranking within the
group, say); an ``RLDataset`` hands out batches of builders. ``rollout_groups`` plays every env of a batch turn by
turn, all requests of a turn in flight together; ``trajectory_datums`` turns a trajectory into Tinker datums: when
each observation extends the previous observation and action (a growing conversation) the whole episode is one
datum, its actions trained and its observations masked; otherwise each break starts a new datum.

Envs run in the calling process: an env whose reward runs untrusted code should score through the sandbox
(``rlvr.sandbox``) as the code rewards do. An env whose ``step`` raises stops the rollout with a ``RewardError``
naming the env, the group and the turn.

An ``RLDataset`` is data: batches of builders by index (``get_batch``, ``__len__``, and ``batch_at`` for a step),
held-out groups (``test_groups``) and curriculum stages (``stage``). How the loop plays and scores its batches is one
strategy object, its ``play`` (a ``Play``): ``TurnByTurn``, the default, plays each part in the loop's rollout thread
and the envs score themselves in ``step``; ``problems.ScoredByRunner`` sends one-turn problems as one unit and has the
run's reward runner execute their scoring (``problem_item``, the same definition ``ProblemEnv.step`` scores with).
``ProblemDataset`` serves a problem source as one-turn envs. Not here: the training loop (``loop.py``), the records and
metrics it makes of played groups (``rollouts.py``), a problem source scored by the reward workers (``problems.py``).
"""

from __future__ import annotations

import copy
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from tinker.lib.public_interfaces.api_future import APIFuture

from rlvr import types
from rlvr.errors import ConfigurationError, ContextFullError, RewardError
from rlvr.rewards.registry import Reward, RewardItem
from rlvr.rewards.runner import BatchScores
from rlvr.rl.advantages import entropy_shaped
from rlvr.rl.datums import masked_datum, sampled_logprobs
from rlvr.rl.protocols import RewardScorer, SamplingAPI
from rlvr.tasks.base import Problem, ProblemSource, render_messages, select


@dataclass
class StepResult:
    """What an env answers to one action."""

    reward: float
    """Reward for this turn (an episode's reward is the sum over its turns)."""
    done: bool
    """The episode is over; ``next_observation`` is ignored."""
    next_observation: list[int] = field(default_factory=list)
    """Prompt tokens of the next turn: usually the conversation so far plus the env's reply."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers to log for this turn (averaged over the batch as ``env/<name>``)."""


class Env(ABC):
    """One episode of a task."""

    @abstractmethod
    def initial_observation(self) -> list[int]:
        """Prompt tokens of the first turn."""

    @abstractmethod
    def step(self, action: list[int]) -> StepResult:
        """Answer the model's ``action`` (sampled tokens, the stop token included when one ended it)."""


@dataclass
class Transition:
    """One turn: what the model saw, what it sampled (with the sampler's logprobs), what it got."""

    observation: list[int]
    action: list[int]
    logprobs: list[float]
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    clipped: bool | None = None
    """The sampler stopped the action at ``max_tokens`` (or the context's end), not at a stop token: the answer was
    cut off. None: not known (a turn an outside library played)."""


@dataclass
class Trajectory:
    """One episode's turns; ``finished`` is False when the turn limit cut it short."""

    transitions: list[Transition]
    finished: bool = True
    failure: str | None = None
    """Why its reward could not be computed (a scorer raised or hung): its reward is then NaN, and its group is
    counted as failed and not trained on, never scored 0."""
    logs: dict[str, Any] = field(default_factory=dict)
    """Rollout-log fields this episode sets itself in place of the loop's defaults: a problem's ``problem_id``, the
    ``response`` as its reward read it, the reward's ``parts``."""

    @property
    def reward(self) -> float:
        return sum(t.reward for t in self.transitions)


@dataclass
class TrajectoryGroup:
    """The trajectories of one group and their group-level rewards."""

    trajectories: list[Trajectory]
    group_rewards: list[float]

    def total_rewards(self) -> list[float]:
        """Per trajectory: the sum of its turns' rewards plus its group-level reward."""
        return [t.reward + g for t, g in zip(self.trajectories, self.group_rewards, strict=True)]


@dataclass
class PlayedGroups:
    """Some groups of a step's batch, played to the end and scored: what a dataset's ``start`` delivers per part."""

    groups: list[TrajectoryGroup]
    scoring_s: float
    """Seconds spent scoring (in the envs' ``step``, or in the reward runner)."""
    scores: BatchScores | None = None
    """Where the run's reward runner scored the answers: its scores, one per trajectory in group order, whose failure
    counts (``timeouts:sum``) and composite parts the step's metrics report."""


@dataclass
class PlayContext:
    """What the training loop lends a dataset to play its batches with."""

    threads: Executor
    """The loop's rollout thread: parts played there play while the loop trains on earlier ones."""
    max_turns: int
    runner: RewardScorer | None = None
    """The run's reward runner (killable workers, or Ray's reward actors), for a dataset whose ``play.reward`` is
    not None."""


class PendingPart(Protocol):
    """A part of a step's batch in flight: ``result()`` waits for it, played and scored."""

    def result(self) -> PlayedGroups:
        """The part's groups, played to the end and scored."""


class Play(ABC):
    """How the loop plays a dataset's batches and scores them: the strategy an ``RLDataset`` gives as its ``play``.

    ``reward`` says who scores: None, the envs themselves (in ``step``); else the ``Reward`` the run's reward runner
    executes for this strategy (``PlayContext.runner``), in killable worker processes or Ray's reward actors."""

    reward: Reward | None = None

    @abstractmethod
    def start(self, sampling_client: SamplingAPI, parts: Sequence[Sequence[EnvGroupBuilder]],
              params: types.SamplingParams, context: PlayContext) -> list[PendingPart]:
        """Start playing a step's batch, given in ``parts``: one pending part per part, in order, without waiting."""

    @abstractmethod
    def evaluate(self, sampling_client: SamplingAPI, groups: Sequence[EnvGroupBuilder], max_tokens: int,
                 context: PlayContext, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        """Greedy episodes of the held-out ``groups`` (at least one): ``test/...`` metrics; ``answered`` is given the
        groups answered so far."""


class EnvGroupBuilder(ABC):
    """Makes the envs of one group."""

    @abstractmethod
    def make_envs(self) -> Sequence[Env]:
        """Fresh envs, one per trajectory of the group."""

    def group_rewards(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """Rewards that need the whole group (added to each trajectory's own); none by default."""
        return [0.0] * len(trajectories)


class RLDataset(ABC):
    """Batches of env group builders, one batch per training step."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of batches."""

    @abstractmethod
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """Batch ``index`` (0 <= index < len(self))."""

    def test_groups(self) -> Sequence[EnvGroupBuilder]:
        """Held-out groups the loop plays greedily before and after training (and every ``eval_every`` steps);
        none by default."""
        return []

    def bind_tokenizer(self, tokenizer: Any) -> None:
        """Called by the loop with the trained model's tokenizer before it asks for any batch. A dataset made
        before the model loads (a recipe's) renders its envs with it; one given its tokenizer already ignores it."""
        del tokenizer  # by default the dataset was given its tokenizer when made

    def stage(self, max_difficulty: float) -> RLDataset:
        """This dataset narrowed to the groups no harder than ``max_difficulty``: a stage of the loop's curriculum
        (``LoopConfig.curriculum``). A dataset that does not grade its groups refuses; ``ProblemDataset`` narrows by
        its problems' difficulty."""
        raise ConfigurationError(f"curriculum: {type(self).__name__} does not grade its groups by difficulty; give it "
                                 "a stage(max_difficulty) method that returns the dataset narrowed to the groups no "
                                 "harder than that (as ProblemDataset does), or leave curriculum unset")

    def hardest(self, max_difficulty: float) -> float:
        """The difficulty of this stage's hardest group, logged as ``curriculum/max_difficulty``; by default the
        stage's bound."""
        return max_difficulty

    def batch_at(self, step: int) -> Sequence[EnvGroupBuilder]:
        """The batch the training loop plays at ``step``; by default batch ``step % len(self)``."""
        return self.get_batch(step % len(self))

    @property
    def play(self) -> Play:
        """How the loop plays and scores this dataset's batches; by default ``TurnByTurn()``: turn by turn in the
        loop's rollout thread, the envs scoring themselves in ``step``."""
        return TurnByTurn()


def _part_seeds(seed: int | None, parts: int) -> list[int | None]:
    """A seed per part of a step's batch: the step's own for the first (so an unstreamed batch samples as it always
    has), and for the others seeds drawn from it, so parts whose envs open alike still sample independently."""
    if seed is None:
        return [None] * parts
    return [seed, *(random.Random(f"{seed}:part{k}").randrange(2**31) for k in range(1, parts))]  # str seeds stable


def batch_positions(index: int, num_batches: int, per_batch: int) -> range:
    """The positions of batch ``index``'s items in a dataset of ``num_batches`` batches of ``per_batch`` items each;
    an IndexError past either end, as ``RLDataset.get_batch`` raises."""
    if not 0 <= index < num_batches:
        raise IndexError(f"batch {index} of a dataset with {num_batches} batches")
    return range(index * per_batch, (index + 1) * per_batch)


def clipped_share(transitions: Sequence[Transition]) -> float | None:
    """The share of ``transitions`` whose action the sampler cut at ``max_tokens`` (TRL's clipped ratio), over those
    where that is known; None when it is known for none."""
    known = [t.clipped for t in transitions if t.clipped is not None]
    return sum(known) / len(known) if known else None


def evaluate_envs(sampling_client: SamplingAPI, builders: Sequence[EnvGroupBuilder], max_tokens: int,
                  max_turns: int) -> dict[str, float]:
    """Greedy episodes of ``builders``: ``test/reward/mean``, ``test/correct`` (episode reward >= 1), ``test/turns``,
    ``test/clipped`` (the share of turns cut at ``max_tokens``)."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    groups = rollout_groups(sampling_client, builders, params, max_turns=max_turns, seed=0)
    rewards = [r for g in groups for r in g.total_rewards()]
    turns = [len(t.transitions) for g in groups for t in g.trajectories]
    clipped = clipped_share([turn for g in groups for t in g.trajectories for turn in t.transitions])
    return {"test/reward/mean": sum(rewards) / len(rewards), "test/turns": sum(turns) / len(turns),
            "test/correct": sum(r >= 1.0 for r in rewards) / len(rewards),
            **({} if clipped is None else {"test/clipped": clipped})}


def sample_together(sampling_client: SamplingAPI,
                    requests: Sequence[tuple[types.ModelInput, int, types.SamplingParams]]
                    ) -> Sequence[APIFuture[types.SampleResponse]]:
    """Futures of ``sampling_client.sample(*request)`` for each request, sent as one unit where the client can
    (rlvr's in-process ``sample_many``: decoded together and alone, so a seeded run's logprobs do not depend on the
    machine's timing; the Ray client's sends them one by one), else one by one (a client from outside rlvr, such as
    tinker's SDK against ``rlvr serve``)."""
    many = getattr(sampling_client, "sample_many", None)
    if many is not None:
        return many(requests)
    return [sampling_client.sample(prompt, n, params) for prompt, n, params in requests]


def rollout_groups(sampling_client: SamplingAPI, builders: Sequence[EnvGroupBuilder], params: types.SamplingParams,
                   max_turns: int = 8, seed: int | None = None, timing: dict[str, float] | None = None
                   ) -> list[TrajectoryGroup]:
    """Play every env of every builder to the end (or ``max_turns``, or until its conversation fills the model's
    context), one sample per env per turn; an episode cut short is ``finished=False``.

    All envs still running take their turn together, so the sampler decodes them as one batch. Each request gets
    its own seed (drawn from ``seed``), so envs with the same observation still sample independently. ``timing``,
    when given, receives ``"env"``: the seconds spent in the envs' ``step`` (scoring, tools).
    """
    if max_turns < 1:
        raise ConfigurationError(f"max_turns must be at least 1, got {max_turns}")
    env_seconds = 0.0
    rng = random.Random(seed)
    envs = [list(builder.make_envs()) for builder in builders]
    for b, group in enumerate(envs):
        if not group:
            raise ConfigurationError(f"{type(builders[b]).__name__}.make_envs() returned no envs")
    running = [(b, e) for b, group in enumerate(envs) for e in range(len(group))]
    observations = {key: list(envs[key[0]][key[1]].initial_observation()) for key in running}
    transitions: dict[tuple[int, int], list[Transition]] = {key: [] for key in running}
    cut: set[tuple[int, int]] = set()
    for _ in range(max_turns):
        if not running:
            break
        futures = sample_together(sampling_client, [
            (types.ModelInput.from_ints(observations[key]), 1, params.model_copy(update={"seed": rng.randrange(2**31)}))
            for key in running])
        still = []
        for key, future in zip(running, futures, strict=True):
            try:
                sequence = future.result().sequences[0]
            except ContextFullError:
                if not transitions[key]:  # the env's first observation alone does not fit: a setting to fix
                    raise
                cut.add(key)  # the conversation has filled the context: the episode ends here, unfinished
                continue
            started = time.perf_counter()
            env = envs[key[0]][key[1]]
            try:
                result = env.step(list(sequence.tokens))
            except Exception as exc:
                raise RewardError(f"{type(env).__name__}.step raised at turn {len(transitions[key]) + 1} of env "
                                  f"{key[1]} in group {key[0]}: {type(exc).__name__}: {exc}") from exc
            if not isinstance(result, StepResult):
                raise RewardError(f"{type(env).__name__}.step returned {type(result).__name__}, not a StepResult")
            env_seconds += time.perf_counter() - started
            transitions[key].append(Transition(observations[key], list(sequence.tokens), sampled_logprobs(sequence),
                                               float(result.reward), dict(result.metrics),
                                               clipped=sequence.stop_reason == "length"))
            if not result.done:
                if not result.next_observation:
                    raise ConfigurationError(f"{type(env).__name__}.step returned done=False "
                                             "with an empty next_observation")
                observations[key] = list(result.next_observation)
                still.append(key)
        running = still
    if timing is not None:
        timing["env"] = timing.get("env", 0.0) + env_seconds
    unfinished = set(running) | cut
    groups = []
    for b, builder in enumerate(builders):
        trajectories = [Trajectory(transitions[b, e], finished=(b, e) not in unfinished) for e in range(len(envs[b]))]
        extra = list(builder.group_rewards(trajectories))
        if len(extra) != len(trajectories):
            raise ConfigurationError(f"{type(builder).__name__}.group_rewards returned {len(extra)} rewards for "
                                     f"{len(trajectories)} trajectories")
        groups.append(TrajectoryGroup(trajectories, [float(x) for x in extra]))
    return groups


Rollout = Callable[[SamplingAPI, Sequence[EnvGroupBuilder], types.SamplingParams, int, int | None, dict[str, float]],
                   list[TrajectoryGroup]]
"""How a part's groups are played: ``(sampling_client, builders, params, max_turns, seed, timing)``, as
``rollout_groups`` (``timing["env"]``: the seconds spent scoring)."""


@dataclass(frozen=True)
class TurnByTurn(Play):
    """The default ``Play``: a step's parts played one after another in the loop's rollout thread (part k+1 plays
    while the loop trains on part k), each with ``rollout`` and its own seed; the envs score themselves in ``step``.
    A dataset whose envs drive their own conversation (an outside library's, such as ``verifiers``) gives its own
    ``rollout``. The held-out groups are played greedily the same way."""

    rollout: Rollout = rollout_groups

    def start(self, sampling_client: SamplingAPI, parts: Sequence[Sequence[EnvGroupBuilder]],
              params: types.SamplingParams, context: PlayContext) -> list[PendingPart]:
        return [context.threads.submit(self._part, sampling_client, builders, params, seed, context.max_turns)
                for builders, seed in zip(parts, _part_seeds(params.seed, len(parts)), strict=True)]

    def _part(self, sampling_client: SamplingAPI, builders: Sequence[EnvGroupBuilder], params: types.SamplingParams,
              seed: int | None, max_turns: int) -> PlayedGroups:
        """Some of a batch's groups played with ``rollout``; the envs' ``step`` time is the scoring time."""
        timing: dict[str, float] = {}
        groups = self.rollout(sampling_client, builders, params, max_turns, seed, timing)
        return PlayedGroups(groups, timing.get("env", 0.0))

    def evaluate(self, sampling_client: SamplingAPI, groups: Sequence[EnvGroupBuilder], max_tokens: int,
                 context: PlayContext, answered: Callable[[int], None] | None = None) -> dict[str, float]:
        result = evaluate_envs(sampling_client, groups, max_tokens, context.max_turns)
        if answered is not None:  # the groups are played together: all answered at once
            answered(len(groups))
        return result


def trajectory_datums(
    trajectory: Trajectory, advantage: float, entropy_coef: float = 0.0
) -> list[tuple[types.Datum, list[float]]]:
    """Datums that train ``trajectory``'s actions with ``advantage``, each with its mask over target positions
    (1.0 = a sampled token). Observations get advantage 0 and logprob 0 (``datums.masked_datum``). With
    ``entropy_coef > 0`` each action token's advantage carries an entropy bonus over the rest of the episode
    (``advantages.entropy_shaped``)."""
    for t in trajectory.transitions:
        if len(t.action) != len(t.logprobs):
            raise ConfigurationError(f"a transition has {len(t.action)} action tokens but {len(t.logprobs)} logprobs")
    episode_logprobs = [lp for t in trajectory.transitions for lp in t.logprobs]
    per_token = iter(entropy_shaped(advantage, episode_logprobs, entropy_coef) if entropy_coef
                     else [advantage] * len(episode_logprobs))
    out: list[tuple[types.Datum, list[float]]] = []
    tokens: list[int] = []
    logprobs: list[float] = []
    sampled: list[float] = []  # 1.0 where the token was sampled
    advantages: list[float] = []  # each token's advantage (0 for observations)

    def flush() -> None:
        if len(tokens) > 1:
            targets = [a for a, s in zip(advantages[1:], sampled[1:], strict=True) if s]
            out.append(masked_datum(tokens, logprobs, sampled, targets))

    for t in trajectory.transitions:
        if tokens and t.observation[:len(tokens)] == tokens:
            new = t.observation[len(tokens):]  # the conversation grew: keep one datum
        else:
            flush()
            tokens, logprobs, sampled, advantages = [], [], [], []
            new = t.observation
        tokens += new + t.action
        logprobs += [0.0] * len(new) + t.logprobs
        sampled += [0.0] * len(new) + [1.0] * len(t.action)
        advantages += [0.0] * len(new) + [next(per_token) for _ in t.action]
    flush()
    return out


def extend_conversation(seen: list[int], messages: list[dict[str, str]], tokenizer: Any) -> list[int]:
    """The next observation of a growing conversation: ``seen`` (what the model saw and sampled) followed by the rest
    of ``messages`` rendered through the chat template; re-rendered from text only when the template does not
    continue those tokens (then ``trajectory_datums`` starts a new datum)."""
    text = render_messages(messages, tokenizer)
    seen_text = tokenizer.decode(seen)
    if text.startswith(seen_text):
        return seen + list(tokenizer.encode(text[len(seen_text):], add_special_tokens=False))
    return list(tokenizer.encode(text, add_special_tokens=False))


# -- problems as envs -------------------------------------------------------------------------------------------------

def problem_item(problem: Problem, response: str) -> RewardItem:
    """What an answer to ``problem`` is scored on, wherever its reward runs (``ProblemEnv.step`` in this process,
    the run's reward runner for ``problems.ScoredByRunner``): the question, the decoded response, the problem's
    reward meta."""
    return RewardItem(problem.question, response, problem.reward_meta())


class ProblemEnv(Env):
    """A problem of a ``ProblemSource`` as a one-turn env: the rendered prompt, then the source's reward on
    ``problem_item``, in this process."""

    def __init__(self, source: ProblemSource, problem: Problem, tokenizer: Any) -> None:
        self.source, self.problem, self.tokenizer = source, problem, tokenizer

    def initial_observation(self) -> list[int]:
        return self.source.render_ids(self.problem, self.tokenizer)

    def step(self, action: list[int]) -> StepResult:
        item = problem_item(self.problem, self.tokenizer.decode(action, skip_special_tokens=True))
        return StepResult(reward=self.source.reward()(item.prompt, item.response, item.meta), done=True)


@dataclass
class ProblemGroupBuilder(EnvGroupBuilder):
    """``group_size`` one-turn envs of one problem."""

    source: ProblemSource
    problem: Problem
    tokenizer: Any
    group_size: int

    def make_envs(self) -> list[Env]:
        return [ProblemEnv(self.source, self.problem, self.tokenizer) for _ in range(self.group_size)]


class ProblemDataset(RLDataset):
    """A split of a problem source in batches of ``problems_per_batch`` groups (shuffled once with ``seed``); each
    problem becomes ``make_group(problem, group_size)``, by default ``group_size`` one-turn envs. With ``test_split``,
    its first ``test_problems`` problems are the held-out groups, one env each. Made without a tokenizer (None), it
    renders with the one the loop binds."""

    def __init__(self, source: ProblemSource, tokenizer: Any, problems_per_batch: int, group_size: int,
                 split: str = "train", seed: int = 0,
                 make_group: Callable[[Problem, int], EnvGroupBuilder] | None = None,
                 test_split: str | None = None, test_problems: int = 32) -> None:
        if problems_per_batch < 1 or group_size < 1:
            raise ConfigurationError("problems_per_batch and group_size must be at least 1")
        self.source, self.tokenizer = source, tokenizer
        self.problems = source.problems(split, shuffle=True, seed=seed)
        self.held_out = [] if test_split is None else source.problems(test_split, limit=test_problems)
        self.problems_per_batch, self.group_size = problems_per_batch, group_size
        self.make_group = make_group

    def group(self, problem: Problem, group_size: int) -> EnvGroupBuilder:
        """The group of ``problem``: ``make_group``'s, or ``group_size`` one-turn envs."""
        if self.make_group is not None:
            return self.make_group(problem, group_size)
        return ProblemGroupBuilder(self.source, problem, self.tokenizer, group_size)

    def bind_tokenizer(self, tokenizer: Any) -> None:
        if self.tokenizer is None:
            self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.problems) // self.problems_per_batch

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [self.group(self.problems[i], self.group_size)
                for i in batch_positions(index, len(self), self.problems_per_batch)]

    def test_groups(self) -> list[EnvGroupBuilder]:
        return [self.group(p, 1) for p in self.held_out]  # greedy: one episode per problem says it all

    def stage(self, max_difficulty: float) -> ProblemDataset:
        narrowed = copy.copy(self)
        narrowed.problems = select(self.problems, max_difficulty=max_difficulty)  # in the shuffled order
        if len(narrowed) < 1:
            known = sorted({p.difficulty for p in self.problems if p.difficulty is not None})
            raise ConfigurationError(f"curriculum: {len(narrowed.problems)} training problems have difficulty <= "
                                     f"{max_difficulty}, fewer than a batch of {self.problems_per_batch}; the "
                                     f"problems' difficulties are {known or 'not set'}")
        return narrowed

    def hardest(self, max_difficulty: float) -> float:
        """The hardest difficulty among this stage's problems (at most the stage's bound)."""
        return max(p.difficulty for p in self.problems if p.difficulty is not None)  # a stage's all have one
