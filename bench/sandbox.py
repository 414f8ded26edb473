"""Throughput of rlvr's sandbox against a fresh interpreter per program.

Generates MBPP-style programs (a function and three asserts; about one in five deliberately wrong), runs
them through ``rlvr.sandbox.Sandbox`` and through the baseline a user would otherwise write --
``subprocess.run([sys.executable, "-c", program], timeout=...)`` -- with the same number of parallel
workers, checks both agree on which programs pass, and prints programs per second for each and the ratio.

    python bench/sandbox.py                    # 500 programs
    python bench/sandbox.py --json out.json    # also write the rates, the ratio, programs and workers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from rlvr.sandbox import Sandbox, SandboxJob

_TEMPLATES = [
    ("def {name}(a, b):\n    return a * {k} + b\n", "assert {name}({x}, {y}) == {z}", lambda k, x, y: x * k + y),
    ("def {name}(n):\n    return sum(i * i for i in range(n)) + {k}\n", "assert {name}({x}) == {z}",
     lambda k, x, y: sum(i * i for i in range(x)) + k),
    ("def {name}(s):\n    return s[::-1] * {k}\n", "assert {name}({xs!r}) == {zs!r}", None),
    ("import math\n\ndef {name}(n):\n    return math.gcd(n, {k}) + len(str(n))\n", "assert {name}({x}) == {z}",
     lambda k, x, y: __import__("math").gcd(x, k) + len(str(x))),
    ("from collections import Counter\n\ndef {name}(xs):\n    return Counter(xs).most_common(1)[0][1] + {k}\n",
     "assert {name}({xl!r}) == {z}", None),
]


def make_programs(n: int, seed: int = 0) -> list[SandboxJob]:
    """``n`` programs, each a function and three asserts; about 20% have one wrong expected value."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        code_t, test_t, fn = _TEMPLATES[i % len(_TEMPLATES)]
        name, k = f"func_{i}", rng.randint(1, 9)
        tests = []
        for _ in range(3):
            x, y = rng.randint(0, 50), rng.randint(0, 50)
            xs = "".join(rng.choice("abcde") for _ in range(rng.randint(1, 6)))
            xl = [rng.randint(0, 3) for _ in range(rng.randint(1, 8))]
            if fn is not None:
                z = fn(k, x, y)
            elif "Counter" in code_t:
                z = max(xl.count(v) for v in set(xl)) + k
            else:
                z = 0
            tests.append(test_t.format(name=name, x=x, y=y, z=z, xs=xs, zs=xs[::-1] * k, xl=xl))
        if rng.random() < 0.2:
            tests[-1] = tests[-1].rsplit("==", 1)[0] + "== -12345"
        jobs.append(SandboxJob(code=code_t.format(name=name, k=k), tests=tests, timeout=10.0))
    return jobs


def run_baseline(jobs: list[SandboxJob], workers: int) -> list[bool]:
    """What a user would write without a sandbox: one fresh interpreter per program."""
    def one(job: SandboxJob) -> bool:
        program = job.code + "\n" + "\n".join(job.tests) + "\n"
        try:
            done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=job.timeout)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="number of programs (default 500)")
    parser.add_argument("--workers", type=int, default=None, help="parallel workers for both (default: usable CPUs)")
    parser.add_argument("--json", metavar="PATH", help="write the rates to this JSON file")
    args = parser.parse_args(argv)
    workers = args.workers or len(os.sched_getaffinity(0))
    jobs = make_programs(args.n)
    load = os.getloadavg()[0]
    print(f"{len(jobs)} programs, {workers} workers, {os.cpu_count()} CPUs, load average {load:.2f}"
          + (" (other work is running: rates will be lower)" if load > 0.5 else ""), flush=True)

    started = time.perf_counter()
    with Sandbox(num_workers=workers, timeout=10.0) as sandbox:
        startup = time.perf_counter() - started
        sandbox.run_many(jobs[: min(20, len(jobs))])  # warm-up: first-fault costs, not measured
        started = time.perf_counter()
        results = sandbox.run_many(jobs)
        rlvr_s = time.perf_counter() - started
        layers = ", ".join(name for name, layer in sandbox.layers.items() if layer["active"])
    print(f"rlvr sandbox: {len(jobs)} programs in {rlvr_s:.2f} s = {len(jobs) / rlvr_s:.0f} programs/s "
          f"({workers} workers, started in {startup:.2f} s; layers: {layers})", flush=True)

    started = time.perf_counter()
    baseline = run_baseline(jobs, workers)
    base_s = time.perf_counter() - started
    print(f"baseline (subprocess.run per program): {len(jobs)} programs in {base_s:.2f} s = "
          f"{len(jobs) / base_s:.0f} programs/s", flush=True)

    rlvr_rate, base_rate = len(jobs) / rlvr_s, len(jobs) / base_s
    ratio = rlvr_rate / base_rate
    passed = sum(r.passed for r in results)
    mismatches = sum(r.passed != b for r, b in zip(results, baseline, strict=True))
    print(f"ratio: {ratio:.1f}x  (passed: rlvr {passed}, baseline {sum(baseline)}, disagreements {mismatches})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rlvr_programs_per_s": rlvr_rate, "baseline_programs_per_s": base_rate, "ratio": ratio,
                       "programs": len(jobs), "workers": workers, "disagreements": mismatches}, handle, indent=2)
    if mismatches:
        print("error: the sandbox and the baseline disagree on which programs pass", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
