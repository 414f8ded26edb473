"""Two rlvr processes on one machine: each sharing the cores (the default) against each keeping torch's thread count
(``RLVR_THREADS``, which is what a torch program does), with one process alone as the reference.

    python bench/two_processes.py                  # SmolLM2-135M, LoRA 32: 8 samples x 48 tokens, 8 x 330-token step
    python bench/two_processes.py --model tiny --iterations 3 --json out.json

Each worker is a fresh process that loads the model, then repeats one sampling call and one training step
(forward_backward + optim_step), timing each; the first iteration is a warm-up and is dropped. The two workers of a
pair start together. The ratio is "how many times faster sharing is": fixed seconds over shared seconds, for each
kind of job. ``bench/results/two_processes-<date>.json`` holds every timing.

Not here: the rule itself (``rlvr/engine/cores.py``) or its tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, machine, positive_int, today, write_json

PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
          "clips did Natalia sell altogether?")
TEXT = "Natalia sold 48 clips in April and 24 in May, 72 in all. " * 6


def worker(model: str, iterations: int) -> dict[str, list[float]]:
    """The timed loop, in this process: seconds per sampling call and per training step."""
    import rlvr
    from rlvr import types

    training = rlvr.ServiceClient().create_lora_training_client(base_model=model, rank=32, seed=0)
    tokenizer = training.get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.encode(PROMPT))
    ids = tokenizer.encode(TEXT)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
    times: dict[str, list[float]] = {"sample_s": [], "train_s": []}
    for i in range(iterations + 1):
        started = time.perf_counter()
        sampler = training.save_weights_and_get_sampling_client()
        sampler.sample(prompt, 8, types.SamplingParams(max_tokens=48, temperature=0.8, seed=i)).result()
        sampled = time.perf_counter()
        training.forward_backward([datum] * 8, loss_fn="cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-5)).result()
        if i:  # the first is a warm-up
            times["sample_s"].append(sampled - started)
            times["train_s"].append(time.perf_counter() - sampled)
    return times


def run(count: int, env: dict[str, str], model: str, iterations: int) -> list[dict[str, list[float]]]:
    """``count`` workers started together; each one's timings."""
    command = [sys.executable, __file__, "--worker", "--model", model, "--iterations", str(iterations)]
    workers = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[1]) for _ in range(count)]
    outputs = [w.communicate()[0] for w in workers]
    if any(w.returncode for w in workers):
        raise SystemExit(f"a worker failed (exit codes {[w.returncode for w in workers]})")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def median(runs: list[dict[str, list[float]]], key: str) -> float:
    return statistics.median(t for r in runs for t in r[key])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--iterations", type=positive_int, default=4)
    parser.add_argument("--json", help="where to write the results (default: bench/results/two_processes-<date>.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.model, args.iterations)), flush=True)
        return 0

    import torch

    env = {k: v for k, v in os.environ.items() if k != "RLVR_THREADS"}
    fixed = {**env, "RLVR_THREADS": str(torch.get_num_threads())}
    cases = {}
    for name, count, case_env in (("alone", 1, env), ("two, fixed threads", 2, fixed), ("two, sharing", 2, env)):
        print(f"{name} ...", flush=True)
        cases[name] = run(count, case_env, args.model, args.iterations)
    print(f"\n{args.model}, {torch.get_num_threads()} torch threads, median seconds per job of each process\n")
    print("| job | alone | two, fixed threads | two, sharing | sharing faster by |\n|---|---|---|---|---|")
    table = {}
    for key, label in (("sample_s", "sample 8 x 48 tokens"), ("train_s", "train step, 8 x 330 tokens")):
        row = {name: median(runs, key) for name, runs in cases.items()}
        ratio = row["two, fixed threads"] / row["two, sharing"]
        table[key] = {**row, "ratio": ratio}
        print(f"| {label} | {row['alone']:.2f} | {row['two, fixed threads']:.2f} | {row['two, sharing']:.2f} | "
              f"{ratio:.1f}x |")
    out = Path(args.json) if args.json else RESULTS / f"two_processes-{today()}.json"
    write_json(out, {"machine": machine(), "model": args.model, "iterations": args.iterations,
                     "threads": torch.get_num_threads(), "cases": cases, "table": table})
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
