"""What the Ray backend costs and buys on one machine: reward throughput with 1 and 2 Ray reward workers, and the
overhead of RL loop steps run through Ray actors instead of in-process.

Rewards: ``--n`` MBPP-style programs (a function in a fenced block and three asserts; about one in five has a wrong
expected value) scored with the ``code_tests`` reward, which runs each program in rlvr's sandbox: in-process
(``RewardRunner``), then on 1 and on 2 Ray reward actors (``RayRewardRunner``; each actor starts its own sandbox,
whose fork servers default to one per CPU). Each runner is warmed up first (sandbox start, first-fault costs), and
all three must agree on every score.

Loop: ``--steps`` steps of ``rlvr.rl.loop.train`` on the ``tiny`` model and procedural arithmetic, in-process and
with ``DistributedConfig(backend="ray")`` (1 sampler, 2 reward workers); the step time is the mean ``time/total``
after the first step, and the Ray start-up (actors importing torch) is reported apart. torch runs on ``--threads``
threads in this process (default 1, what each model actor gets on a 2-core machine), so both sides compute alike;
with more threads than free cores (other work running) torch slows down several-fold and the in-process figure
with it.

    python bench/scale.py                    # 200 programs, 4 loop steps
    python bench/scale.py --json out.json    # also write the figures
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from rlvr.rewards import RewardItem, RewardRunner, resolve_reward
from rlvr.rewards.builtin import LengthPenalty

if TYPE_CHECKING:
    from rlvr.distributed.rewards import RayRewardRunner

_FUNCTIONS = [
    ("def {name}(a, b):\n    return a * {k} + b", "{name}({x}, {y})", lambda k, x, y: x * k + y),
    ("def {name}(n):\n    return sum(i * i for i in range(n)) + {k}", "{name}({x})",
     lambda k, x, y: sum(i * i for i in range(x)) + k),
    ("def {name}(a, b):\n    return max(a, b) - min(a, b) + {k}", "{name}({x}, {y})", lambda k, x, y: abs(x - y) + k),
    ("import math\n\ndef {name}(n):\n    return math.gcd(n, {k}) + len(str(n))", "{name}({x})",
     lambda k, x, y: __import__("math").gcd(x, k) + len(str(x))),
]


def make_items(n: int, seed: int = 0) -> list[RewardItem]:
    """``n`` responses, each a program in a fenced block, with three asserts in ``meta["tests"]``."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        code, call, value = _FUNCTIONS[i % len(_FUNCTIONS)]
        name, k = f"func_{i}", rng.randint(1, 9)
        tests = []
        for _ in range(3):
            x, y = rng.randint(0, 40), rng.randint(0, 40)
            tests.append(f"assert {call.format(name=name, x=x, y=y)} == {value(k, x, y)}")
        if rng.random() < 0.2:
            tests[-1] = tests[-1].rsplit("==", 1)[0] + "== -12345"
        response = f"Here it is:\n```python\n{code.format(name=name, k=k)}\n```"
        items.append(RewardItem(f"Write {name}.", response, {"tests": tests}))
    return items


def time_rewards(runner: RewardRunner | RayRewardRunner, items: list[RewardItem]) -> tuple[float, list[float | None]]:
    """(programs per second, scores) of scoring ``items`` once ``runner`` is warm."""
    runner.score(items[:20])  # warm-up: sandbox start, first-fault costs; not measured
    started = time.perf_counter()
    scores = runner.score(items)
    elapsed = time.perf_counter() - started
    if scores.failures:
        raise SystemExit(f"error: {len(scores.failures)} reward failures, e.g. {scores.failures[0].message[:300]}")
    return len(items) / elapsed, scores.scores


def time_loop(steps: int, distributed: bool) -> tuple[float, float, list[dict]]:
    """(mean step seconds after the first, seconds from train() to the first step's end, per-step metrics)."""
    from rlvr.rl import DistributedConfig, LoopConfig, train
    from rlvr.tasks import ArithmeticSource

    reward = resolve_reward("combine", rewards={"math_correct": 1.0,
                                                LengthPenalty(target_length=0, penalty_scale=0.05, unit="chars"): 1.0})
    source = ArithmeticSource(levels=(1, 2), num_train=64, num_test=8, reward=reward,
                              instruction="Answer with only the number.")
    with tempfile.TemporaryDirectory() as out:
        config = LoopConfig(base_model="tiny", rank=8, steps=steps, problems_per_step=4, group_size=8, max_tokens=16,
                            learning_rate=2e-2, eval_problems=8, out=out, seed=0,
                            distributed=DistributedConfig(backend="ray" if distributed else "local",
                                                          num_samplers=1, num_reward_workers=2))
        started = time.perf_counter()
        first: list[float] = []
        train(config, source, progress=lambda step, m: first.append(time.perf_counter() - started) if step == 0
              else None)
        metrics = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    later = [m["time/total"] for m in metrics[1:]] or [metrics[0]["time/total"]]
    return sum(later) / len(later), first[0], metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="programs to score (default 200)")
    parser.add_argument("--steps", type=int, default=4, help="RL loop steps per backend (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the in-process run (default 1)")
    parser.add_argument("--json", metavar="PATH", help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    try:
        import ray
    except ImportError:
        print("error: bench/scale.py needs Ray: pip install 'rlvr[ray]'", file=sys.stderr)
        return 1
    from rlvr.distributed.rewards import RayRewardRunner

    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    busy = " (other work is running: figures will be noisy)" if load > 0.5 else ""
    print(f"{cpus} CPUs, torch threads {args.threads}, load average {load:.2f}{busy}", flush=True)
    items = make_items(args.n)
    figures: dict[str, float] = {}

    with RewardRunner("code_tests", timeout=10.0) as runner:
        rate, reference = time_rewards(runner, items)
    figures["reward_programs_per_s_inprocess"] = rate
    print(f"rewards in-process: {rate:.0f} programs/s ({sum(s == 1.0 for s in reference)}/{len(items)} pass)",
          flush=True)

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    for workers in (1, 2):
        started = time.perf_counter()
        with RayRewardRunner("code_tests", timeout=10.0, num_workers=workers) as runner:
            startup = time.perf_counter() - started
            rate, scores = time_rewards(runner, items)
        if scores != reference:
            print(f"error: {workers} Ray reward workers scored differently from in-process", file=sys.stderr)
            return 1
        figures[f"reward_programs_per_s_ray_{workers}"] = rate
        print(f"rewards on {workers} Ray reward worker(s): {rate:.0f} programs/s (actors up in {startup:.1f} s)",
              flush=True)
    figures["reward_ray_2_over_1"] = figures["reward_programs_per_s_ray_2"] / figures["reward_programs_per_s_ray_1"]
    figures["reward_ray_1_over_inprocess"] = (figures["reward_programs_per_s_ray_1"]
                                              / figures["reward_programs_per_s_inprocess"])

    local_step, local_first, local_metrics = time_loop(args.steps, distributed=False)
    print(f"loop in-process: {local_step:.2f} s/step (first step done {local_first:.1f} s after train())", flush=True)
    ray_step, ray_first, ray_metrics = time_loop(args.steps, distributed=True)
    print(f"loop on Ray: {ray_step:.2f} s/step (first step done {ray_first:.1f} s after train(), actors included)",
          flush=True)
    same = [a["env/all/reward/mean"] for a in local_metrics] == [b["env/all/reward/mean"] for b in ray_metrics]
    figures.update(loop_step_s_inprocess=local_step, loop_step_s_ray=ray_step,
                   loop_ray_over_inprocess=ray_step / local_step, loop_first_step_s_inprocess=local_first,
                   loop_first_step_s_ray=ray_first)
    ray.shutdown()

    print(f"\nsummary ({cpus} CPUs)")
    print(f"  rewards: 2 vs 1 Ray workers          {figures['reward_ray_2_over_1']:.2f}x programs/s")
    print(f"  rewards: 1 Ray worker vs in-process  {figures['reward_ray_1_over_inprocess']:.2f}x programs/s")
    print(f"  loop:    Ray vs in-process           {figures['loop_ray_over_inprocess']:.2f}x s/step "
          f"({ray_step - local_step:+.2f} s/step; same rewards every step: {same})")
    print(f"  (one reward worker's sandbox already runs {cpus} programs at once, one per CPU: on one machine a\n"
          "   second worker adds overlap, not cores; on a cluster each worker brings its node's cores)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({**figures, "cpus": cpus, "threads": args.threads, "load_average": load, "programs": len(items),
                       "steps": args.steps}, handle, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
