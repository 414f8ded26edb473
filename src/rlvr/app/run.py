"""A whole RL run as ``rlvr train`` does it: config -> problem source -> optional warm-up -> loop -> result table.

    import rlvr
    result = rlvr.train({"recipe": "arithmetic", "steps": 10})       # or a TrainConfig, or a YAML path
    rlvr.train("my.yaml", overrides=["steps=40"])
    rlvr.resume("runs/arithmetic-20261122-101500", overrides=["steps=40"])

Every setting that can be checked without the model is checked before it loads (``checks.py``). A run folder holds
``config.yaml`` (resolved), ``status.json`` (running / finished / failed with the error / interrupted with the step
its checkpoint reached), ``metrics.jsonl``, ``checkpoints.jsonl`` and ``checkpoints/`` (the
states, pruned to ``keep_checkpoints``), ``summary.json`` (held-out evaluations of the base model, after the warm-up if
there is one, and after RL), ``curves.png`` and ``rollouts/``. The console shows a progress bar (step, reward,
accuracy, the share of answers cut at ``max_tokens``, tokens/s, ETA; a warning when that share passes a quarter) and
the evaluations' progress, and ends with the table ``Metric | Baseline | [After warm-up |] After | Improvement``.

SIGTERM or Ctrl-C stop a run cleanly (``stop.py``): the step in flight finishes and is checkpointed (evaluations are
abandoned at once), the run is marked ``interrupted`` and the command that resumes it is printed, as the user ran rlvr
(``commands.py``); RunInterrupted is raised (``rlvr`` exits with 128 + the signal). A second Ctrl-C stops at once.

What it is not: the loop itself (``rlvr.rl.loop``), evaluation of a saved model (``rlvr.app.evaluation``), or
argument parsing (``rlvr.cli``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from rlvr.app.checks import check_run
from rlvr.app.progress import ClippedWatch, StepProgress, evaluation, make_console
from rlvr.app.settings import RUN_FOLDER, TrainConfig, as_config, resolve_config
from rlvr.app.sft import sft
from rlvr.app.status import running, stopped_at
from rlvr.errors import RunInterrupted
from rlvr.fileio import append_jsonl
from rlvr.rl.run_record import Checkpoint, RunRecord
from rlvr.rl.stop import StopRequest

__all__ = ["resume", "train", "train_checked", "with_run_folder"]

def train(config: TrainConfig | dict[str, Any] | str | Path | None = None, overrides: list[str] | None = None,
          console: Any = None) -> dict[str, Any]:
    """Run RL as ``rlvr train``: returns ``{"before", "after", "summary", "run_dir", ...}``."""
    config = with_run_folder(as_config(config, overrides))
    return train_checked(config, check_run(config), console)  # checked without the model, before it loads


def train_checked(config: TrainConfig, source: Any, console: Any = None) -> dict[str, Any]:
    """:func:`train` on a ``config`` that ``checks.check_run`` passed, with the problem source it returned (``rlvr
    train`` checks before the loop's imports, then comes here, so nothing is checked twice)."""
    from rlvr.rl.phases import run_numerics

    record = RunRecord(config.out)
    record.run_dir.mkdir(parents=True, exist_ok=True)
    numerics = run_numerics(config, record)  # resolved once here; a resume that differs is refused before any work
    config = dataclasses.replace(config, precision=numerics.precision)
    if not config.resume or config.accept_numerics:  # `rlvr resume` needs it from the start: a warm-up may be
        # stopped before the loop begins; an accepted change of numerics is recorded at once
        record.write_config(dataclasses.replace(config, resume=False, accept_numerics=False), "rl",
                            numerics=numerics.as_record())
    console = console or make_console()
    with running(record.run_dir, console, lambda: stopped_at(record, config.steps, config.warmup.steps)) as stop:
        return _train(config, source, record, console, stop)


def with_run_folder(config: TrainConfig) -> TrainConfig:
    """``config`` with its run folder named: the default one is new for each run, named by recipe and time."""
    if not config.out or config.out == TrainConfig.out:
        return dataclasses.replace(config, out=RUN_FOLDER.format(recipe=config.recipe,
                                                                 time=time.strftime("%Y%m%d-%H%M%S")))
    return config


SUMMARY_ROWS = (("pass rate", "test/correct"), ("accuracy", "test/reward/correct/mean"),
                ("mean reward", "test/reward/mean"))
"""The summary's rows: full reward; the ``correct`` part of a format-and-correct reward (the final answer right,
boxed or not); the mean reward."""


def resume(run_dir: str | Path, overrides: list[str] | None = None, console: Any = None) -> dict[str, Any] | str:
    """Continue the run in ``run_dir`` from its last checkpoint (``steps=N`` in overrides trains further): an RL run
    as :func:`train` does, an ``rlvr sft`` run as :func:`sft` does (returning its final state path)."""
    record = RunRecord(run_dir)
    values = record.settings()
    if record.kind == "sft":
        from rlvr.app.settings import build_config, merge_layers, parse_overrides
        from rlvr.app.sft import SftConfig

        merged = merge_layers(values, parse_overrides([*(overrides or []), "resume=true", f"out={record.run_dir}"]))
        return sft(build_config(merged, SftConfig), console=console or make_console())
    config = resolve_config(base=values, overrides=[*(overrides or []), "resume=true", f"out={record.run_dir}"])
    return train(config, console=console)


def _train(config: TrainConfig, source: Any, record: RunRecord, console: Any, stop: StopRequest) -> dict[str, Any]:
    from rich.markup import escape
    from rich.table import Table

    from rlvr.rl.loop import train as loop

    run_dir = record.run_dir
    console.print(f"[bold]rlvr train[/bold] {escape(f'recipe={config.recipe} model={config.base_model} steps=')}"
                  f"{config.steps} -> {escape(str(run_dir))}", highlight=False, soft_wrap=True)
    config = _after_warmup(config, source, record, console, stop)

    resumed = record.last("rl") if config.resume else None  # (_after_warmup keeps resume only where there is one)
    start = resumed.step if resumed is not None else 0
    watch = ClippedWatch(console, config.max_tokens)
    with StepProgress(console, "step", config.steps, start=start) as progress:

        def on_step(step: int, m: dict[str, float]) -> None:
            clipped = f"  clipped {m['env/all/clipped']:.2f}" if "env/all/clipped" in m else ""
            status = (f"reward {m.get('env/all/reward/mean', float('nan')):.3f}  "
                      f"accuracy {m.get('env/all/correct', float('nan')):.3f}{clipped}  "
                      f"{m.get('tokens_per_s', 0):.0f} tok/s")
            progress.update(step + 1, status)
            watch.check("train", m.get("env/all/clipped"), f"the training answers of step {step}")
            watch.check("held-out", m.get("test/clipped"), f"the held-out answers after step {step + 1}")

        result = loop(config, source, progress=on_step, stop=stop, show_evaluation=progress.evaluation)
    for when, what in (("before", "the baseline's held-out answers"),
                       ("after", "the trained model's held-out answers")):
        watch.check("held-out", result.get(when, {}).get("test/clipped"), what)

    summary = _summary(record, result)
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
    console.print(f"run folder: {run_dir}   curves: {result['plot']}", highlight=False, markup=False, soft_wrap=True)
    return {**result, "summary": summary, "run_dir": str(run_dir)}


def _after_warmup(config: TrainConfig, source: Any, record: RunRecord, console: Any, stop: StopRequest
                  ) -> TrainConfig:
    """The config the loop runs: with a warm-up, RL starts from its final state.

    A fresh run warms up first (unless it starts from a checkpoint of its own). A resumed run that has no RL
    checkpoint yet was stopped in the warm-up or before the loop's first checkpoint: the warm-up continues from its
    last checkpoint (or is already complete), and the loop starts again at step 0, its earlier rows dropped. Without
    a warm-up such a run starts again from the beginning."""
    run_dir = record.run_dir
    if config.resume and record.last("rl") is not None:
        return config
    warmed = record.last("warmup") if config.resume else None
    if not config.warmup.steps or (config.start_from_checkpoint and warmed is None):
        if config.resume:
            console.print(f"{run_dir} was stopped before its first checkpoint: it starts again from step 0",
                          highlight=False, markup=False)
            _drop_loop_rows(run_dir)
            return dataclasses.replace(config, resume=False)
        return config
    state_path = _warmup(config, source, record, console, warmed, stop)
    if config.resume:
        _drop_loop_rows(run_dir)
    return dataclasses.replace(config, resume=False, start_from_checkpoint=state_path)


def _drop_loop_rows(run_dir: Path) -> None:
    """The loop starts again at step 0: its rows and rollout pages from before are dropped."""
    from rlvr.rl.rollout_log import RolloutLog
    from rlvr.rl.tracking import drop_rows_from

    if (run_dir / "metrics.jsonl").exists():
        drop_rows_from(run_dir / "metrics.jsonl", 0)
    RolloutLog(run_dir).drop_from(0)


def _warmup(config: TrainConfig, source: Any, record: RunRecord, console: Any, warmed: Checkpoint | None,
            stop: StopRequest) -> str:
    """Supervised warm-up on the source's worked solutions, continued from ``warmed`` (its last checkpoint) when
    there is one; checkpointed every ``warmup.save_every`` steps, at the end and where a stop finds it (pruned as
    ``keep_checkpoints`` says). Returns the state RL starts from."""
    from rlvr.app.sft import encode_pair, supervised_steps
    from rlvr.client import ServiceClient
    from rlvr.rl.tracking import drop_rows_from

    steps, log = config.warmup.steps, record.run_dir / "warmup.jsonl"
    if warmed is not None and warmed.step >= steps:
        return warmed.state_path
    service = ServiceClient(numerics=dataclasses.replace(config.requested_numerics(), precision=config.precision))
    with stop.abandonable():  # loading the model: nothing to keep yet
        training_client = record.open_client(service, warmed, base_model=config.base_model, rank=config.rank,
                                             seed=config.seed)
    start = warmed.step if warmed is not None else 0
    if warmed is None:
        log.unlink(missing_ok=True)  # a warm-up starts the run: no earlier rows
        with stop.abandonable():
            _base_baseline(config, source, record, console, training_client)
    elif log.exists():
        drop_rows_from(log, start)
    tokenizer = training_client.get_tokenizer()
    problems = source.problems("train")
    examples = [encode_pair(tokenizer, source.render_ids(p, tokenizer), source.demonstration(p)) for p in problems]
    with StepProgress(console, "warm-up step", steps, start=start) as progress:
        def on_step(step: int, metrics: dict[str, float]) -> None:
            append_jsonl(log, {"step": step, **metrics})
            progress.update(step + 1, f"loss/token {metrics['train/loss_per_token']:.3f}")
            final = step + 1 == steps
            if (step + 1) % max(config.warmup.save_every, 1) == 0 or final or stop.requested:
                record.save(training_client, "warmup", step + 1, final=final, keep=config.keep_checkpoints)
            if stop.requested and not final:  # a stop at the last step goes on to RL, which stops at once
                raise RunInterrupted(stop.signum, step + 1)  # type: ignore[arg-type]

        losses = supervised_steps(training_client, examples, steps, config.warmup.batch_size,
                                  config.warmup.learning_rate, seed=config.seed, on_step=on_step,
                                  start=start)
    console.print(f"warm-up: steps {start}-{steps - 1}, loss/token {losses[0]:.3f} -> {losses[-1]:.3f}")
    warmed = record.last("warmup")
    assert warmed is not None and warmed.step == steps, "the warm-up's last step records its final checkpoint"
    return warmed.state_path


def _base_baseline(config: TrainConfig, source: Any, record: RunRecord, console: Any, training_client: Any) -> None:
    """The held-out evaluation of the base model, before a warm-up changes it (a fresh LoRA adds nothing), as the
    run's ``baseline`` in ``summary.json``; the loop's own first evaluation becomes ``after_warmup``."""
    from rlvr.rewards import RewardRunner
    from rlvr.rl.problems import evaluate_problems

    problems = source.problems(source.eval_split(), limit=config.eval_problems)
    if not problems:
        return
    with evaluation(console, "evaluating the base model", len(problems)) as answered, \
            RewardRunner(source.reward(), timeout=config.reward_timeout) as runner:
        baseline = evaluate_problems(training_client.save_weights_and_get_sampling_client(),
                                     training_client.get_tokenizer(), source, problems, runner, config.max_tokens,
                                     answered)
    record.write_summary({"baseline": baseline})
    console.print(f"base model: {_accuracy_line(baseline)}")
    ClippedWatch(console, config.max_tokens).check("held-out", baseline.get("test/clipped"),
                                                   "the base model's held-out answers")


def _summary(record: RunRecord, result: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``: ``baseline`` (held-out, before the run), ``after_warmup`` (runs with a warm-up: before RL)
    and ``after``. A resumed run keeps the evaluations its earlier part made."""
    previous = record.summary()
    warmed = record.last("warmup") is not None and "baseline" in previous
    summary = {"baseline": previous.get("baseline", {})}
    if warmed:
        summary["after_warmup"] = result.get("before") or previous.get("after_warmup", {})
    elif result.get("before"):
        summary["baseline"] = result["before"]
    summary["after"] = result.get("after", {})  # none: the source holds no held-out problems
    record.write_summary(summary)
    return summary


def _accuracy_line(metrics: dict[str, float]) -> str:
    parts = [f"{name} {metrics[key]:.3f}" for name, key in SUMMARY_ROWS if key in metrics]
    return ", ".join(parts)




def _fmt(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if sign else f"{value:.3f}"
