"""The phases of a training step, shared by the loop's modes (``loop.py``), and the run they act on.

A mode (``train_sync``, ``train_streamed``, ``train_off_policy``) is a ``for step`` whose body calls these in order:

1. :func:`refresh_sampler` -- save the weights for sampling and check the sampler really uses them;
2. ``run.rollouts.start`` with :func:`sampling_params` -- send the step's requests (``rollouts.py``);
3. :func:`collect_part` -- wait for a part, score it, centre each group's rewards and build datums;
4. :func:`send_minibatch`, :func:`send_optim` -- ``forward_backward`` and ``optim_step``, sent without waiting (the
   engine runs them in order while the loop collects the next part);
5. :func:`finish_step` -- wait for training, then log, evaluate, checkpoint (and stop, when a stop was asked for:
   ``stop.py``).

:func:`open_run` sets a run up through its run record (``run_record.py``: a fresh client, or the last checkpoint's
state and loop RNG; its checkpoints kept in the run folder) and closes what it opened; :func:`held_out` is the
held-out evaluation, shown as it goes. Everything here drives the client API only (``rlvr.ServiceClient`` and its
clients).

Not here: the order of the phases (``loop.py``), how a step's groups play (``rollouts.py``), datums of one trajectory
(``envs.trajectory_datums``), the losses (``engine/train/losses.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tinker.lib.public_interfaces.api_future import APIFuture

from rlvr import types
from rlvr.client import ServiceClient, resolve_numerics, run_precision
from rlvr.errors import ConfigurationError, RunInterrupted, SamplingError
from rlvr.metrics import reduce_metrics
from rlvr.numerics import Numerics, check_resume
from rlvr.rewards import RewardRunner
from rlvr.rl.advantages import group_advantages, group_outcomes, is_constant
from rlvr.rl.auxiliary import AuxiliaryOutputs
from rlvr.rl.config import LoopConfig
from rlvr.rl.datums import apply_kl_penalty, loss_fn_inputs, sample_train_metrics
from rlvr.rl.envs import RLDataset, trajectory_datums
from rlvr.rl.problems import as_dataset
from rlvr.rl.protocols import RewardScorer, SamplingAPI, ServiceAPI, TrainingAPI
from rlvr.rl.rollout_log import RolloutLog
from rlvr.rl.rollouts import Rollout, Rollouts, StartedPart, check_dataset
from rlvr.rl.run_record import RunRecord
from rlvr.rl.stop import StopRequest
from rlvr.rl.tracking import Trackers, open_trackers
from rlvr.tasks.base import ProblemSource

Progress = Callable[[int, dict[str, float]], None]
"""Called after each step with the step and its metrics."""

ShowEvaluation = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]
"""Shows a held-out evaluation as it goes: ``(what, problems)`` opens the display, and the callable it yields is
given the problems answered so far."""


@dataclass
class LoopRun:
    """One run as the modes see it: settings, clients, where rollouts come from, and the run's outputs."""

    config: LoopConfig
    run_dir: Path
    service: ServiceAPI
    """The service client (in-process, or proxies to Ray actors)."""
    training_client: TrainingAPI
    rollouts: Rollouts
    tracker: Trackers
    """metrics.jsonl and the tracker backends."""
    auxiliary: AuxiliaryOutputs
    """Counts the failures of the rollout pages, curves and tracker backends."""
    rollout_log: RolloutLog | None
    record: RunRecord
    """The run folder's config, checkpoints (each with the run's resolved numerics) and summary: every checkpoint is
    saved through it."""
    rng: random.Random
    """The loop's RNG (sampling seeds), saved with each checkpoint."""
    start_step: int
    """0, or the step a resume continues from."""
    adam: types.AdamParams
    reference: SamplingAPI | None
    """A base-model sampler for the KL penalty (None without one)."""
    probe: list[int]
    """Tokens the sampler's freshness is checked on."""
    progress: Progress | None = None
    stop: StopRequest = field(default_factory=StopRequest)
    """Asked for by a signal: the loop checkpoints where the step in flight ends and raises RunInterrupted."""
    show_evaluation: ShowEvaluation | None = None


@dataclass
class StepWork:
    """What one step has collected and sent so far."""

    step: int
    t_start: float = field(default_factory=time.time)
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: list[Rollout] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    """Rollout-log records with their advantage."""
    rewards_by_group: list[list[float]] = field(default_factory=list)
    """The rewards of the groups that were scored in full."""
    failed_groups: int = 0
    """Groups not trained on because a reward failed."""
    sent: list[tuple[APIFuture[types.ForwardBackwardOutput], list[types.Datum], list[list[float]], bool]] = field(
        default_factory=list)
    """Per forward_backward: its future, datums, masks, and whether it was sent before the step's first update."""
    optims: list[APIFuture[types.OptimStepResponse]] = field(default_factory=list)
    """optim_step futures."""
    unapplied: bool = False
    """A forward_backward was sent since the last optim_step."""
    kl_parts: list[tuple[float, float]] = field(default_factory=list)
    """KL to the base model per part: (mean, tokens)."""
    t_sample: float = 0.0
    """Seconds spent waiting for rollouts (from the step's start, scoring excluded)."""
    t_reward: float = 0.0
    """Seconds spent scoring."""

    def seconds_so_far(self) -> float:
        return time.time() - self.t_start


# -- setup ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def open_run(config: LoopConfig, source: ProblemSource | RLDataset, progress: Progress | None = None,
             stop: StopRequest | None = None, show_evaluation: ShowEvaluation | None = None) -> Iterator[LoopRun]:
    """A fresh training client, or the last checkpoint's state and loop RNG when ``config.resume``, whose checkpoints
    the run folder holds; closes the reward workers, trackers and env threads it opened when the block ends."""
    stop = stop or StopRequest()
    # Every task is an env dataset; a problem source becomes one here, scored by the run's reward runner.
    dataset = as_dataset(source, config)
    check_dataset(config, dataset)  # before any work
    run_dir = Path(config.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    auxiliary = AuxiliaryOutputs()  # rollout pages, curves, tracker backends, pruning: failures counted, not raised
    record = RunRecord(run_dir, auxiliary)
    numerics = run_numerics(config, record)
    with stop.abandonable():  # starting Ray and its actors: nothing to keep yet
        service, runner = _backend(config, dataset, numerics)
    stop.reclaim_signals()  # ray.init takes SIGTERM for itself
    start_step, rng = 0, random.Random(config.seed)
    resumed = record.resume_point("rl", config.steps) if config.resume else None
    if config.resume and resumed is None:
        raise ConfigurationError(f"resume=True but {run_dir} has no checkpoints.jsonl entry to resume from")
    with stop.abandonable():  # loading the model: nothing to keep yet
        training_client = record.open_client(service, resumed, base_model=config.base_model, rank=config.rank,
                                             seed=config.seed, start_from=config.start_from_checkpoint)
    if resumed is not None:
        start_step = resumed.step
        rng.setstate(resumed.random_state())
    record.write_config(dataclasses.replace(config, resume=False, accept_numerics=False, precision=numerics.precision),
                        "rl", numerics=numerics.as_record())  # the settings now in force, and the numerics resolved
    tokenizer = training_client.get_tokenizer()
    with contextlib.ExitStack() as stack:
        # Ray: the actors of a stopped or failed run end with it; a finished run's stay up for the client it returns
        stack.push(_close_on_error(service.close))
        rollouts = Rollouts(dataset, tokenizer, config, None if runner is None else stack.enter_context(runner))
        stack.callback(rollouts.close)
        reference = (service.create_sampling_client(base_model=training_client.get_info().model_name)
                     if config.kl_penalty_coef > 0 else None)
        # A resume re-runs the steps from the checkpoint's on: their rows and rollout files from before the stop are
        # dropped, so the run's files hold each step once (as the re-run logs it).
        tracker = stack.enter_context(open_trackers(config.trackers, run_dir, asdict(config), auxiliary,
                                                    start_step=start_step if resumed is not None else None))
        rollout_log = RolloutLog(run_dir) if config.rollouts else None
        if resumed is not None:
            RolloutLog(run_dir).drop_from(start_step)
        yield LoopRun(config, run_dir, service, training_client, rollouts, tracker, auxiliary,
                      rollout_log, record, rng, start_step,
                      types.AdamParams(learning_rate=config.learning_rate), reference, rollouts.probe(), progress,
                      stop, show_evaluation)


def _close_on_error(close: Callable[[], None]) -> Callable[..., bool]:
    """An exit callback for ``ExitStack.push`` that calls ``close`` when the block ends by an exception (a stop
    included), and lets the exception go on."""
    def exit_(exc_type: type[BaseException] | None, *_: Any) -> bool:
        if exc_type is not None:
            close()
        return False
    return exit_


def held_out(run: LoopRun, what: str) -> dict[str, float]:
    """The held-out evaluation of the current weights (empty: there is none), shown as ``what`` while it runs."""
    show = run.show_evaluation or _quiet
    with show(what, run.rollouts.held_out_size) as answered:
        return run.rollouts.held_out(run.training_client.save_weights_and_get_sampling_client(), answered)


@contextlib.contextmanager
def _quiet(what: str, problems: int) -> Iterator[Callable[[int], None]]:
    yield lambda answered: None


# -- the phases of a step --------------------------------------------------------------------------------------------


def refresh_sampler(run: LoopRun, metrics: dict[str, float]) -> SamplingAPI:
    """A sampling client with the current weights, checked against the trainer on the probe."""
    sampler = run.training_client.save_weights_and_get_sampling_client()
    metrics["sampler/max_logprob_gap"] = check_sampler_fresh(run.training_client, sampler, run.probe,
                                                             run.config.sampler_tolerance)
    return sampler


def check_sampler_fresh(training_client: TrainingAPI, sampling_client: SamplingAPI, probe: list[int],
                        tolerance: float) -> float:
    """Raise SamplingError unless the sampler's logprobs of ``probe`` match the trainer's (it has the new weights)."""
    datum = types.Datum(model_input=types.ModelInput.from_ints(probe[:-1]),
                        loss_fn_inputs=loss_fn_inputs(target_tokens=probe[1:], weights=[1.0] * (len(probe) - 1)))
    trainer = training_client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    sampler = _after_first(sampling_client.compute_logprobs(types.ModelInput.from_ints(probe)).result())
    gap = max(abs(a - b) for a, b in zip(trainer, sampler, strict=True))
    if gap > tolerance:
        raise SamplingError(f"the sampler does not use the current weights: its logprobs differ from the trainer's by "
                            f"up to {gap:.4g} (> {tolerance}); a weight publication did not take effect")
    return gap


def sampling_params(run: LoopRun) -> types.SamplingParams:
    """The rollouts' sampling settings, with a seed drawn from the run's RNG (so a resume draws the same)."""
    return types.SamplingParams(max_tokens=run.config.max_tokens, temperature=run.config.temperature,
                                seed=run.rng.randrange(2**31))


def collect_part(run: LoopRun, work: StepWork, pending: StartedPart) -> tuple[list[types.Datum], list[list[float]]]:
    """Wait for one part of the step's rollouts, score it, centre each group's rewards and build its datums.

    Groups with equal rewards carry no signal and groups with a failed reward are not trusted: neither is trained
    on. With a KL penalty, the base model's logprobs of the same tokens shift the advantages."""
    t0 = time.time()
    rollout = run.rollouts.collect(pending)
    work.t_sample += max(0.0, time.time() - t0 - rollout.reward_s)  # (an env thread may have finished early)
    work.t_reward += rollout.reward_s
    work.rollouts.append(rollout)
    datums: list[types.Datum] = []
    masks: list[list[float]] = []
    advantages: list[float | None] = []
    for trajectories, scores_G in zip(rollout.trajectories, rollout.rewards, strict=True):
        rewards_G = _all_scored(scores_G)
        if rewards_G is None:
            advantages += [None] * len(scores_G)
            work.failed_groups += 1
            continue
        work.rewards_by_group.append(rewards_G)
        advantages_G = group_advantages(rewards_G, run.config.normalize_advantages)
        advantages += advantages_G
        if is_constant(rewards_G):
            continue
        for trajectory, advantage in zip(trajectories, advantages_G, strict=True):
            for datum, mask in trajectory_datums(trajectory, advantage, run.config.entropy_coef):
                datums.append(datum)
                masks.append(mask)
    work.records += [{**r, "advantage": a} for r, a in zip(rollout.records, advantages, strict=True)]
    if run.reference is not None and datums:  # KL penalty: base-model logprobs of the same tokens
        futures = [run.reference.compute_logprobs(types.ModelInput.from_ints(
            d.model_input.to_ints() + d.loss_fn_inputs["target_tokens"].tolist()[-1:])) for d in datums]
        datums, kl = apply_kl_penalty(datums, masks, [_after_first(f.result()) for f in futures],
                                      run.config.kl_penalty_coef)
        work.kl_parts.append((kl["kl_policy_base"], sum(sum(m) for m in masks)))
    return datums, masks


def send_minibatch(run: LoopRun, work: StepWork, datums: list[types.Datum], masks: list[list[float]]) -> None:
    """A forward_backward on ``datums``, sent without waiting."""
    if not datums:
        return
    future = run.training_client.forward_backward(datums, run.config.loss_fn, run.config.loss_fn_config or None)
    work.sent.append((future, datums, masks, not work.optims))
    work.unapplied = True


def send_optim(run: LoopRun, work: StepWork) -> None:
    """An optim_step, sent without waiting, if a forward_backward was sent since the last one."""
    if work.unapplied:
        work.optims.append(run.training_client.optim_step(run.adam))
        work.unapplied = False


def finish_step(run: LoopRun, work: StepWork) -> None:
    """Wait for the step's training, then log its metrics, evaluate (every ``eval_every``) and checkpoint (every
    ``save_every``, at the last step, and when a stop was asked for, which then raises RunInterrupted)."""
    config, metrics, step = run.config, work.metrics, work.step
    t_train = time.time()
    metrics.update(_training_metrics(work))
    metrics.update(run.rollouts.metrics(work.rollouts))
    metrics.update(group_outcomes(work.rewards_by_group))
    metrics["by_group/frac_failed"] = work.failed_groups / max(work.failed_groups + len(work.rewards_by_group), 1)
    metrics["time/sample"] = work.t_sample
    metrics["time/reward"] = work.t_reward
    if run.rollout_log is not None:  # every answer with its reward and advantage, as JSONL and an HTML page
        run.auxiliary.run("rollout log", run.rollout_log.write, step, work.records)
    metrics["train/datums"] = sum(len(datums) for _, datums, _, _ in work.sent)
    metrics["time/train"] = time.time() - t_train  # what training took beyond the rollouts' time

    if config.eval_every and (step + 1) % config.eval_every == 0:
        metrics.update(held_out(run, f"evaluating after step {step + 1}"))
    metrics["time/total"] = time.time() - work.t_start
    metrics["tokens_per_s"] = sum(r.sampled_tokens for r in work.rollouts) / metrics["time/total"]
    metrics.update(run.service.distributed_metrics())  # Ray: actor restarts and re-sent requests so far
    metrics["aux/failures"] = run.auxiliary.total
    run.tracker.log(metrics, step)
    if run.progress is not None:
        run.progress(step, metrics)
    final = step + 1 == config.steps
    if (config.save_every and (step + 1) % config.save_every == 0) or final or run.stop.requested:
        save_checkpoint(run, step + 1, final)
        # A stop asked for before the save or during it ends the run here (after the last step, the final
        # evaluation ends it at once).
        if run.stop.requested and not final:
            raise RunInterrupted(run.stop.signum, step + 1)  # type: ignore[arg-type]


def save_checkpoint(run: LoopRun, steps_done: int, final: bool) -> None:
    """Save the state after ``steps_done`` steps with the loop's RNG, record it, and delete the checkpoints
    ``keep_checkpoints`` no longer keeps (a failure to delete is logged; training goes on): ``RunRecord.save``."""
    run.record.save(run.training_client, "rl", steps_done, final=final, keep=run.config.keep_checkpoints, rng=run.rng)


def _training_metrics(work: StepWork) -> dict[str, float]:
    """The step's training numbers over all its minibatches: the losses' metrics reduced by their suffix, the
    sampler/trainer comparison over the minibatches sent before the first update, the grad norm per optimizer step
    (mean and max), the KL to the base model weighted by tokens."""
    metrics: dict[str, float] = {}
    outputs, trained, sampled, masks = [], [], [], []
    for future, datums, datum_masks, before_update in work.sent:
        out = future.result()
        outputs.append((out.metrics, sum(sum(m) for m in datum_masks)))
        if before_update:
            trained += [o["logprobs"].tolist() for o in out.loss_fn_outputs]
            sampled += [d.loss_fn_inputs["logprobs"].tolist() for d in datums]
            masks += datum_masks
    if outputs:
        metrics.update({f"optim/{key}": v for key, v in reduce_metrics(outputs).items()})
    if trained:
        metrics.update(sample_train_metrics(trained, sampled, masks))
    if work.kl_parts:
        tokens = sum(n for _, n in work.kl_parts)
        metrics["kl_policy_base"] = sum(v * n for v, n in work.kl_parts) / tokens if tokens else 0.0
    metrics["optim/steps"] = len(work.optims)
    if work.optims:
        results = [opt.result().metrics or {} for opt in work.optims]
        grad_norms = [m["grad_norm:mean"] for m in results]
        metrics["optim/grad_norm"] = sum(grad_norms) / len(grad_norms)
        metrics["optim/grad_norm:max"] = max(grad_norms)
        metrics["optim/lr"] = results[-1]["learning_rate:mean"]
    return metrics


def _all_scored(rewards_G: list[float | None]) -> list[float] | None:
    """A group's rewards, or None when scoring failed for any of its trajectories (None, or NaN)."""
    scored = [r for r in rewards_G if r is not None and not math.isnan(r)]
    return scored if len(scored) == len(rewards_G) else None


def _after_first(logprobs: list[float | None]) -> list[float]:
    """``compute_logprobs``' answer without its first entry (None: the first token has no context)."""
    rest = logprobs[1:]
    if any(lp is None for lp in rest):
        raise SamplingError("compute_logprobs gave None past the first token; every later token has a logprob")
    return [lp for lp in rest if lp is not None]


# -- setup helpers -----------------------------------------------------------------------------------------------


def _requested_numerics(config: LoopConfig, record: RunRecord) -> Numerics:
    """The numerics policy the run asks for (``config.requested_numerics``: the config, else the environment), its
    precision ``config.precision``, else on a resume the precision the run recorded, else ``$RLVR_PRECISION``, else
    the model's default on this machine (``rlvr.client.run_precision``). The engine resolves the rest
    (``rlvr.client.resolve_numerics``); a resume must then match what the run recorded
    (``rlvr.numerics.check_resume``)."""
    recorded = (record.numerics or {}).get("precision") if config.resume else None
    precision = run_precision(config.precision or recorded, config.base_model)
    return dataclasses.replace(config.requested_numerics(), precision=precision)


def run_numerics(config: LoopConfig, record: RunRecord) -> Numerics:
    """The numerics policy the run computes by (``_requested_numerics``), resolved on this machine (the process's
    engine's; for Ray, as an engine here would), and on a resume checked against what the run recorded: a
    ConfigurationError naming both where they differ in precision or matmul kinds, unless ``accept_numerics``."""
    requested = _requested_numerics(config, record)
    if config.distributed.backend == "ray" and config.distributed.sampler == "vllm":  # before anything starts
        check_vllm_arithmetic(config, requested.precision or "float32")
    numerics = resolve_numerics(requested, local=config.distributed.backend != "ray")
    check_resume(record.numerics if config.resume else None, numerics, record.run_dir, config.accept_numerics)
    return numerics


def _precision(config: LoopConfig, run_dir: Path) -> str:
    """What the run's frozen matmuls run in (``_requested_numerics``), recorded in its config.yaml."""
    return _requested_numerics(config, RunRecord(run_dir)).precision  # type: ignore[return-value]  # a str here


def _backend(config: LoopConfig, dataset: RLDataset, numerics: Numerics) -> tuple[ServiceAPI, RewardScorer | None]:
    """The service client and the reward runner the loop drives: in-process, or proxies to Ray actors (no runner
    for a dataset whose envs score themselves). Their engines compute by ``numerics``, the run's resolved policy (Ray
    actors take its settings and precision and resolve the rest on their machines)."""
    reward = dataset.play.reward
    precision = numerics.precision or "float32"
    if config.distributed.backend == "ray":
        from rlvr.distributed import ray_backend

        return ray_backend(config.distributed, reward, timeout=config.reward_timeout, seed=config.seed,
                           numerics=dataclasses.replace(config.requested_numerics(), precision=precision))
    return (ServiceClient(numerics=numerics),
            None if reward is None else RewardRunner(reward, timeout=config.reward_timeout))


def check_vllm_arithmetic(config: LoopConfig, precision: str) -> None:
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

