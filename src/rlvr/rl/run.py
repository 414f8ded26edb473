"""A whole RL run as ``rlvr train`` does it: config -> problem source -> optional warm-up -> loop -> result table.

    import rlvr
    result = rlvr.train({"recipe": "arithmetic", "steps": 10})       # or a TrainConfig, or a YAML path
    rlvr.train("my.yaml", overrides=["steps=40"])
    rlvr.resume("runs/arithmetic-20261122-101500", overrides=["steps=40"])

A run folder holds ``config.yaml`` (resolved), ``status.json`` (running / finished / failed, with the error),
``metrics.jsonl``, ``checkpoints.jsonl``, ``summary.json`` (held-out evaluations of the base model, after the
warm-up if there is one, and after RL), ``curves.png`` and ``rollouts/``. The console shows a progress bar (step,
reward, accuracy, tokens/s, ETA) and ends with the table ``Metric | Baseline | [After warm-up |] After |
Improvement``.

What it is not: the loop itself (``rlvr.rl.loop``), evaluation of a saved model (``rlvr.rl.evaluation``), or
argument parsing (``rlvr.cli``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.fileio import append_jsonl, write_atomic
from rlvr.precision import base_precision
from rlvr.rl.config import TrainConfig, as_config, read_config_file, resolve_config, save_config
from rlvr.rl.evaluation import evaluate
from rlvr.rl.progress import StepProgress, phase
from rlvr.rl.recipes import build_source
from rlvr.rl.sft import sft

__all__ = ["build_source", "evaluate", "resume", "sft", "train"]

def train(config: TrainConfig | dict[str, Any] | str | Path | None = None, overrides: list[str] | None = None,
          console: Any = None) -> dict[str, Any]:
    """Run RL as ``rlvr train``: returns ``{"before", "after", "summary", "run_dir", ...}``."""
    config = as_config(config, overrides)
    if not config.out or config.out == TrainConfig.out:  # the default folder: one per run, named by recipe and time
        config = dataclasses.replace(config, out=f"runs/{config.recipe}-{time.strftime('%Y%m%d-%H%M%S')}")
    source = build_source(config)
    run_dir = Path(config.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not config.resume:  # `rlvr resume` needs it from the start: a warm-up may be stopped before the loop begins
        save_config(dataclasses.replace(config, precision=base_precision(config.precision)), run_dir / "config.yaml")
    _status(run_dir, "running")
    try:
        result = _train(config, source, run_dir, console)
    except BaseException as exc:
        _status(run_dir, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    _status(run_dir, "finished")
    return result


SUMMARY_ROWS = (("pass rate", "test/correct"), ("accuracy", "test/reward/correct/mean"),
                ("mean reward", "test/reward/mean"))
"""The summary's rows: full reward; the ``correct`` part of a format-and-correct reward (the final answer right,
boxed or not); the mean reward."""


def resume(run_dir: str | Path, overrides: list[str] | None = None, console: Any = None) -> dict[str, Any]:
    """Continue the run in ``run_dir`` from its last checkpoint (``steps=N`` in overrides trains further)."""
    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigurationError(f"{run_dir} is not a run folder (no config.yaml); `rlvr runs` lists the runs")
    config = resolve_config(base=read_config_file(saved), overrides=[*(overrides or []), "resume=true",
                                                                     f"out={run_dir}"])
    return train(config, console=console)


def _train(config: TrainConfig, source: Any, run_dir: Path, console: Any) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from rlvr.rl.checkpoints import last_checkpoint
    from rlvr.rl.loop import train as loop

    console = console or Console()
    console.print(f"[bold]rlvr train[/bold] recipe={config.recipe} model={config.base_model} steps={config.steps} "
                  f"-> {run_dir}")
    config = _after_warmup(config, source, run_dir, console)

    start = last_checkpoint(run_dir)["step"] if config.resume else 0
    with StepProgress(console, "step", config.steps, start=start,
                      status="evaluating the baseline" if not start else "") as progress:

        def on_step(step: int, m: dict[str, float]) -> None:
            status = (f"reward {m.get('env/all/reward/mean', float('nan')):.3f}  "
                      f"accuracy {m.get('env/all/correct', float('nan')):.3f}  {m.get('tokens_per_s', 0):.0f} tok/s")
            progress.update(step + 1, status)

        result = loop(config, source, progress=on_step)

    summary = _summary(run_dir, result)
    table = Table(title=f"rlvr {config.recipe}: {config.base_model}, {config.steps} steps (held-out, greedy)")
    stages = [("Baseline", "baseline"), ("After warm-up", "after_warmup"), ("After", "after")]
    stages = [(title, key) for title, key in stages if key in summary]
    for column in ("Metric", *(title for title, _ in stages), "Improvement"):
        table.add_column(column, justify="left" if column == "Metric" else "right")
    for name, key in SUMMARY_ROWS:
        values = [summary[stage].get(key) for _, stage in stages]
        if all(v is None for v in values):
            continue
        before, after = values[0], values[-1]
        gain = _fmt(after - before, sign=True) if before is not None and after is not None else ""
        table.add_row(name, *(_fmt(v) for v in values), gain)
    console.print(table)
    console.print(f"run folder: {run_dir}   curves: {result['plot']}")
    return {**result, "summary": summary, "run_dir": str(run_dir)}


def _after_warmup(config: TrainConfig, source: Any, run_dir: Path, console: Any) -> TrainConfig:
    """The config the loop runs: with a warm-up, RL starts from its final state.

    A fresh run warms up first (unless it starts from a checkpoint of its own). A resumed run that has no RL
    checkpoint yet was stopped in the warm-up or before the loop's first checkpoint: the warm-up continues from its
    last checkpoint (or is already complete), and the loop starts again at step 0, its earlier rows dropped."""
    from rlvr.rl.checkpoints import WARMUP, last_checkpoint
    from rlvr.rl.rollout_log import RolloutLog
    from rlvr.rl.tracking import drop_rows_from

    if config.resume and last_checkpoint(run_dir) is not None:
        return config
    warmed = last_checkpoint(run_dir, WARMUP) if config.resume else None
    if not config.warmup.steps or (config.start_from_checkpoint and warmed is None):
        if config.resume:
            raise ConfigurationError(f"resume: {run_dir} has no checkpoint yet (checkpoints.jsonl); start it afresh")
        return config
    state_path = _warmup(config, source, run_dir, console, warmed)
    if config.resume:
        if (run_dir / "metrics.jsonl").exists():
            drop_rows_from(run_dir / "metrics.jsonl", 0)
        RolloutLog(run_dir).drop_from(0)
    return dataclasses.replace(config, resume=False, start_from_checkpoint=state_path)


def _warmup(config: TrainConfig, source: Any, run_dir: Path, console: Any, warmed: dict[str, Any] | None) -> str:
    """Supervised warm-up on the source's worked solutions, continued from ``warmed`` (its last checkpoint) when
    there is one; checkpointed every ``warmup.save_every`` steps and at the end. Returns the state RL starts from."""
    import rlvr
    from rlvr.rl.checkpoints import WARMUP, last_checkpoint, record_checkpoint
    from rlvr.rl.sft import encode_pair, supervised_steps
    from rlvr.rl.tracking import drop_rows_from

    steps, log = config.warmup.steps, run_dir / "warmup.jsonl"
    if warmed is not None and warmed["step"] >= steps:
        return warmed["state_path"]
    service = rlvr.ServiceClient(precision=base_precision(config.precision))
    if warmed is None:
        training_client = service.create_lora_training_client(base_model=config.base_model, rank=config.rank,
                                                              seed=config.seed)
        log.unlink(missing_ok=True)  # a warm-up starts the run: no earlier rows
        _base_baseline(config, source, run_dir, console, training_client)
    else:
        training_client = service.create_training_client_from_state_with_optimizer(warmed["state_path"])
        if log.exists():
            drop_rows_from(log, warmed["step"])
    tokenizer = training_client.get_tokenizer()
    problems = source.problems("train")
    examples = [encode_pair(tokenizer, source.render_ids(p, tokenizer), source.demonstration(p)) for p in problems]
    with StepProgress(console, "warm-up step", steps, start=warmed["step"] if warmed else 0) as progress:
        def on_step(step: int, metrics: dict[str, float]) -> None:
            append_jsonl(log, {"step": step, **metrics})
            progress.update(step + 1, f"loss/token {metrics['train/loss_per_token']:.3f}")
            if (step + 1) % max(config.warmup.save_every, 1) == 0 or step + 1 == steps:
                path = training_client.save_state(f"warmup-{step + 1:06d}").result().path
                record_checkpoint(run_dir, {"step": step + 1, "state_path": path}, WARMUP)

        losses = supervised_steps(training_client, examples, steps, config.warmup.batch_size,
                                  config.warmup.learning_rate, seed=config.seed, on_step=on_step,
                                  start=warmed["step"] if warmed else 0)
    console.print(f"warm-up: steps {warmed['step'] if warmed else 0}-{steps - 1}, loss/token {losses[0]:.3f} -> "
                  f"{losses[-1]:.3f}")
    return last_checkpoint(run_dir, WARMUP)["state_path"]  # the step-`steps` one, recorded by the last on_step


def _base_baseline(config: TrainConfig, source: Any, run_dir: Path, console: Any, training_client: Any) -> None:
    """The held-out evaluation of the base model, before a warm-up changes it (a fresh LoRA adds nothing), as the
    run's ``baseline`` in ``summary.json``; the loop's own first evaluation becomes ``after_warmup``."""
    from rlvr.rewards import RewardRunner
    from rlvr.rl.rollouts import evaluate_problems

    problems = source.problems(source.eval_split(), limit=config.eval_problems)
    if not problems:
        return
    with phase(console, f"evaluating the base model on {len(problems)} held-out problems"), \
            RewardRunner(source.reward(), timeout=config.reward_timeout) as runner:
        baseline = evaluate_problems(training_client.save_weights_and_get_sampling_client(),
                                     training_client.get_tokenizer(), source, problems, runner, config.max_tokens)
    write_atomic(run_dir / "summary.json", json.dumps({"baseline": baseline}, indent=2))
    console.print(f"base model: {_accuracy_line(baseline)}")


def _summary(run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``: ``baseline`` (held-out, before the run), ``after_warmup`` (runs with a warm-up: before RL)
    and ``after``. A resumed run keeps the evaluations its earlier part made."""
    from rlvr.rl.checkpoints import WARMUP, last_checkpoint

    previous = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    warmed = last_checkpoint(run_dir, WARMUP) is not None and "baseline" in previous
    summary = {"baseline": previous.get("baseline", {})}
    if warmed:
        summary["after_warmup"] = result.get("before") or previous.get("after_warmup", {})
    elif result.get("before"):
        summary["baseline"] = result["before"]
    summary["after"] = result["after"]
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def _accuracy_line(metrics: dict[str, float]) -> str:
    parts = [f"{name} {metrics[key]:.3f}" for name, key in SUMMARY_ROWS if key in metrics]
    return ", ".join(parts)


def _status(run_dir: Path, status: str, **extra: Any) -> None:
    record = {"status": status, "pid": os.getpid(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}
    write_atomic(run_dir / "status.json", json.dumps(record))


def _fmt(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if sign else f"{value:.3f}"
