"""verifiers 0.4's v1 tasksets (``verifiers.v1``) as an rlvr env dataset: verifiers plays each episode (its env, its
harness, its interception server), the model's turns are sampled by rlvr through vLLM's token-in/token-out route as
verifiers' own ``TrainClient`` calls it, the taskset's rewards are the rollout's reward, and the tokens the route
sampled become the datums the loop trains on.

    dataset = VerifiersV1Dataset("my_taskset", tokenizer, groups_per_batch=2, group_size=4)
    train(LoopConfig(base_model="tiny", steps=10), dataset)

Sampling goes to a ``LoopbackEndpoint`` (``rlvr.server.in_process``: rlvr's routes on a loopback port, behind a key
made for it), or with ``endpoint=`` and ``api_key=`` to a running ``rlvr serve``; verifiers renders prompts with
``renderers`` over the trained model's own tokenizer and reads back the sampled ids and logprobs.

Contract: each branch of a trainable trace becomes one trajectory, a turn per sampled span, with everything before
it (tool results, the env's turns, the prompt) as observation, so only sampled tokens carry weight and logprobs. The
reward is the sum of the traces' weighted rewards, on the last turn (each reward function logged as
``env/all/reward_fn/<name>``, each task metric as ``metric/<name>``). A taskset without its own harness plays with
rlvr's chat harness (``verifiers_v1_harness.py``); a PEP 723 harness needs ``uv`` (its absence is refused, naming
the fix), and verifiers' remote sandbox runtime is never chosen for you. A failed episode (a raising harness, tool
or reward, a timeout, a full context) is a counted failed reward, NaN, never a 0; a request the endpoint refuses
(4xx) stops the step, naming it. Not covered: a second taskset split for held-out evaluation, container tasks,
images and audio. More: ``docs/training.md`` ("verifiers 0.4 v1 tasksets").

Layers: this module reaches ``rlvr.server`` (the loopback endpoint) inside functions, as ``verifiers_env.py`` does.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from rlvr import types
from rlvr.errors import ConfigurationError, SamplingError
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

__all__ = ["VerifiersV1Dataset", "VerifiersV1Group", "episode_trajectory", "import_verifiers_v1"]

INSTALL = "pip install 'rlvr[verifiers]' 'verifiers>=0.4'"
CHAT_HARNESS = "rlvr_chat"
"""The id of rlvr's in-process chat harness. verifiers loads a harness by importing the module its id names, first as
``verifiers.v1.harnesses.<id>``, which a dotted id breaks; so ``verifiers_v1_harness.py`` is also registered as the
flat module ``rlvr_chat`` (``_register_chat_harness``)."""
MIN_VERSION = (0, 4)
KEY_VARIABLE = "RLVR_VERIFIERS_ENDPOINT_KEY"
"""The environment variable verifiers' client config reads the endpoint's key from (``api_key_var``)."""


def import_verifiers_v1() -> Any:
    """The ``verifiers.v1`` module of verifiers 0.4."""
    try:
        import verifiers
    except ImportError as exc:
        raise ConfigurationError(f"verifiers v1 tasksets need verifiers 0.4: {INSTALL}") from exc
    version = getattr(verifiers, "__version__", "0")
    try:
        released = tuple(int(part) for part in version.split(".")[:2]) >= MIN_VERSION
    except ValueError:
        released = True  # a development build: let the import below decide
    try:
        if not released:  # 0.3.x carries an early verifiers.v1 that 0.4 changed throughout
            raise ImportError(f"verifiers {version}")
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ConfigurationError(
            f"verifiers {version} is not 0.4: its v1 tasksets need verifiers>=0.4 ({INSTALL}); verifiers 0.3.x's "
            "classic environments train with rlvr.integrations.verifiers_env.VerifiersDataset") from exc
    _register_chat_harness()
    return vf


def _register_chat_harness() -> None:
    """Make rlvr's chat harness importable by its id (``CHAT_HARNESS``), as verifiers imports harnesses."""
    import importlib
    import sys

    sys.modules.setdefault(CHAT_HARNESS, importlib.import_module("rlvr.integrations.verifiers_v1_harness"))


# -- an episode as a trajectory ---------------------------------------------------------------------------------------

def _branch_transitions(branch: Any) -> list[Transition]:
    """One turn per sampled span of a branch: its observation everything before the span."""
    tokens, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
    turns, i = [], 0
    while i < len(tokens):
        start = i
        while start < len(tokens) and not mask[start]:
            start += 1
        end = start
        while end < len(tokens) and mask[end]:
            end += 1
        if end > start:
            turns.append(Transition(list(tokens[:start]), list(tokens[start:end]), list(logprobs[start:end]), 0.0))
        i = end
    return turns


def _refusal(trace: Any) -> str | None:
    """What rlvr's endpoint refused in this trace (a 4xx from the model call), if anything. A conversation that
    filled the model's context is not a refusal: what the model wrote did it, so it is that rollout's failure."""
    from verifiers.v1.harnesses.utils.compaction import CONTEXT_OVERFLOW_MARKERS

    for error in trace.errors:
        if error.type == "ProviderError" and error.status_code is not None and 400 <= error.status_code < 500:
            if not any(marker in error.message.casefold() for marker in CONTEXT_OVERFLOW_MARKERS):
                return f"{error.type} {error.status_code}: {error.message}"
    return None


def episode_trajectory(episode: Any) -> Trajectory:
    """A finished verifiers episode as an rlvr trajectory: the turns of its trainable traces, their summed reward
    (NaN when the episode or a reward function failed) and each reward function's score on the last turn."""
    traces = [t for t in episode.traces if t.agent.trainable]
    for trace in traces:
        if (refused := _refusal(trace)) is not None:
            raise SamplingError(f"rlvr's endpoint refused a request of {episode.task.type} "
                                f"(task {episode.task.data.idx}): {refused}")
    transitions = [turn for trace in traces for branch in trace.branches if branch.trainable
                   for turn in _branch_transitions(branch)]
    failures = [f"{e.type}: {e.message}" for e in episode.errors]
    failures += [f"{t.agent.name}: {e.type}: {e.message}" for t in traces for e in t.errors]
    failures += [f"reward function {name} gave no score" for t in traces
                 for name, reward in t.rewards.items() if reward is None]
    if not traces:
        failures.append("no trainable agent ran")
    if not transitions and not failures:
        failures.append(f"no model turn (stop condition {[t.stop_condition for t in traces]})")
    if not transitions:
        transitions.append(Transition([], [], [], 0.0))
    last = transitions[-1]
    last.reward = math.nan if failures else sum(t.reward for t in traces)
    last.metrics = {f"reward_fn/{name}": float(r.score) for t in traces for name, r in t.rewards.items()
                    if r is not None}
    last.metrics |= {f"metric/{name}": float(v) for t in traces for name, v in t.metrics.items() if v is not None}
    return Trajectory(transitions, finished=True, failure="; ".join(failures) or None)


# -- the dataset ------------------------------------------------------------------------------------------------------

_LOOP: list[asyncio.AbstractEventLoop] = []
_LOOP_LOCK = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for verifiers episodes, in a daemon thread: verifiers and renderers keep asyncio
    locks in module globals, which a loop per step (or per dataset) would find bound to a loop that is gone."""
    with _LOOP_LOCK:
        if not _LOOP:
            _LOOP.append(asyncio.new_event_loop())
            threading.Thread(target=_LOOP[0].run_forever, daemon=True, name="rlvr-verifiers-v1").start()
        return _LOOP[0]


class _Prompt(Env):
    """A task's prompt as tokens, through the model's chat template: what the loop checks its sampler's freshness
    on. The episode itself is verifiers' (``VerifiersV1Dataset.rollout``)."""

    def __init__(self, dataset: VerifiersV1Dataset, task: Any) -> None:
        self.dataset, self.task = dataset, task

    def initial_observation(self) -> list[int]:
        from verifiers.v1.types import content_text

        data = self.task.data
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages += [{"role": m.role, "content": content_text(m.content)} for m in data.prompt or []]
        tokenizer = self.dataset.tokenizer
        text = tokenizer.apply_chat_template(messages or [{"role": "user", "content": ""}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    def step(self, action: list[int]) -> StepResult:
        raise ConfigurationError("a verifiers v1 taskset plays its own episodes: train on VerifiersV1Dataset, whose "
                                 "rollout() runs them, not on its groups through rollout_groups")


class VerifiersV1Group(EnvGroupBuilder):
    """``group_size`` episodes of one task."""

    def __init__(self, dataset: VerifiersV1Dataset, task: Any, group_size: int) -> None:
        self.dataset, self.task, self.group_size = dataset, task, group_size

    def make_envs(self) -> list[Env]:
        return [_Prompt(self.dataset, self.task) for _ in range(self.group_size)]


class VerifiersV1Dataset(RLDataset):
    """The tasks of a verifiers v1 taskset (the id of an installed one) as batches of ``groups_per_batch`` tasks,
    ``group_size`` episodes each; tasks shuffled once with ``seed``, ``num_examples`` of them (-1: all; an infinite
    taskset needs a number).

    ``taskset_args``: the taskset config's fields. ``env``: an env id (default: the taskset's own, else verifiers'
    single-agent env) and ``env_args`` its config's fields (e.g. ``{"timeout": {"episode": 60}}``). ``harness``: a
    harness id or config dict for every seat that does not pin one (default: the taskset's own harness, else rlvr's
    in-process chat harness). ``runtime``: verifiers' runtime config for those seats (default subprocess).
    ``max_turns``: model turns per seat (None: the env's). ``endpoint``, ``api_key``: a running ``rlvr serve`` to
    sample from (default: this process, on a loopback port). ``renderer``: a ``renderers`` config (default:
    renderers' default renderer over the model's chat template, parsing ``<tool_call>`` JSON calls)."""

    def __init__(self, taskset: str, tokenizer: Any, groups_per_batch: int = 2, group_size: int = 4,
                 num_examples: int = -1, seed: int = 0, taskset_args: dict[str, Any] | None = None,
                 env: str = "", env_args: dict[str, Any] | None = None, harness: str | dict[str, Any] | None = None,
                 runtime: dict[str, Any] | None = None, max_turns: int | None = None, endpoint: str | None = None,
                 api_key: str | None = None, renderer: Any = None) -> None:
        vf = import_verifiers_v1()
        from verifiers.v1.utils.loaders import environment_class

        if groups_per_batch < 1 or group_size < 1:
            raise ConfigurationError(f"groups_per_batch and group_size must be at least 1, got {groups_per_batch} "
                                     f"and {group_size}")
        if (endpoint is None) != (api_key is None):
            raise ConfigurationError("endpoint= and api_key= go together: give both to sample from a running rlvr "
                                     "serve, or neither to sample in this process")
        self.vf, self.tokenizer, self.endpoint, self.api_key = vf, tokenizer, endpoint, api_key
        self.groups_per_batch, self.group_size = groups_per_batch, group_size
        try:
            env_class = environment_class(taskset, env)
            config_class = self._config_class(env_class)
            config = config_class.model_validate({**(env_args or {}), "id": env,
                                                  "taskset": {**(taskset_args or {}), "id": taskset}})
        except (ImportError, ValueError, TypeError) as exc:
            raise ConfigurationError(f"verifiers taskset {taskset!r} (env {env or 'its own'!r}) did not load: "
                                     f"{type(exc).__name__}: {exc}") from exc
        self._seat_defaults(config, harness, runtime or {"type": "subprocess"}, max_turns)
        try:
            self.env = env_class(config)
        except Exception as exc:
            raise ConfigurationError(f"verifiers env for taskset {taskset!r} did not build: "
                                     f"{type(exc).__name__}: {exc}") from exc
        self._check_uv()
        tasks = self.env.taskset.shuffle(seed) if self.env.taskset.bounded else self.env.taskset
        if num_examples >= 0:
            tasks = tasks.take(num_examples)
        elif not tasks.bounded:
            raise ConfigurationError(f"taskset {taskset!r} is infinite: give num_examples= (how many tasks to train "
                                     "on)")
        self.tasks = list(tasks)
        if len(self.tasks) < groups_per_batch:
            raise ConfigurationError(f"taskset {taskset!r} has {len(self.tasks)} tasks, fewer than "
                                     f"groups_per_batch={groups_per_batch}")
        self.renderer = renderer if renderer is not None else self._default_renderer()
        self._tokenizer_dir: tempfile.TemporaryDirectory | None = None
        self._loopback: Any = None

    # -- set-up -------------------------------------------------------------------------------------------------------

    def _config_class(self, env_class: type) -> type:
        from verifiers.v1.env import Env as VfEnv
        from verifiers.v1.utils.generic import concrete_type

        return concrete_type(env_class, self.vf.EnvConfig, origin=VfEnv) or self.vf.EnvConfig

    def _seat_defaults(self, config: Any, harness: str | dict[str, Any] | None, runtime: dict[str, Any],
                       max_turns: int | None) -> None:
        """Every seat that pins no harness gets ``harness`` (else the taskset's own, else rlvr's chat harness), and
        every seat the run's ``runtime`` unless its config set one; ``max_turns`` when given."""
        from verifiers.v1.utils.loaders import default_harness_id

        own = default_harness_id(config.taskset.id)
        chosen = harness if harness is not None else (own if own != "bash" else CHAT_HARNESS)
        chosen = {"id": chosen} if isinstance(chosen, str) else chosen
        for name in type(config).model_fields:
            seat = getattr(config, name)
            if not isinstance(seat, self.vf.AgentConfig):
                continue
            update: dict[str, Any] = {}
            if seat.harness is None:
                update["harness"] = chosen
            if "runtime" not in seat.model_fields_set:
                update["runtime"] = runtime
            if max_turns is not None:
                update["max_turns"] = max_turns
            if update:
                setattr(config, name, self.vf.AgentConfig.model_validate({**seat.model_dump(exclude_unset=True),
                                                                          **update}))

    def _check_uv(self) -> None:
        """A harness that runs a PEP 723 program needs ``uv``: refuse now, naming the fix, rather than fail every
        episode."""
        if shutil.which("uv") is not None:
            return
        scripted = sorted({h.config.id for h in self.env._harnesses.values() if h.config.id != CHAT_HARNESS})
        if scripted:
            raise ConfigurationError(
                f"harness {', '.join(map(repr, scripted))} runs its program as a PEP 723 script under uv, and uv is "
                "not installed: pip install uv (verifiers then runs it in its subprocess runtime), or leave "
                f"harness= unset for a chat taskset, which rlvr plays in process with its chat harness "
                f"({CHAT_HARNESS})")

    def _default_renderer(self) -> Any:
        from renderers import DefaultRendererConfig

        return DefaultRendererConfig(tool_parser="qwen3")

    def _client_config(self, url: str) -> Any:
        """verifiers' ``TrainClient`` config for rlvr's endpoint at ``url``, rendering with the model's tokenizer."""
        if self._tokenizer_dir is None:
            self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="rlvr-verifiers-tokenizer-")
            self.tokenizer.save_pretrained(self._tokenizer_dir.name)
        return self.vf.TrainClientConfig(base_url=f"{url}/v1", api_key_var=KEY_VARIABLE,
                                         renderer_model_name=self._tokenizer_dir.name, renderer=self.renderer)

    # -- the dataset --------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tasks) // self.groups_per_batch

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [VerifiersV1Group(self, self.tasks[i], self.group_size)
                for i in batch_positions(index, len(self), self.groups_per_batch)]

    @property
    def play(self) -> TurnByTurn:
        """Turn by turn in the loop's rollout thread, each part played by this dataset's ``rollout``."""
        return TurnByTurn(self.rollout)

    def rollout(self, sampling_client: Any, builders: Sequence[EnvGroupBuilder], params: types.SamplingParams,
                max_turns: int, seed: int | None, timing: dict[str, float]) -> list[TrajectoryGroup]:
        """Every group's episodes played by the verifiers env, sampling from ``sampling_client`` through rlvr's
        generate route. ``max_turns`` is the env's own to set (``max_turns=`` of the dataset); ``timing["env"]``
        gets the seconds verifiers spent setting up, finalizing and scoring the episodes."""
        del max_turns
        for builder in builders:
            if not isinstance(builder, VerifiersV1Group):
                raise ConfigurationError(f"VerifiersV1Dataset plays VerifiersV1Group builders, got "
                                         f"{type(builder).__name__}")
        url, key, model = self._endpoint_for(sampling_client)
        os.environ[KEY_VARIABLE] = key
        play = self._play(self._client_config(url), model, list(builders), params, seed)
        episodes = asyncio.run_coroutine_threadsafe(play, _event_loop()).result()
        timing["env"] = timing.get("env", 0.0) + sum(
            t.timing.setup.duration + t.timing.finalize.duration + t.timing.scoring.duration
            for group in episodes for episode in group for t in episode.traces)
        return [TrajectoryGroup([episode_trajectory(e) for e in group], [0.0] * len(group)) for group in episodes]

    def _endpoint_for(self, sampling_client: Any) -> tuple[str, str, str]:
        """(base URL, key, model name) that sample from ``sampling_client``'s weights."""
        if self.endpoint is not None:
            model = sampling_client.model_path or sampling_client.get_base_model()
            return self.endpoint.rstrip("/").removesuffix("/v1"), str(self.api_key), model
        if self._loopback is None:
            from rlvr.client import ServiceClient
            from rlvr.server.in_process import LoopbackEndpoint

            self._loopback = LoopbackEndpoint(ServiceClient(engine=sampling_client.engine))
        return self._loopback.url, self._loopback.key, self._loopback.serve(sampling_client)

    async def _play(self, client: Any, model: str, builders: list[VerifiersV1Group], params: types.SamplingParams,
                    seed: int | None) -> list[list[Any]]:
        rng = random.Random(seed)
        sampling = {"temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.top_k not in (None, -1):
            sampling["top_k"] = params.top_k

        def context() -> Any:  # each episode samples with a seed of its own, so a group's episodes differ
            return self.vf.ModelContext(model=model, client=client,
                                        sampling=self.vf.SamplingConfig(**sampling, seed=rng.randrange(2**31)))

        async with self.env.serving():
            return await asyncio.gather(*(asyncio.gather(*(self.env.run_episode(b.task, context())
                                                           for _ in range(b.group_size))) for b in builders))
