"""Held-out accuracy per minute of training, rlvr against TRL: both systems train for the same budget of training
time on the same task, model, LoRA and settings as ``bench/rl_step.py`` matches them (its docstring lists what is
matched and what is not), and each one's adapter is evaluated at fixed times.

What a user feels is not seconds per step or accuracy after N steps but how good the model is after M minutes. Each
run keeps the adapter after every step with the step's end on its own training clock (the sum of its steps' times:
rlvr's loop ``time/total``, TRL's ``on_step_begin`` to ``on_step_end``; model loading, snapshots and evaluation are
outside both clocks) and stops once the clock passes the budget. The adapter "at minute m" is the last one whose
step ended by m. One evaluator (``rl_step.evaluate``: peft adapters on one model copy, greedy ``generate``, the same
reward) scores every snapshot on each seed's held-out problems.

Per seed the two systems run back to back (the order alternates with the seed, so that whatever else the machine
does falls on both); at each mark the paired difference rlvr - TRL is averaged over seeds with its standard error
and a 95% t interval. Printed: the table of marks; written with ``--json``: every run, snapshot time and accuracy,
and with ``--plot``: accuracy against minutes (each seed faint, the mean bold).

    python bench/accuracy_per_minute.py [--budget 120] [--marks 4] [--seeds 0,1,2,3,4] [--eval-problems 64]
                                        [--plot PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_average, machine, positive_int, progress_bar, write_json
from bench.rl_step import (
    Settings,
    emit,
    evaluate,
    lora_without_unembed,
    make_source,
    seed_list,
    spawn,
    trl_trainer,
)

MAX_STEPS = 400
"""Steps a run may take at most (the budget stops it first); the problems of that many steps are laid out."""
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (between entries: the next smaller df's, wider)."""


class BudgetSpent(Exception):
    """Raised from the rlvr loop's progress callback to stop the run once its training clock passes the budget."""


def run_rlvr(settings: Settings, out: Path, budget: float) -> list[dict[str, Any]]:
    """rlvr's loop until its clock passes ``budget``; a checkpoint every step (outside the clock), each step's
    adapter copied to ``out/snap-NNN.safetensors``. Returns [{step, seconds (clock at its end), path}]."""
    from rlvr.fileio import read_jsonl
    from rlvr.home import resolve
    from rlvr.rl import LoopConfig, train

    config = LoopConfig(
        base_model="smollm2-135m", rank=settings.rank, steps=MAX_STEPS, save_every=1,
        problems_per_step=settings.problems_per_step, group_size=settings.group_size, loss_fn="ppo",
        loss_fn_config={"clip_low_threshold": 1 - settings.clip, "clip_high_threshold": 1 + settings.clip},
        learning_rate=settings.learning_rate, max_tokens=settings.max_tokens, temperature=settings.temperature,
        eval_problems=4, seed=settings.seed, rollouts=False, out=str(out / "run"))
    clock: list[float] = []

    def progress(step: int, metrics: dict[str, float]) -> None:
        clock.append((clock[-1] if clock else 0.0) + metrics["time/total"])
        emit("step", step=step, seconds=metrics["time/total"], clock=clock[-1])
        if clock[-1] >= budget:
            raise BudgetSpent

    try:
        with lora_without_unembed():
            train(config, make_source(settings), progress=progress)
    except BudgetSpent:
        pass
    snapshots = []
    for entry in read_jsonl(out / "run" / "checkpoints.jsonl", bad_lines="skip"):
        step = entry["step"] - 1  # a checkpoint of step s is recorded as "continue from s + 1"
        if step < len(clock):
            path = out / f"snap-{step:03d}.safetensors"
            shutil.copy(resolve(entry["state_path"]) / "adapter_model.safetensors", path)
            snapshots.append({"step": step, "seconds": clock[step], "path": str(path)})
            states = resolve(entry["state_path"]).parents[1]  # this run's checkpoints under $RLVR_HOME
    if snapshots:
        shutil.rmtree(states, ignore_errors=True)
    return snapshots


def run_trl(settings: Settings, out: Path, budget: float) -> list[dict[str, Any]]:
    """TRL's GRPOTrainer until its clock passes ``budget``; the LoRA weights after every step kept in memory
    (outside the clock) and written to ``out/snap-NNN.safetensors`` at the end."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import TrainerCallback

    kept: list[tuple[int, float, dict[str, Any]]] = []

    class Clock(TrainerCallback):
        total = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            seconds = time.perf_counter() - self.started
            self.total += seconds
            weights = get_peft_model_state_dict(model, save_embedding_layers=False)
            kept.append((state.global_step - 1, self.total, {k: v.detach().clone() for k, v in weights.items()}))
            emit("step", step=state.global_step - 1, seconds=seconds, clock=self.total)
            if self.total >= budget:
                control.should_training_stop = True

    trl_trainer(settings, out, [Clock()]).train()
    snapshots = []
    for step, seconds, weights in kept:
        path = out / f"snap-{step:03d}.safetensors"
        save_file({k: v.contiguous() for k, v in weights.items()}, path)
        snapshots.append({"step": step, "seconds": seconds, "path": str(path)})
    return snapshots


def worker(system: str, settings: Settings, out: Path, budget: float) -> None:
    snapshots = (run_rlvr if system == "rlvr" else run_trl)(settings, out, budget)
    emit("done", snapshots=snapshots)


def at_mark(snapshots: list[dict[str, Any]], seconds: float) -> dict[str, Any] | None:
    """The last snapshot whose step ended by ``seconds`` on its run's clock (None: no step had ended)."""
    ended = [s for s in snapshots if s["seconds"] <= seconds]
    return ended[-1] if ended else None


def t_quantile(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (conservative between table entries)."""
    if df >= 30:
        return 1.96 if df > 120 else T_975[30]
    return T_975[max(k for k in T_975 if k <= df)]


def paired(differences: list[float]) -> dict[str, float]:
    """Mean, standard error and 95% t interval of paired differences."""
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return {"mean": mean, "se": math.nan, "low": math.nan, "high": math.nan, "n": len(differences)}
    se = statistics.stdev(differences) / math.sqrt(len(differences))
    half = t_quantile(len(differences) - 1) * se
    return {"mean": mean, "se": se, "low": mean - half, "high": mean + half, "n": len(differences)}


def plot(path: Path, marks: list[float], curves: dict[str, dict[int, list[float]]], base: dict[int, float]) -> None:
    """Accuracy against minutes from the base model's at 0: each seed faint, the mean over seeds bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [0.0] + [m / 60 for m in marks]
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for system, colour in (("rlvr", "tab:blue"), ("trl", "tab:orange")):
        by_seed = {seed: [base[seed], *accuracies] for seed, accuracies in curves[system].items()}
        for accuracies in by_seed.values():
            axes.plot(minutes, accuracies, color=colour, alpha=0.25, linewidth=1)
        mean = [statistics.fmean(a[i] for a in by_seed.values()) for i in range(len(minutes))]
        axes.plot(minutes, mean, color=colour, linewidth=2.5, marker="o",
                  label=f"{'rlvr' if system == 'rlvr' else 'TRL GRPOTrainer'} (mean of {len(by_seed)} seeds)")
    axes.set_xlabel("minutes of training (each system's own step clock)")
    axes.set_ylabel("held-out greedy accuracy")
    axes.set_title("SmolLM2-135M, one-digit arithmetic, LoRA r16, 2 cores")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--budget", type=positive_int, default=120, help="seconds of training per run (default 120)")
    parser.add_argument("--marks", type=positive_int, default=4, help="evaluation times, evenly up to the budget")
    parser.add_argument("--seeds", type=seed_list, default=[0, 1, 2, 3, 4], metavar="S[,S...]",
                        help="one rlvr and one TRL run per seed (default 0,1,2,3,4)")
    parser.add_argument("--eval-problems", type=positive_int, default=64, help="held-out problems (default 64)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="new tokens per completion (default 64)")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' logs and snapshots in DIR")
    parser.add_argument("--plot", metavar="PATH", help="write the curves (PNG) here")
    parser.add_argument("--json", metavar="PATH", help="write the figures to this JSON file")
    parser.add_argument("--worker", choices=["rlvr", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        raw = json.loads(args.settings)
        worker(args.worker, Settings(**{**raw, "levels": tuple(raw["levels"])}), Path(args.out), args.budget)
        return 0
    try:
        import trl  # noqa: F401
    except ImportError:
        print("error: TRL is not installed; install the benchmark extra: pip install -e '.[bench]'", file=sys.stderr)
        return 2

    settings = Settings(steps=MAX_STEPS, eval_problems=args.eval_problems, max_tokens=args.max_tokens)
    marks = [args.budget * (i + 1) / args.marks for i in range(args.marks)]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rlvr-bench-per-minute-"))
    load = {"before": load_average()}
    print(f"{args.budget} s of training per run, marks at {', '.join(f'{m:.0f}' for m in marks)} s; "
          f"{settings.problems_per_step} prompts x {settings.group_size} completions per step, {settings.max_tokens} "
          f"new tokens, LoRA r{settings.rank}, lr {settings.learning_rate}; seeds {args.seeds}; load average "
          f"{load['before']}", flush=True)
    runs: list[dict[str, Any]] = []
    try:
        with progress_bar() as bar:
            task = bar.add_task("accuracy per minute", total=len(args.seeds) * 2 * args.budget, info="")
            for index, seed in enumerate(args.seeds):
                for system in (("rlvr", "trl") if index % 2 == 0 else ("trl", "rlvr")):
                    name, done = f"{system}-s{seed}", [0.0]

                    def on_step(message: dict, name: str = name, done: list[float] = done) -> None:
                        advance = min(message["clock"], args.budget) - done[0]
                        done[0] += advance
                        bar.update(task, advance=advance, info=f"{name} step {message['step']} "
                                   f"({message['seconds']:.1f} s)")

                    snapshots = spawn(system, replace(settings, seed=seed), root / name, False, on_step,
                                      script=Path(__file__), extra=["--budget", str(args.budget)])["snapshots"]
                    bar.update(task, advance=args.budget - done[0])
                    runs.append({"system": system, "seed": seed, "name": name, "snapshots": snapshots})
        print("evaluating the snapshots at each mark (greedy, one evaluator)...", flush=True)
        curves: dict[str, dict[int, list[float]]] = {"rlvr": {}, "trl": {}}
        base: dict[int, float] = {}
        for seed in args.seeds:
            chosen = {(run["system"], i): at_mark(run["snapshots"], mark) for run in runs if run["seed"] == seed
                      for i, mark in enumerate(marks)}
            paths = {snap["path"] for snap in chosen.values() if snap is not None}
            accuracy = evaluate(replace(settings, seed=seed), {path: Path(path) for path in sorted(paths)})
            base[seed] = accuracy["base"]
            for system in ("rlvr", "trl"):
                curves[system][seed] = [accuracy[snap["path"]] if (snap := chosen[system, i]) else base[seed]
                                        for i in range(len(marks))]
        load["after"] = load_average()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    steps = {run["name"]: len(run["snapshots"]) for run in runs}
    rows = []
    print("\n| minute | rlvr accuracy | TRL accuracy | rlvr - TRL (mean ± se) | 95% interval |\n|---|---|---|---|---|")
    for i, mark in enumerate(marks):
        differences = [curves["rlvr"][s][i] - curves["trl"][s][i] for s in args.seeds]
        stats = paired(differences)
        rlvr_mean = statistics.fmean(curves["rlvr"][s][i] for s in args.seeds)
        trl_mean = statistics.fmean(curves["trl"][s][i] for s in args.seeds)
        rows.append({"seconds": mark, "rlvr": rlvr_mean, "trl": trl_mean, "difference": stats})
        print(f"| {mark / 60:.1f} | {rlvr_mean:.3f} | {trl_mean:.3f} | {stats['mean']:+.3f} ± {stats['se']:.3f} | "
              f"[{stats['low']:+.3f}, {stats['high']:+.3f}] |")
    print(f"\nbase accuracy by seed: {base}; steps taken in {args.budget} s: {steps}")
    print(f"load average before {load['before']}, after {load['after']}")
    if args.plot:
        plot(Path(args.plot), marks, curves, base)
        print(f"curves: {args.plot}")
    if args.json:
        write_json(args.json, {"benchmark": "accuracy_per_minute", "settings": asdict(settings),
                               "budget_s": args.budget, "marks_s": marks, "seeds": args.seeds, "machine": machine(),
                               "load_average": load, "runs": runs, "base": base, "curves": curves, "table": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
