"""RL on procedural arithmetic with the full loop: SmolLM2-135M, LoRA, 30 steps on a 2-core CPU.

    .venv/bin/python examples/rl_arithmetic.py [--steps 30] [--out runs/arith]

Prints held-out greedy accuracy before and after; metrics.jsonl and checkpoints.jsonl land in the run folder.
"""

from __future__ import annotations

import argparse
import time

from rlvr.rewards import resolve_reward
from rlvr.rl import LoopConfig, train
from rlvr.tasks.arithmetic import ArithmeticSource


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="runs/arith")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    # One-digit addition and subtraction; the model is asked for only the number, and math_correct credits a reply
    # that is just that (answer_form="whole").
    source = ArithmeticSource(levels=(1,), num_train=120, num_test=64, instruction="Answer with only the number.",
                              reward=resolve_reward("math_correct", answer_form="whole"))
    config = LoopConfig(base_model="smollm2-135m", steps=args.steps, problems_per_step=4, group_size=8,
                        max_tokens=16, learning_rate=2e-4, eval_problems=64, save_every=10, out=args.out,
                        resume=args.resume, seed=0)
    start = time.time()
    result = train(config, source, progress=lambda step, m: print(
        f"step {step:3d}  reward {m['env/all/reward/mean']:.3f}  kl_v1 {m.get('optim/kl_sample_train_v1', 0):+.2e}  "
        f"{m['time/total']:.1f}s", flush=True))
    before = result.get("before", {}).get("test/correct")
    after = result["after"]["test/correct"]
    print(f"held-out accuracy: before {before}, after {after:.3f}; wall {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
