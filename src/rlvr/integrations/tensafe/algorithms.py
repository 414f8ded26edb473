"""High-level algorithms with the TenSafe cookbook's API: ``algo.update(batch, training_client)``.

``REINFORCE``, ``PPO`` and ``GRPO`` turn a ``TrajectoryBatch`` (answers with their rewards) into advantages and
datums and train through the client API with the engine's built-in losses; ``get_state`` / ``from_state`` carry
their small state (a running baseline) across checkpoints. ``MockRolloutSampler`` produces trajectories without a
model, to test a pipeline.

``entropy_coef > 0`` adds an entropy bonus through the advantages (``rlvr.rl.advantages.entropy_shaped``: each answer
token's advantage gets ``-entropy_coef`` times the sampler logprobs of it and the tokens after it), which in
expectation is the gradient of ``entropy_coef`` x the answers' entropy: the built-in losses only see the logprobs of
the sampled tokens, so this is the estimator they can carry.

``PPOConfig(value_coef > 0)`` adds a learned critic (``critic.LinearCritic``: the Tinker API exposes no hidden
states, so it is a separate linear value function of the prompt and the answer so far) and per-token GAE
advantages (``gamma``, ``gae_lambda``) in place of the running baseline; ``value_loss`` reports its error.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rlvr import types
from rlvr.errors import ConfigurationError
from rlvr.integrations.tensafe.critic import LinearCritic
from rlvr.rl.advantages import RunningBaseline, entropy_shaped, gae, group_advantages, returns_to_go
from rlvr.rl.datums import rl_datum, sample_train_metrics


@dataclass
class ScoredAnswer:
    """One sampled answer and what it earned."""

    prompt: str
    """The prompt text."""
    response: str
    """The answer text."""
    prompt_tokens: list[int]
    """Prompt token ids."""
    response_tokens: list[int]
    """Answer token ids."""
    logprobs: list[float] | None = None
    """Sampler logprobs of the answer tokens; None: taken from the trainer at update time (on-policy)."""
    reward: float = 0.0
    """Set by the user's reward function."""
    group: int | None = None
    """Which prompt's group this answer belongs to (GRPO centres within groups)."""


@dataclass
class TrajectoryBatch:
    """A batch of trajectories with reward statistics."""

    trajectories: list[ScoredAnswer] = field(default_factory=list)
    """The answers."""

    @property
    def mean_reward(self) -> float:
        return statistics.fmean(t.reward for t in self.trajectories) if self.trajectories else 0.0

    @property
    def std_reward(self) -> float:
        return statistics.pstdev(t.reward for t in self.trajectories) if len(self.trajectories) > 1 else 0.0

    def __iter__(self) -> Iterator[ScoredAnswer]:
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __getitem__(self, index: int) -> ScoredAnswer:
        return self.trajectories[index]


@dataclass
class UpdateResult:
    """What one ``update`` did."""

    policy_loss: float
    """The policy loss (sum over tokens, as the engine reports it), averaged over optimizer steps."""
    value_loss: float = 0.0
    """The critic's mean squared error against the returns, before this update fitted it (0 without a critic)."""
    entropy: float = 0.0
    """Sampled estimate of the per-token entropy before the update."""
    kl_divergence: float = 0.0
    """Mean (log q - log p) between the sampler and the updated policy on the batch's tokens (0 when on-policy)."""
    grad_norm: float = 0.0
    """Gradient norm before clipping, of the last optimizer step."""
    steps: int = 0
    """Optimizer steps taken."""


class MockRolloutSampler:
    """Trajectories without a model: canned answers encoded as byte tokens (valid ids for every rlvr model)."""

    RESPONSES = ("The answer is 42.", "Step 1: think. Step 2: the solution is 7.", "I am not sure.",
                 "Therefore, the result is 12 and the answer follows.")

    def __init__(self, max_new_tokens: int = 64, seed: int = 0) -> None:
        self.max_new_tokens = max_new_tokens
        self.rng = random.Random(seed)

    def generate_trajectories(self, prompts: Sequence[str], group_size: int = 1) -> TrajectoryBatch:
        out = []
        for g, prompt in enumerate(prompts):
            for _ in range(group_size):
                response = self.rng.choice(self.RESPONSES)
                tokens = list(response.encode())[: self.max_new_tokens]
                out.append(ScoredAnswer(prompt, bytes(tokens).decode(errors="ignore"), list(prompt.encode()) or [32],
                                      tokens, None, 0.0, g))
        return TrajectoryBatch(out)


@dataclass
class REINFORCEConfig:
    learning_rate: float = 1e-5
    """AdamW learning rate."""
    use_baseline: bool = True
    """Subtract a running mean of rewards (else raw rewards are the advantages)."""
    normalize_advantages: bool = True
    """Divide advantages by the batch's standard deviation."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (>= 0), carried by per-token advantages (see the module docstring)."""
    baseline_decay: float = 0.9
    """Running-baseline decay."""


@dataclass
class PPOConfig:
    learning_rate: float = 1e-5
    """AdamW learning rate."""
    clip_range: float = 0.2
    """Ratios are clipped to [1 - clip_range, 1 + clip_range]."""
    ppo_epochs: int = 4
    """Passes over the batch per update."""
    target_kl: float | None = None
    """Stop the epochs early once the mean KL to the sampler exceeds this (None: never)."""
    value_coef: float = 0.0
    """Weight of the value loss: > 0 learns a critic and uses per-token GAE advantages (see the module docstring);
    0 keeps a running reward baseline."""
    gamma: float = 1.0
    """Discount of GAE and the critic's returns (with a critic)."""
    gae_lambda: float = 0.95
    """GAE's lambda (with a critic): 1 = return minus value, 0 = one-step TD error."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (>= 0), carried by per-token advantages (see the module docstring)."""
    normalize_advantages: bool = True
    """Divide advantages by the batch's standard deviation."""
    reward_normalization: bool = False
    """Standardise rewards over the batch before the baseline."""
    kl_penalty_coef: float = 0.0
    """Reserved; the loop's kl_penalty_coef applies a KL penalty to the base model. Must be 0 here."""


@dataclass
class GRPOConfig:
    learning_rate: float = 1e-5
    """AdamW learning rate."""
    clip_range: float = 0.2
    """PPO-style ratio clipping around 1."""
    normalize_std: bool = True
    """Divide group-centred advantages by the group's std (GRPO's original form)."""


def _unsupported(config: Any) -> None:
    entropy = getattr(config, "entropy_coef", 0.0)
    if entropy < 0:
        raise ConfigurationError(f"{type(config).__name__}.entropy_coef={entropy}: must be >= 0 (it weights an "
                                 "entropy bonus)")
    kl = getattr(config, "kl_penalty_coef", 0.0)
    if kl:
        raise ConfigurationError(f"{type(config).__name__}.kl_penalty_coef={kl}: not supported yet; set it to 0 "
                                 "(a KL penalty to the base model is LoopConfig.kl_penalty_coef)")


class _Algorithm:
    config: Any
    config_class: type
    loss_fn = "importance_sampling"
    value_loss = 0.0  # the critic's error at the last update, for algorithms with one

    def _advantages(self, batch: TrajectoryBatch) -> list[float] | list[list[float]]:
        """One advantage per trajectory, or one per answer token of each."""
        raise NotImplementedError

    def _loss_config(self) -> dict[str, float] | None:
        return None

    def _epochs(self) -> int:
        return 1

    def update(self, batch: TrajectoryBatch, training_client: Any) -> UpdateResult:
        """Train on ``batch``: advantages, datums, forward_backward and optim_step (``ppo_epochs`` times for PPO)."""
        if not len(batch):
            raise ConfigurationError("update() got an empty TrajectoryBatch")
        advantages = self._advantages(batch)
        trajectories = list(batch)
        missing = [i for i, t in enumerate(trajectories) if t.logprobs is None]
        if missing:  # on-policy: the trainer's current logprobs stand in for the sampler's
            probe = [rl_datum(t.prompt_tokens, t.response_tokens, [0.0] * len(t.response_tokens), 0.0)[0]
                     for t in (trajectories[i] for i in missing)]
            outs = training_client.forward(probe, "importance_sampling").result().loss_fn_outputs
            for i, out in zip(missing, outs, strict=True):
                lp = out["logprobs"].tolist()
                trajectories[i].logprobs = lp[len(lp) - len(trajectories[i].response_tokens):]
        coef = getattr(self.config, "entropy_coef", 0.0)
        built = [rl_datum(t.prompt_tokens, t.response_tokens, t.logprobs,
                          entropy_shaped(a, t.logprobs, coef) if coef else a)
                 for t, a in zip(trajectories, advantages, strict=True)]
        datums, masks = [d for d, _ in built], [m for _, m in built]
        sampled = [d.loss_fn_inputs["logprobs"].tolist() for d in datums]
        adam = types.AdamParams(learning_rate=self.config.learning_rate)
        result = UpdateResult(policy_loss=0.0)
        losses = []
        for epoch in range(self._epochs()):
            out = training_client.forward_backward(datums, self.loss_fn, self._loss_config()).result()
            metrics = training_client.optim_step(adam).result().metrics
            compare = sample_train_metrics([o["logprobs"].tolist() for o in out.loss_fn_outputs], sampled, masks)
            if epoch == 0:
                result.entropy = compare.get("optim/entropy", 0.0)
            result.kl_divergence = compare.get("optim/kl_sample_train_v1", 0.0)
            losses.append(out.metrics["loss:sum"])
            result.grad_norm = metrics["grad_norm:mean"]
            result.steps += 1
            target = getattr(self.config, "target_kl", None)
            if target is not None and abs(result.kl_divergence) > target:
                break
        result.policy_loss = sum(losses) / len(losses)
        result.value_loss = self.value_loss
        return result

    def get_state(self) -> dict[str, Any]:
        return {"algorithm": type(self).__name__, "config": asdict(self.config), **self._state()}

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:
        pass

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Any:
        """The algorithm ``get_state`` described: its config and its running state."""
        algo = cls(cls.config_class(**state["config"]))
        algo._load_state(state)
        return algo


def _normalise(values: list[float]) -> list[float]:
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return [v / (std + 1e-8) for v in values] if std > 0 else values


class REINFORCE(_Algorithm):
    """REINFORCE with an optional running baseline and advantage normalisation."""

    config_class = REINFORCEConfig

    def __init__(self, config: REINFORCEConfig | None = None) -> None:
        self.config = config or REINFORCEConfig()
        _unsupported(self.config)
        self.baseline = RunningBaseline(decay=self.config.baseline_decay)

    def _advantages(self, batch: TrajectoryBatch) -> list[float]:
        rewards = [t.reward for t in batch]
        advantages = self.baseline.advantages(rewards) if self.config.use_baseline else rewards
        return _normalise(advantages) if self.config.normalize_advantages else advantages

    def _state(self) -> dict[str, Any]:
        return {"baseline": self.baseline.value}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.baseline.value = state.get("baseline")


class PPO(REINFORCE):
    """PPO's clipped objective over ``ppo_epochs`` passes, with a running baseline or (``value_coef > 0``) a learned
    critic and GAE."""

    loss_fn = "ppo"
    config_class = PPOConfig

    def __init__(self, config: PPOConfig | None = None) -> None:
        self.config = config or PPOConfig()
        _unsupported(self.config)
        if not 0 < self.config.clip_range < 1:
            raise ConfigurationError(f"PPOConfig.clip_range={self.config.clip_range}: must be in (0, 1)")
        if self.config.value_coef < 0:
            raise ConfigurationError(f"PPOConfig.value_coef={self.config.value_coef}: must be >= 0 (0 = no critic)")
        if not (0 <= self.config.gae_lambda <= 1 and 0 < self.config.gamma <= 1):
            raise ConfigurationError(f"PPOConfig: gamma={self.config.gamma} must be in (0, 1] and gae_lambda="
                                     f"{self.config.gae_lambda} in [0, 1]")
        self.baseline = RunningBaseline()
        self.critic = LinearCritic() if self.config.value_coef > 0 else None

    def _advantages(self, batch: TrajectoryBatch) -> list[float] | list[list[float]]:
        rewards = [t.reward for t in batch]
        if self.config.reward_normalization:
            rewards = _normalise([r - statistics.fmean(rewards) for r in rewards])
        if self.critic is None:
            advantages = self.baseline.advantages(rewards)
            return _normalise(advantages) if self.config.normalize_advantages else advantages
        # With a critic: the reward arrives with the last token; GAE against the values before this fit.
        gamma, lam = self.config.gamma, self.config.gae_lambda
        episodes = [(t.prompt_tokens, t.response_tokens) for t in batch]
        rewards_T = [[0.0] * (len(r) - 1) + [reward] for (_, r), reward in zip(episodes, rewards, strict=True)]
        features = [self.critic.features(p, r) for p, r in episodes]  # once, for the values and the fit
        per_token = [gae(r_T, self.critic.predict(f), gamma, lam) for f, r_T in zip(features, rewards_T, strict=True)]
        self.value_loss = self.critic.fit(features, [returns_to_go(r_T, gamma) for r_T in rewards_T],
                                          self.config.value_coef)
        if self.config.normalize_advantages:
            flat = iter(_normalise([a for a_T in per_token for a in a_T]))  # over every token of the batch
            per_token = [[next(flat) for _ in a_T] for a_T in per_token]
        return per_token

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), **({"critic": self.critic.state()} if self.critic is not None else {})}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        if "critic" in state:
            self.critic = LinearCritic.from_state(state["critic"])

    def _loss_config(self) -> dict[str, float]:
        return {"clip_low_threshold": 1 - self.config.clip_range, "clip_high_threshold": 1 + self.config.clip_range}

    def _epochs(self) -> int:
        return self.config.ppo_epochs


class GRPO(_Algorithm):
    """Group-relative advantages (centred, optionally std-normalised, within each prompt's group) with PPO clipping."""

    loss_fn = "ppo"
    config_class = GRPOConfig

    def __init__(self, config: GRPOConfig | None = None) -> None:
        self.config = config or GRPOConfig()

    def _advantages(self, batch: TrajectoryBatch) -> list[float]:
        groups: dict[Any, list[int]] = {}
        for i, t in enumerate(batch):
            groups.setdefault(t.group if t.group is not None else t.prompt, []).append(i)
        advantages = [0.0] * len(batch)
        for members in groups.values():
            for i, a in zip(members, group_advantages([batch[i].reward for i in members], self.config.normalize_std),
                            strict=True):
                advantages[i] = a
        return advantages

    def _loss_config(self) -> dict[str, float]:
        return {"clip_low_threshold": 1 - self.config.clip_range, "clip_high_threshold": 1 + self.config.clip_range}


