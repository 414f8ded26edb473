"""Prime Intellect's ``verifiers`` environments as an rlvr env dataset: the environment plays its own rollouts
(single-turn, multi-turn, tool calls, its own ``env_response``), sampling through rlvr's OpenAI-compatible endpoint
in this process, its rubric gives the reward, and the tokens the endpoint sampled become the datums the loop trains
on.

    env = load_verifiers_env("my_env")                 # a module with load_environment(), or a vf.Environment
    dataset = VerifiersDataset(env, tokenizer, groups_per_batch=2, group_size=4)
    train(LoopConfig(base_model="tiny", steps=10), dataset)

Contract: each rollout samples through ``openai_client(sampler)`` (``rlvr.server``, no socket) with logprobs, so each
turn becomes a ``Transition`` of exactly the prompt the model saw and the tokens it sampled (nothing re-tokenised).
Tool results are part of the next turn's prompt, observation as the prompt is: only sampled tokens carry weight. The
rubric's reward goes on a trajectory's last turn (each function logged as ``env/all/rubric/<name>``). A reward
function that raises or outlasts ``reward_timeout``, a quiet 0.0 in verifiers, is a failed reward here: NaN, its
group not trained on, counted and named in the rollout log (a hung synchronous function is left in a daemon thread;
an ``async`` one that blocks the event loop cannot be cut).

Covered: verifiers 0.3.x's classic API (``Environment``, ``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``,
``Rubric``), text chat, tool calls. Not covered: what rlvr's endpoint refuses (``tool_choice`` other than ``"auto"``
or ``"none"``, a tool name OpenAI would not take: the run stops naming it), held-out evaluation of the env's
``eval_dataset``; verifiers 0.4's v1 tasksets train through ``verifiers_v1.py``. More: ``docs/training.md``.

Layers: this module reaches ``rlvr.server`` (for ``openai_client``), which the layers allow (``docs/architecture.md``);
it does so inside functions, so importing it never needs fastapi.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import math
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from rlvr import types
from rlvr.errors import ConfigurationError, RewardError, SamplingError
from rlvr.rl.envs import (
    Env,
    EnvGroupBuilder,
    RLDataset,
    StepResult,
    Trajectory,
    TrajectoryGroup,
    Transition,
    TurnByTurn,
    batch_positions,
)

__all__ = ["VerifiersDataset", "VerifiersGroup", "import_verifiers", "load_verifiers_env"]

INSTALL = "pip install 'rlvr[verifiers]' 'verifiers<0.4'"
_FAILURES = "rlvr_reward_failures"  # the state key where guarded reward functions note what went wrong


def import_verifiers() -> Any:
    """The ``verifiers`` module with its classic API (``SingleTurnEnv``, ``MultiTurnEnv``, ``Rubric``...)."""
    try:
        import verifiers
    except ImportError as exc:
        raise ConfigurationError(f"verifiers environments need the verifiers package: {INSTALL}") from exc
    try:
        verifiers.MultiTurnEnv  # noqa: B018  0.3 forwards these names to verifiers.legacy on first touch
    except (AttributeError, ImportError) as exc:
        raise ConfigurationError(
            f"verifiers {getattr(verifiers, '__version__', '?')} has no classic Environment API (0.4 moved to "
            f"verifiers.v1 tasksets, which train with rlvr.integrations.verifiers_v1.VerifiersV1Dataset); for classic "
            f"environments: {INSTALL}"
        ) from exc
    return verifiers


def load_verifiers_env(env_id: str, **env_args: Any) -> Any:
    """The environment of the installed module ``env_id`` (``-`` read as ``_``), made by its
    ``load_environment(**env_args)``, as ``vf-eval`` loads it."""
    import importlib.util

    vf = import_verifiers()
    module = env_id.replace("-", "_").split("/")[-1]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigurationError(f"unknown verifiers environment {env_id!r}: no module {module!r} is installed. "
                                 f"Install the environment's package beside rlvr (pip install <its package>), put "
                                 f"a {module}.py with load_environment() on the path, or pass a vf.Environment")
    try:
        return vf.load_environment(env_id, **env_args)
    except Exception as exc:
        raise ConfigurationError(f"verifiers environment {env_id!r} did not load with {env_args}: "
                                 f"{type(exc).__name__}: {exc.__cause__ or exc}") from exc


# -- rewards that fail loudly ------------------------------------------------------------------------------------------

def _run_in_daemon(func: Any, kwargs: dict[str, Any]) -> asyncio.Future:
    """``func(**kwargs)`` in a daemon thread, as a future of this loop: a call that hangs is left behind, and
    neither the loop's shutdown nor the process's exit waits for it."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(value)

    def target() -> None:
        try:
            value, exc = func(**kwargs), None
        except BaseException as e:
            value, exc = None, e
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=target, name=f"rlvr-reward-{func.__name__}", daemon=True).start()
    return future


def _guard(func: Any, timeout: float, group: bool) -> Any:
    """``func`` as verifiers calls it, but noting in each state it scores when it raises or outlasts ``timeout``
    (then it raises on, and verifiers' 0.0 is overruled by the adapter). Keeps the name and the parameters verifiers
    reads to pass arguments, plus ``state`` (``states`` for a group function) so the note reaches the right state."""
    if getattr(func, "__rlvr_guarded__", False):
        return func
    name = getattr(func, "__name__", repr(func))
    wants = "states" if group else "state"
    signature = inspect.signature(func)
    own = wants in signature.parameters or any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())

    async def guarded(**kwargs: Any) -> Any:
        scored = kwargs[wants] if group else [kwargs[wants]]
        if not own:
            kwargs.pop(wants)
        try:
            call = func(**kwargs) if inspect.iscoroutinefunction(func) else _run_in_daemon(func, kwargs)
            value = await asyncio.wait_for(call, timeout)
            values = list(value) if group else [float(value)]
            if len(values) != len(scored) or any(math.isnan(float(v)) for v in values):
                raise ValueError(f"returned {value!r} for {len(scored)} rollout(s)")
        except Exception as exc:
            what = (f"timed out after {timeout}s" if isinstance(exc, TimeoutError)
                    else f"raised {type(exc).__name__}: {exc}")
            for state in scored:
                state.setdefault(_FAILURES, []).append((name, what))
            raise
        return value

    parameters = list(signature.parameters.values())
    if wants not in signature.parameters:
        extra = inspect.Parameter(wants, inspect.Parameter.KEYWORD_ONLY)
        tail = [p for p in parameters if p.kind == p.VAR_KEYWORD]
        parameters = [p for p in parameters if p.kind != p.VAR_KEYWORD] + [extra, *tail]
    functools.update_wrapper(guarded, func, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    guarded.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    guarded.__rlvr_guarded__ = True  # type: ignore[attr-defined]
    return guarded


def _guard_rubric(rubric: Any, timeout: float) -> None:
    """Guard every reward function of ``rubric`` and of the rubrics it groups."""
    for inner in getattr(rubric, "rubrics", None) or []:
        _guard_rubric(inner, timeout)
    funcs = getattr(rubric, "funcs", None)
    if funcs:
        rubric.funcs = [_guard(f, timeout, rubric._is_group_func(f)) for f in funcs]


# -- the dataset ---------------------------------------------------------------------------------------------------


class _Prompt(Env):
    """A row's first prompt as tokens: what the loop checks its sampler's freshness on. The rollout itself is the
    verifiers environment's (``VerifiersDataset.rollout``), never played turn by turn here."""

    def __init__(self, dataset: VerifiersDataset, row: dict[str, Any]) -> None:
        self.dataset, self.row = dataset, row

    def initial_observation(self) -> list[int]:
        prompt = self.row["prompt"]
        messages = [{"role": m["role"], "content": m.get("content") or ""} for m in prompt] \
            if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        tokenizer = self.dataset.tokenizer
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    def step(self, action: list[int]) -> StepResult:
        raise ConfigurationError("a verifiers environment plays its own turns: train on VerifiersDataset, whose "
                                 "rollout() runs it, not on its groups through rollout_groups")


class VerifiersGroup(EnvGroupBuilder):
    """``group_size`` rollouts of one row of a verifiers environment's dataset."""

    def __init__(self, dataset: VerifiersDataset, row: dict[str, Any], group_size: int) -> None:
        self.dataset, self.row, self.group_size = dataset, row, group_size

    def make_envs(self) -> list[Env]:
        return [_Prompt(self.dataset, self.row) for _ in range(self.group_size)]


class VerifiersDataset(RLDataset):
    """A verifiers environment (or the id of an installed one) as batches of ``groups_per_batch`` rows of its
    dataset, ``group_size`` rollouts each; rows shuffled once with ``seed``, ``num_examples`` of them (-1: all).
    ``reward_timeout``: seconds each reward function may take per rollout before it counts as failed."""

    def __init__(self, env: Any, tokenizer: Any, groups_per_batch: int = 2, group_size: int = 4,
                 num_examples: int = -1, seed: int = 0, reward_timeout: float = 30.0,
                 env_args: dict[str, Any] | None = None) -> None:
        vf = import_verifiers()
        if isinstance(env, str):
            env = load_verifiers_env(env, **(env_args or {}))
        if not isinstance(env, vf.Environment):
            raise ConfigurationError(f"VerifiersDataset takes a verifiers Environment or an environment id, got "
                                     f"{type(env).__name__}")
        if groups_per_batch < 1 or group_size < 1:
            raise ConfigurationError(f"groups_per_batch and group_size must be at least 1, got {groups_per_batch} "
                                     f"and {group_size}")
        if reward_timeout <= 0:
            raise ConfigurationError(f"reward_timeout must be positive seconds, got {reward_timeout}")
        self.env, self.tokenizer, self.vf = env, tokenizer, vf
        self.groups_per_batch, self.group_size, self.reward_timeout = groups_per_batch, group_size, reward_timeout
        self.rows = [dict(row) for row in env.get_dataset(n=num_examples, seed=seed)]
        if len(self.rows) < groups_per_batch:
            raise ConfigurationError(f"{type(env).__name__}'s dataset has {len(self.rows)} rows, fewer than "
                                     f"groups_per_batch={groups_per_batch}")
        _guard_rubric(env.rubric, reward_timeout)

    def __len__(self) -> int:
        return len(self.rows) // self.groups_per_batch

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [VerifiersGroup(self, self.rows[i], self.group_size)
                for i in batch_positions(index, len(self), self.groups_per_batch)]

    @property
    def play(self) -> TurnByTurn:
        """Turn by turn in the loop's rollout thread, each part played by this dataset's ``rollout``."""
        return TurnByTurn(self.rollout)

    def rollout(self, sampling_client: Any, builders: Sequence[EnvGroupBuilder], params: types.SamplingParams,
                max_turns: int, seed: int | None, timing: dict[str, float]) -> list[TrajectoryGroup]:
        """Every group's rollouts played by the environment through ``openai_client(sampling_client)``, scored
        by its rubric. ``max_turns`` is the environment's own to set (``MultiTurnEnv(max_turns=...)``)."""
        for builder in builders:
            if not isinstance(builder, VerifiersGroup):
                raise ConfigurationError(f"VerifiersDataset plays VerifiersGroup builders, got "
                                         f"{type(builder).__name__}")
        return asyncio.run(self._play(sampling_client, list(builders), params, seed, timing))

    async def _play(self, sampling_client: Any, builders: list[VerifiersGroup], params: types.SamplingParams,
                    seed: int | None, timing: dict[str, float]) -> list[TrajectoryGroup]:
        from rlvr.server import openai_client

        rng = random.Random(seed)
        client = self.vf.OpenAIChatCompletionsClient(openai_client(sampling_client, max_retries=0))
        model = sampling_client.model_path or sampling_client.get_base_model()
        base = {"max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
                "logprobs": True}
        if params.top_k not in (None, -1):
            base["extra_body"] = {"top_k": params.top_k}

        async def group(builder: VerifiersGroup) -> tuple[list[Any], float]:
            seeds = [rng.randrange(2**31) for _ in range(builder.group_size)]  # a group's rollouts differ
            name = f"{type(self.env).__name__} on row {builder.row.get('example_id', '?')}"
            try:
                states = await asyncio.gather(*(
                    self.env.rollout(copy.deepcopy(builder.row), client, model, {**base, "seed": s}) for s in seeds))
            except Exception as exc:  # verifiers keeps its own errors in the state; anything else is the env's bug
                raise RewardError(f"{name}: its rollout raised {type(exc).__name__}: {exc}") from exc
            started = time.perf_counter()
            try:
                await self.env.rubric.score_group(states)
                for state in states:
                    await self.env.rubric.cleanup(state)
            except Exception as exc:
                raise RewardError(f"{name}: its rubric raised {type(exc).__name__}: {exc}") from exc
            return states, time.perf_counter() - started

        try:
            played = await asyncio.gather(*(group(b) for b in builders))
        finally:
            await client.close()
        timing["env"] = timing.get("env", 0.0) + sum(seconds for _, seconds in played)
        return [TrajectoryGroup([self._trajectory(s) for s in states], [0.0] * len(states))
                for states, _ in played]

    def _trajectory(self, state: Any) -> Trajectory:
        """A scored verifiers state as rlvr turns: each model call's prompt and sampled tokens, the rubric's reward
        (NaN when a reward function failed, or the rollout broke) on the last."""
        error = state.get("error")
        if error is not None and _refused(error):
            raise SamplingError(f"{type(self.env).__name__}'s request was refused by rlvr's OpenAI endpoint: "
                                f"{_chain(error)}")
        transitions = []
        for step in state["trajectory"]:
            tokens = step.get("tokens")
            if tokens is None:
                raise SamplingError("a verifiers turn came back without token ids; rlvr's endpoint returns them "
                                    "with logprobs=True, so the request did not reach it")
            transitions.append(Transition(list(tokens["prompt_ids"]), list(tokens["completion_ids"]),
                                          list(tokens["completion_logprobs"]), 0.0))
        noted = state.get(_FAILURES) or []  # (reward function, what went wrong)
        failures = [f"reward function {name} {what}" for name, what in noted]
        if error is not None:
            failures.append(f"rollout stopped: {_chain(error)}")
        if not transitions:
            failures.append(f"no model turn (stop condition {state.get('stop_condition')!r})")
            transitions.append(Transition([], [], [], 0.0))
        failed = {name for name, _ in noted}
        last = transitions[-1]
        last.reward = math.nan if failures else float(state["reward"])
        last.metrics = {f"rubric/{name}": float(value) for name, value in (state.get("metrics") or {}).items()
                        if name not in failed}
        return Trajectory(transitions, finished=True, failure="; ".join(failures) or None)


def _chain(error: BaseException) -> str:
    """An error and its causes, as one line."""
    parts, seen = [], error
    while seen is not None:
        parts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)


def _refused(error: BaseException) -> bool:
    """Whether rlvr's endpoint refused a request (a 4xx): the run's settings or the env's requests are at fault,
    and every rollout would fail alike, so the run stops."""
    import openai

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, openai.APIStatusError) and 400 <= seen.status_code < 500:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
