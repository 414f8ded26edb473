"""The RLVR loop over a problem source or an env dataset: roll out groups, score, centre, train, log, save.

Setup, then one ``for step`` whose body is a series of paragraphs, each a phase: refresh and check the sampler,
start rollouts, collect and score them (in killable workers: a reward that hangs or raises is counted, not scored
0), advantages, datums, train, log, checkpoint. It drives only the client API, so the same loop runs on the
in-process engine or a server.

Synchronous by default. ``stream_minibatches`` trains each part of a step's problems as soon as it is scored while
later parts still sample; ``max_steps_off_policy`` keeps later steps' rollouts in flight (sampled with older
weights) while the current step trains. Both send training calls without waiting, so the engine works through
them while the loop collects and scores the next part.

A curriculum (``LoopConfig.curriculum``) narrows each step's problems to a difficulty stage. The algorithm objects
of the TenSafe cookbook live in ``algorithms``, the rollout pages in ``rollouts``.

With an env dataset (``envs.RLDataset``) each group is played turn by turn and the envs score themselves; its
``test_groups`` are the held-out evaluation, and the curriculum belongs to problem sources. Truncated importance
weights are ``loss_fn="cispo"`` with ``clip_low_threshold=0`` (see ``losses.cispo``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import rlvr
from rlvr import types
from rlvr.errors import ConfigurationError, SamplingError
from rlvr.precision import base_precision
from rlvr.rewards import RewardItem, RewardRunner
from rlvr.rewards.runner import BatchScores
from rlvr.rl.advantages import group_advantages, group_outcomes, is_constant
from rlvr.rl.checkpoints import last_checkpoint, record_checkpoint
from rlvr.rl.config import DistributedConfig, LoopConfig, recorded_precision, save_config
from rlvr.rl.datums import apply_kl_penalty, sample_train_metrics
from rlvr.rl.envs import RLDataset, Trajectory, Transition, evaluate_envs, rollout_groups, trajectory_datums
from rlvr.rl.plot import plot_run
from rlvr.rl.rollouts import RolloutLog
from rlvr.rl.tracking import open_trackers
from rlvr.tasks.base import Problem, ProblemSource, select

__all__ = ["DistributedConfig", "LoopConfig", "check_sampler_fresh", "curriculum_problems", "evaluate", "train"]


def check_sampler_fresh(training_client: Any, sampling_client: Any, probe: list[int], tolerance: float) -> float:
    """Raise SamplingError unless the sampler's logprobs of ``probe`` match the trainer's (it has the new weights)."""
    datum = types.Datum(model_input=types.ModelInput.from_ints(probe[:-1]),
                        loss_fn_inputs={"target_tokens": probe[1:], "weights": [1.0] * (len(probe) - 1)})
    trainer = training_client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    sampler = sampling_client.compute_logprobs(types.ModelInput.from_ints(probe)).result()[1:]
    gap = max(abs(a - b) for a, b in zip(trainer, sampler, strict=True))
    if gap > tolerance:
        raise SamplingError(f"the sampler does not use the current weights: its logprobs differ from the trainer's by "
                            f"up to {gap:.4g} (> {tolerance}); a weight publication did not take effect")
    return gap


def curriculum_problems(problems: list[Problem], curriculum: dict[int, float], step: int) -> list[Problem]:
    """The training problems of ``step``: those no harder than the curriculum stage it falls in (all without one)."""
    if not curriculum:
        return problems
    max_difficulty = curriculum[max(s for s in curriculum if s <= step)]
    chosen = select(problems, max_difficulty=max_difficulty)
    if not chosen:
        known = sorted({p.difficulty for p in problems if p.difficulty is not None})
        raise ConfigurationError(f"curriculum: no training problem has difficulty <= {max_difficulty} (stage of "
                                 f"step {step}); the source's difficulties are {known or 'not set'}")
    return chosen


def evaluate(sampling_client: Any, tokenizer: Any, source: ProblemSource, problems: list[Problem],
             runner: RewardRunner, max_tokens: int) -> dict[str, float]:
    """Greedy held-out evaluation: ``test/reward/mean`` and ``test/correct`` (reward >= 1)."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [sampling_client.sample(types.ModelInput.from_ints(source.render_ids(p, tokenizer)), 1, params)
               for p in problems]
    responses = [tokenizer.decode(f.result().sequences[0].tokens, skip_special_tokens=True) for f in futures]
    scores = runner.score([RewardItem(p.question, r, p.reward_meta()) for p, r in zip(problems, responses,
                                                                                      strict=True)])
    values = [s for s in scores.scores if s is not None]
    return {**scores.metrics("test/reward"), "test/correct": sum(v >= 1.0 for v in values) / max(len(values), 1)}


def train(config: LoopConfig, source: ProblemSource | RLDataset, progress: Any = None) -> dict[str, Any]:
    """Run the loop on a problem source or an env dataset; returns the before/after held-out evaluations (absent
    for an env dataset without ``test_groups``) and the training client."""
    envs = isinstance(source, RLDataset)
    if envs:
        _check_env_dataset(config, source)
    run_dir = Path(config.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    precision = _precision(config, run_dir)
    service, runner = _backend(config, source, precision)
    rollout_log = RolloutLog(run_dir) if config.rollouts else None

    # Setup: a fresh client, or the last checkpoint's state and loop RNG.
    start_step, rng = 0, random.Random(config.seed)
    resumed = last_checkpoint(run_dir) if config.resume else None
    if config.resume and resumed is None:
        raise ConfigurationError(f"resume=True but {run_dir} has no checkpoints.jsonl entry to resume from")
    if resumed is not None:
        training_client = service.create_training_client_from_state_with_optimizer(resumed["state_path"])
        start_step = resumed["step"]
        rng.setstate(_rng_state(resumed["rng"]))
        if start_step >= config.steps:
            raise ConfigurationError(f"the last checkpoint in {run_dir} is at step {start_step} and steps="
                                     f"{config.steps}: nothing remains to train; raise steps to continue")
    elif config.start_from_checkpoint:
        training_client = service.create_training_client_from_state(config.start_from_checkpoint)
    else:
        training_client = service.create_lora_training_client(base_model=config.base_model, rank=config.rank,
                                                               seed=config.seed)
    save_config(dataclasses.replace(config, resume=False, precision=precision),  # the settings now in force
                run_dir / "config.yaml")
    tokenizer = training_client.get_tokenizer()
    adam = types.AdamParams(learning_rate=config.learning_rate)
    if envs:
        probe = list(source.get_batch(0)[0].make_envs()[0].initial_observation())[:16]
        test_groups = list(source.test_groups())
    else:
        train_problems = source.problems("train", shuffle=True, seed=config.seed)
        test_problems = source.problems(_test_split(source), limit=config.eval_problems)
        for stage in config.curriculum:  # an empty stage is a config error now, not at its step
            curriculum_problems(train_problems, config.curriculum, stage)
        probe = source.render_ids(train_problems[0], tokenizer)[:16]
    reference = (service.create_sampling_client(base_model=training_client.get_info().model_name)
                 if config.kl_penalty_coef > 0 else None)
    results: dict[str, Any] = {}

    def held_out(sampler: Any) -> dict[str, float]:
        """Greedy evaluation on the test problems, or the env dataset's held-out groups (none: no evaluation)."""
        if envs:
            return evaluate_envs(sampler, test_groups, config.max_tokens, config.max_turns) if test_groups else {}
        return evaluate(sampler, tokenizer, source, test_problems, runner, config.max_tokens)

    env_threads = ThreadPoolExecutor(1, thread_name_prefix="rlvr-env-rollouts")  # env rollouts in step order
    with runner or contextlib.nullcontext(), open_trackers(config.trackers, run_dir, asdict(config)) as tracker, \
            env_threads:
        if start_step == 0 and (before := held_out(training_client.save_weights_and_get_sampling_client())):
            results["before"] = before
        in_flight: collections.deque[_InFlight] = collections.deque()  # rollouts started, oldest first
        for step in range(start_step, config.steps):
            t_start = time.time()
            metrics: dict[str, float] = {}

            # Refresh the sampler and check it really samples the current weights.
            sampler = training_client.save_weights_and_get_sampling_client()
            metrics["sampler/max_logprob_gap"] = check_sampler_fresh(training_client, sampler, probe,
                                                                     config.sampler_tolerance)

            # Start rollouts with this sampler: this step's (synchronous), or, off-policy, the one
            # max_steps_off_policy steps ahead, so that many later batches sample while this one trains. Problem
            # rollouts are requests in flight (scored when collected); env rollouts play in a thread.
            started = in_flight[-1].step + 1 if in_flight else step
            for ahead in range(started, min(step + config.max_steps_off_policy, config.steps - 1) + 1):
                params = types.SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature,
                                              seed=rng.randrange(2**31))
                if envs:
                    in_flight.append(_InFlight(ahead, step, [env_threads.submit(
                        _env_rollout, source.get_batch(ahead % len(source)), sampler, params, config, tokenizer)]))
                else:
                    pool = curriculum_problems(train_problems, config.curriculum, ahead)
                    first = ahead * config.problems_per_step
                    problems = [pool[(first + i) % len(pool)] for i in range(config.problems_per_step)]
                    parts = config.stream_minibatches or 1
                    in_flight.append(_InFlight(ahead, step, [
                        _start_problems(source, problems[i * len(problems) // parts:(i + 1) * len(problems) // parts],
                                        sampler, params, config.group_size, tokenizer) for i in range(parts)],
                        max(p.difficulty for p in pool) if config.curriculum else None))
            batch = in_flight.popleft()
            metrics["async/steps_off_policy"] = step - batch.weights_step
            if batch.max_difficulty is not None:
                metrics["curriculum/max_difficulty"] = batch.max_difficulty

            # Collect, score, centre, train: each part of the batch (one unless streaming) as soon as it is
            # scored, while later parts still sample. Groups with equal (or failed) rewards carry no signal.
            t_sample, t_reward = time.time() - t_start, 0.0
            rollouts, rewards_by_group, records, sent, optims, unapplied = [], [], [], [], [], False
            for pending, optim_after in _minibatches(batch.parts, config.num_substeps):
                t0 = time.time()
                rollout = pending.result() if envs else _collect_problems(pending, runner, tokenizer)
                t_sample += max(0.0, time.time() - t0 - rollout.reward_s)  # (an env thread may have finished early)
                t_reward += rollout.reward_s
                rollouts.append(rollout)
                datums, masks, advantages = [], [], []
                for trajectories, rewards_G in zip(rollout.trajectories, rollout.rewards, strict=True):
                    if any(r is None for r in rewards_G):
                        advantages += [None] * len(rewards_G)
                        continue
                    rewards_by_group.append(rewards_G)
                    advantages_G = group_advantages(rewards_G, config.normalize_advantages)
                    advantages += advantages_G
                    if is_constant(rewards_G):
                        continue
                    for trajectory, advantage in zip(trajectories, advantages_G, strict=True):
                        for datum, mask in trajectory_datums(trajectory, advantage, config.entropy_coef):
                            datums.append(datum)
                            masks.append(mask)
                records += [{**r, "advantage": a} for r, a in zip(rollout.records, advantages, strict=True)]
                if reference is not None and datums:  # KL penalty: base-model logprobs of the same tokens
                    futures = [reference.compute_logprobs(types.ModelInput.from_ints(
                        d.model_input.to_ints() + d.loss_fn_inputs["target_tokens"].tolist()[-1:])) for d in datums]
                    base = [f.result()[1:] for f in futures]
                    datums, kl_metrics = apply_kl_penalty(datums, masks, base, config.kl_penalty_coef)
                    metrics.update(kl_metrics)
                # Train: a forward_backward per minibatch and an optim_step after each substep's minibatches,
                # sent without waiting (the engine runs them in order while the next part is collected).
                splits = config.num_substeps if len(batch.parts) == 1 else 1  # a streamed part is one minibatch
                for chunk, chunk_masks, optim_now in _substeps(datums, masks, optim_after, splits):
                    if chunk:
                        sent.append((training_client.forward_backward(chunk, config.loss_fn,
                                                                      config.loss_fn_config or None),
                                     chunk, chunk_masks))
                        unapplied = True
                    if optim_now and unapplied:
                        optims.append(training_client.optim_step(adam))
                        unapplied = False
            t_train = time.time()
            for i, (fwd, chunk, chunk_masks) in enumerate(sent):
                out = fwd.result()
                metrics.update({f"optim/{key}": v for key, v in out.metrics.items()})
                if i == 0:  # sent before this step's first update: the sampler/trainer comparison
                    metrics.update(sample_train_metrics([o["logprobs"].tolist() for o in out.loss_fn_outputs],
                                                        [d.loss_fn_inputs["logprobs"].tolist() for d in chunk],
                                                        chunk_masks))
            metrics["optim/steps"] = len(optims)
            for opt in optims:
                optim = opt.result().metrics
                metrics["optim/grad_norm"] = optim["grad_norm:mean"]
                metrics["optim/lr"] = optim["learning_rate:mean"]
            metrics.update(_rollout_metrics(rollouts))
            metrics.update(group_outcomes(rewards_by_group))
            metrics["time/sample"] = t_sample
            metrics["time/reward"] = t_reward
            if rollout_log is not None:  # every answer with its reward and advantage, as JSONL and an HTML page
                rollout_log.write(step, records)
            datum_count = sum(len(chunk) for _, chunk, _ in sent)
            metrics["train/datums"] = datum_count
            metrics["time/train"] = time.time() - t_train  # what training took beyond the rollouts' time

            # Log, evaluate, checkpoint.
            if config.eval_every and (step + 1) % config.eval_every == 0:
                metrics.update(held_out(training_client.save_weights_and_get_sampling_client()))
            metrics["time/total"] = time.time() - t_start
            metrics["tokens_per_s"] = sum(r.sampled_tokens for r in rollouts) / metrics["time/total"]
            if hasattr(service, "distributed_metrics"):  # Ray: actor restarts and re-sent requests so far
                metrics.update(service.distributed_metrics())
            tracker.log(metrics, step)
            if (config.save_every and (step + 1) % config.save_every == 0) or step + 1 == config.steps:
                path = training_client.save_state(f"step-{step + 1:06d}").result().path
                record_checkpoint(run_dir, {"step": step + 1, "state_path": path, "rng": rng.getstate()})
            if progress is not None:
                progress(step, metrics)

        if after := held_out(training_client.save_weights_and_get_sampling_client()):
            results["after"] = after
    lines = {f"{when} accuracy": results[when]["test/correct"] for when in ("before", "after") if when in results}
    results["plot"] = plot_run(run_dir, extra=lines)
    results["training_client"] = training_client
    return results


@dataclass
class _Rollout:
    """Rollouts of some groups, scored: what the rest of the step trains on and logs."""

    trajectories: list[list[Trajectory]]
    """Per group, its trajectories."""
    rewards: list[list[float | None]]
    """Per group, each trajectory's reward (None: scoring failed, and the group is not trained on)."""
    records: list[dict[str, Any]]
    """Rollout-log records, one per trajectory in group order, without their advantage."""
    sampled_tokens: int
    """Tokens sampled in all."""
    reward_s: float
    """Seconds spent scoring (for envs: in their ``step`` calls)."""
    scores: BatchScores | None = None
    """Problem rollouts: the reward runner's scores, one per answer in group order."""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """Env rollouts: their ``env/all/...`` metrics."""


@dataclass
class _InFlight:
    """One step's rollouts, started: problem rollouts as parts of requests in flight (several when streaming),
    env rollouts as one thread's future."""

    step: int
    """The step it is for."""
    weights_step: int
    """The step whose weights sample it."""
    parts: list[Any]
    max_difficulty: float | None = None


@dataclass
class _PendingProblems:
    problems: list[Problem]
    prompts: list[list[int]]
    futures: list[Any]


def _start_problems(source: ProblemSource, problems: list[Problem], sampler: Any, params: types.SamplingParams,
                    group_size: int, tokenizer: Any) -> _PendingProblems:
    """Send ``group_size`` sampling requests per problem without waiting for them."""
    prompts = [source.render_ids(p, tokenizer) for p in problems]
    futures = [sampler.sample(types.ModelInput.from_ints(p), group_size, params) for p in prompts]
    return _PendingProblems(problems, prompts, futures)


def _collect_problems(pending: _PendingProblems, runner: RewardRunner, tokenizer: Any) -> _Rollout:
    """Wait for the answers and score them in killable workers (a failure is counted, never scored 0)."""
    groups = [f.result().sequences for f in pending.futures]
    t_reward = time.time()
    items = [RewardItem(p.question, tokenizer.decode(s.tokens, skip_special_tokens=True), p.reward_meta())
             for p, seqs in zip(pending.problems, groups, strict=True) for s in seqs]
    scores = runner.score(items)
    G = len(groups[0])
    trajectories = [[Trajectory([Transition(prompt, list(s.tokens), list(s.logprobs), scores.scores[g * G + i] or 0.0)])
                     for i, s in enumerate(seqs)]
                    for g, (prompt, seqs) in enumerate(zip(pending.prompts, groups, strict=True))]
    failures: dict[int, list[str]] = {}
    for failure in scores.failures:
        failures.setdefault(failure.index, []).append(f"{failure.reward} {failure.kind}: {failure.message}")
    prompt_texts = [tokenizer.decode(p) for p in pending.prompts]
    records = [{"problem_id": pending.problems[i // G].id, "prompt": prompt_texts[i // G], "response": item.response,
                "reward": scores.scores[i], "parts": {name: values[i] for name, values in scores.parts.items()},
                "failure": "; ".join(failures[i]) if i in failures else None}
               for i, item in enumerate(items)]
    rewards = [scores.scores[g * G:(g + 1) * G] for g in range(len(groups))]
    sampled = sum(len(s.tokens) for seqs in groups for s in seqs)
    return _Rollout(trajectories, rewards, records, sampled, time.time() - t_reward, scores)


def _rollout_metrics(rollouts: list[_Rollout]) -> dict[str, float]:
    """``env/all/...`` over all of a step's rollouts."""
    if rollouts[0].scores is None:  # envs: one rollout, its own metrics
        return rollouts[0].metrics
    scores = BatchScores.concat([r.scores for r in rollouts])
    metrics = scores.metrics("env/all/reward")
    scored = [v for v in scores.scores if v is not None]
    for part in ("correct", "format"):  # the parts of format_correct, or: solved = full reward
        values = [v for v in scores.parts.get(part, []) if v is not None]
        if values:
            metrics[f"env/all/{part}"] = sum(values) / len(values)
    metrics.setdefault("env/all/correct", sum(v >= 1.0 for v in scored) / max(len(scored), 1))
    metrics["env/all/ac_tokens_per_turn"] = sum(r.sampled_tokens for r in rollouts) / len(scores.scores)
    return metrics


def _minibatches(parts: list[Any], num_substeps: int) -> list[tuple[Any, bool]]:
    """Each part of a batch with whether an optim_step follows it: when streaming, after every
    ``len(parts) / num_substeps`` parts; otherwise the one part's datums are split into the substeps."""
    if len(parts) == 1:
        return [(parts[0], True)]
    per_substep = len(parts) // num_substeps
    return [(part, (i + 1) % per_substep == 0) for i, part in enumerate(parts)]


def _substeps(datums: list, masks: list, optim_after: bool, splits: int) -> list[tuple[list, list, bool]]:
    """A part's datums as (minibatch, masks, optim_step after it): ``splits`` minibatches each followed by an
    optim_step (an unstreamed batch: ``num_substeps`` of them), or one (a streamed part, ``splits=1``)."""
    if splits == 1 or not datums:
        return [(datums, masks, optim_after)]
    size = -(-len(datums) // splits)
    return [(datums[k:k + size], masks[k:k + size], True) for k in range(0, len(datums), size)]


def _env_rollout(builders: Any, sampler: Any, params: types.SamplingParams, config: LoopConfig,
                 tokenizer: Any) -> _Rollout:
    """Every env of the step's groups played to the end (or ``max_turns``); rewards are the envs' own."""
    timing: dict[str, float] = {}
    groups = rollout_groups(sampler, builders, params, max_turns=config.max_turns, seed=params.seed, timing=timing)
    trajectories = [g.trajectories for g in groups]
    rewards: list[list[float | None]] = [list(g.total_rewards()) for g in groups]
    flat = [r for rewards_G in rewards for r in rewards_G]
    turns = [t for group in trajectories for trajectory in group for t in trajectory.transitions]
    sampled = sum(len(t.action) for t in turns)
    metrics = {"env/all/reward/mean": sum(flat) / len(flat), "env/all/correct": sum(r >= 1.0 for r in flat) / len(flat),
               "env/all/turns": len(turns) / len(flat), "env/all/ac_tokens_per_turn": sampled / len(turns),
               "env/all/unfinished": sum(not t.finished for g in trajectories for t in g) / len(flat)}
    for key in sorted({k for t in turns for k in t.metrics}):  # the envs' own numbers, averaged over turns
        values = [t.metrics[key] for t in turns if key in t.metrics]
        metrics[f"env/all/{key}"] = sum(values) / len(values)
    records = [{"problem_id": f"{type(builder).__name__}[{b}]", "response": _conversation(t, tokenizer),
                "prompt": tokenizer.decode(t.transitions[0].observation), "reward": r, "parts": {},
                "failure": None if t.finished else f"cut at max_turns={config.max_turns}"}
               for b, (builder, group, rewards_G) in enumerate(zip(builders, groups, rewards, strict=True))
               for t, r in zip(group.trajectories, rewards_G, strict=True)]
    return _Rollout(trajectories, rewards, records, sampled, timing["env"], metrics=metrics)


def _conversation(trajectory: Trajectory, tokenizer: Any) -> str:
    """What followed the first observation: the actions and the env's replies, as text."""
    first, last = trajectory.transitions[0], trajectory.transitions[-1]
    full = last.observation + last.action
    if full[:len(first.observation)] == first.observation:
        return tokenizer.decode(full[len(first.observation):])
    return "\n---\n".join(tokenizer.decode(t.action) for t in trajectory.transitions)


def _check_env_dataset(config: LoopConfig, dataset: RLDataset) -> None:
    """What the loop cannot do with envs, refused before any work."""
    if len(dataset) < 1:
        raise ConfigurationError(f"{type(dataset).__name__} has no batches; an env dataset needs at least one")
    if config.curriculum:
        raise ConfigurationError("curriculum applies to problem sources; an env dataset orders its own batches")
    if config.stream_minibatches:
        raise ConfigurationError("stream_minibatches applies to problem sources; an env dataset's groups are played "
                                 "turn by turn together (use max_steps_off_policy to overlap them with training)")
    if config.distributed.backend != "local":
        raise ConfigurationError("distributed.backend='ray' takes problem sources; envs run in this process")


def _precision(config: LoopConfig, run_dir: Path) -> str:
    """What the run's frozen matmuls run in (recorded in its config.yaml): ``config.precision``, else on a resume
    the precision the run recorded, else ``$RLVR_PRECISION`` or float32. Resuming in another precision than the
    run's would change its arithmetic half-way: an error."""
    recorded = recorded_precision(run_dir) if config.resume else None
    precision = base_precision(config.precision or recorded)
    if recorded and precision != recorded:
        raise ConfigurationError(f"{run_dir} trained with precision={recorded}; resuming it with precision="
                                 f"{precision} would change its arithmetic half-way: set precision={recorded} (or "
                                 "start a new run)")
    return precision


def _backend(config: LoopConfig, source: ProblemSource | RLDataset, precision: str) -> tuple[Any, Any]:
    """The service client and the reward runner the loop drives: in-process, or proxies to Ray actors (envs score
    themselves: no runner). Their engines multiply in ``precision``."""
    if isinstance(source, RLDataset):
        return rlvr.ServiceClient(precision=precision), None
    if config.distributed.backend == "ray":
        from rlvr.distributed import ray_backend

        if config.distributed.sampler == "vllm":
            _check_vllm_arithmetic(config, precision)
        return ray_backend(config.distributed, source.reward(), timeout=config.reward_timeout, seed=config.seed,
                           precision=precision)
    return rlvr.ServiceClient(precision=precision), RewardRunner(source.reward(), timeout=config.reward_timeout)


def _check_vllm_arithmetic(config: LoopConfig, precision: str) -> None:
    """Refuse vLLM samplers that cannot pass the freshness probe at the default ``sampler_tolerance``: the probe
    compares the sampler's logprobs with the trainer's, so it only tells stale weights from fresh ones when both
    compute alike. vLLM computes in its ``dtype`` (float32 unless ``distributed.vllm_options`` sets it); beside a
    trainer whose frozen matmuls run in bfloat16, or with vLLM in another dtype, the gap is far above 1e-3 (on
    smollm2 with vLLM's CPU build: up to 0.11-0.13 per token for a bfloat16 trainer beside float32 vLLM, 0.26-1.0
    with both in bfloat16), and every publication would be reported stale. A raised tolerance says the run accepts
    the weaker check."""
    dtype = str(config.distributed.vllm_options.get("dtype", "float32")).removeprefix("torch.")
    alike = precision == "float32" and dtype in ("float32", "float")
    if alike or config.sampler_tolerance > LoopConfig.sampler_tolerance:  # the class attribute is the default
        return
    raise ConfigurationError(
        f"distributed.sampler=vllm computes in dtype={dtype} while this run's trainer uses precision={precision}: "
        f"their logprobs differ by far more than sampler_tolerance={config.sampler_tolerance}, so the freshness "
        "probe would report every weight publication stale. Use precision=float32 with vLLM in float32 (its "
        "default), or raise sampler_tolerance above the gap (about 0.15 for a bfloat16 trainer beside float32 vLLM "
        "on smollm2), accepting that the probe then only catches larger staleness")


def _test_split(source: ProblemSource) -> str:
    splits = source.splits()
    for name in ("test", "validation", "val"):
        if name in splits:
            return name
    raise ConfigurationError(f"{type(source).__name__} has splits {list(splits)}; evaluation needs a 'test' split")


def _rng_state(saved: list) -> tuple:
    """random.Random state from its JSON form (lists back to tuples)."""
    version, internal, gauss = saved
    return version, tuple(internal), gauss
