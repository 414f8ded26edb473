"""Run the benchmarks from one entry point and print one markdown table.

    python -m bench all                 # every benchmark (under 20 minutes on 2 cores)
    python -m bench rl_step             # one of: sampling, sandbox, train_throughput, rl_step
    python -m bench all --quick         # tiny settings, to check that everything runs (writes no file)

Each benchmark runs as its own script in a fresh interpreter (``bench/<name>.py ... --json FILE``; the scripts
stay usable alone), one after another so they never compete for the cores. ``all`` writes
``bench/results/<date>.json``, a single benchmark ``bench/results/<name>-<date>.json``: the machine, the settings,
each script's full JSON and the table. The table's ratio is always "how many times better rlvr is": rlvr over the
baseline for rates, the baseline over rlvr for seconds per step.

Not here: any measurement (each script holds its own) or ``bench/scale.py`` (the Ray backend; run it alone).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, load_average, machine, today, write_json

HERE = Path(__file__).resolve().parent

# name -> (full settings, quick settings); the scripts' own defaults are the full settings unless given here.
# `all` must finish in 20 minutes on 2 cores; on an AMD EPYC, where MKL's float32 GEMM is slow, TRL's step alone
# takes 55-64 s (8 steps: ~8 min), so `all` runs one sampling repeat, one measured training batch and no profiled
# rlvr run (``python -m bench rl_step`` alone adds the profile; the scripts' own defaults repeat more).
SETTINGS: dict[str, tuple[list[str], list[str]]] = {
    "sampling": (["--repeats", "1"], ["--max-tokens", "8", "--sizes", "1,8"]),
    "sandbox": ([], ["--n", "40"]),
    "train_throughput": (["--batches", "1"], ["--batches", "1", "--batch-size", "8", "--max-tokens", "16",
                                              "--warmup", "0"]),
    "rl_step": (["--steps", "8"], ["--steps", "1", "--eval-problems", "8", "--max-tokens", "16", "--profile"]),
}
SINGLE: dict[str, list[str]] = {"rl_step": ["--steps", "8", "--profile"]}
"""What ``python -m bench <name>`` runs where it differs from ``all``'s settings."""


def run_one(name: str, args: list[str], folder: Path) -> dict[str, Any]:
    """Run ``bench/<name>.py`` with ``args`` (its output shown as it comes); its JSON, or the failure."""
    out = folder / f"{name}.json"
    command = [sys.executable, str(HERE / f"{name}.py"), *args, "--json", str(out)]
    print(f"\n## {name}: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    code = subprocess.run(command, cwd=HERE.parent).returncode
    record: dict[str, Any] = {"args": args, "exit_code": code, "wall_s": round(time.perf_counter() - started, 1)}
    if out.exists():
        record["result"] = json.loads(out.read_text())
    if code != 0:
        print(f"{name} failed (exit {code}); the table marks it", file=sys.stderr, flush=True)
    return record


def rows_for(name: str, record: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Table rows (benchmark, rlvr, baseline, ratio) for one benchmark's record."""
    result = record.get("result")
    if record["exit_code"] != 0 or result is None:
        return [(name, "failed", f"exit {record['exit_code']}", "")]
    if name == "sampling":
        tokens = result["max_tokens"]
        rows = []
        for size, r in result["results"].items():
            shape = f"{size} sequence{'s' if size != '1' else ''} x {tokens} new tokens"
            rows.append((f"sampling tokens/s, {shape} (baseline: HF generate)", f"{r['rlvr_tokens_per_s']:.1f}",
                         f"{r['baseline_tokens_per_s']:.1f}", f"{r['ratio']:.2f}x"))
            if "bfloat16" in r:
                b = r["bfloat16"]
                against = f"against float32 generate {b['ratio_to_float32_generate']:.2f}x"
                rows.append((f"sampling tokens/s in bfloat16, {shape} (baseline: HF generate in bfloat16; {against})",
                             f"{b['rlvr_tokens_per_s']:.1f}", f"{b['baseline_tokens_per_s']:.1f}",
                             f"{b['ratio']:.2f}x"))
        return rows
    if name == "sandbox":
        return [(f"sandbox programs/s, {result['programs']} programs, {result['workers']} workers (baseline: one "
                 "fresh interpreter each)",
                 f"{result['rlvr_programs_per_s']:.0f}", f"{result['baseline_programs_per_s']:.0f}",
                 f"{result['ratio']:.2f}x")]
    if name == "train_throughput":
        s = result["settings"]
        return [(f"forward_backward tokens/s, LoRA r{s['rank']}, {s['batch_size']} seqs/batch, {s['loss']} loss "
                 "(baseline: torch + peft loop)", f"{result['rlvr_tokens_per_s']:.0f}",
                 f"{result['baseline_tokens_per_s']:.0f}", f"{result['ratio']:.2f}x")]
    if name == "rl_step":
        s, summary = result["settings"], result["summary"]
        shape = (f"{s['problems_per_step']} prompts x {s['group_size']}, {s['max_tokens']} new tokens, "
                 f"LoRA r{s['rank']}")
        return [(f"RL step s/step, {shape} (baseline: TRL GRPOTrainer)", f"{summary['rlvr']['s_per_step']:.2f}",
                 f"{summary['trl']['s_per_step']:.2f}", f"{summary['speedup']:.2f}x"),
                (f"held-out greedy accuracy after {s['steps']} steps, {s['eval_problems']} problems "
                 f"(base model {summary['base_accuracy']:.3f})", f"{summary['rlvr']['accuracy']:.3f}",
                 f"{summary['trl']['accuracy']:.3f}",
                 f"{summary['rlvr']['accuracy'] - summary['trl']['accuracy']:+.3f} (difference)")]
    raise KeyError(name)


def table(records: dict[str, dict[str, Any]], about: dict[str, Any]) -> str:
    """The markdown table, the machine it ran on, and the verdict on the RL step when it ran."""
    lines = ["| benchmark | rlvr | baseline | ratio |", "|---|---|---|---|"]
    for name, record in records.items():
        lines += ["| " + " | ".join(row) + " |" for row in rows_for(name, record)]
    versions = ", ".join(f"{k} {v}" for k, v in about["versions"].items() if v)
    lines += ["", f"Machine: {about['cpu_model']}, {about['usable_cores']} usable cores, torch "
                  f"{about['torch_threads']} threads, Python {about['python']}; {versions}. Load average before "
                  f"{about['load_average']}, after {about['load_after']}."]
    rl = records.get("rl_step", {}).get("result")
    if rl is not None and records["rl_step"]["exit_code"] == 0:
        summary = rl["summary"]
        lines.append(f"RL step: rlvr {summary['speedup']:.2f}x faster than TRL's GRPOTrainer "
                     f"({'meets' if summary['faster_3x'] else 'does NOT meet'} the 3x goal); held-out accuracy "
                     f"{'at least as high as' if summary['accuracy_at_least_as_high'] else 'LOWER than'} TRL's. "
                     "Mean seconds per step, sample / score / train: rlvr "
                     + " / ".join(f"{summary['rlvr'][f'{k}_s']:.1f}" for k in ("sample", "score", "train"))
                     + ", TRL " + " / ".join(f"{summary['trl'][f'{k}_s']:.1f}" for k in ("sample", "score", "train"))
                     + " (rlvr's sample includes the sampler refresh and check).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["all", *SETTINGS], help="a benchmark, or all of them")
    parser.add_argument("--quick", action="store_true", help="tiny settings: check that it runs (writes no file "
                                                             "unless --out is given)")
    parser.add_argument("--out", metavar="PATH", help="results file (default bench/results/[<name>-]<date>.json)")
    args = parser.parse_args(argv)
    names = list(SETTINGS) if args.name == "all" else [args.name]
    about = machine()
    started = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-") as folder:
        for name in names:
            full, quick = SETTINGS[name]
            if args.name != "all":
                full = SINGLE.get(name, full)
            records[name] = run_one(name, quick if args.quick else full, Path(folder))
    about["load_after"] = load_average()
    text = table(records, about)
    print(f"\n{text}\n\n(total {time.perf_counter() - started:.0f} s)")
    out = args.out or (None if args.quick else RESULTS / (f"{today()}.json" if args.name == "all"
                                                          else f"{args.name}-{today()}.json"))
    if out:
        path = write_json(out, {"date": today(), "quick": args.quick, "machine": about,
                                "total_s": round(time.perf_counter() - started, 1), "benchmarks": records,
                                "table": text})
        print(f"wrote {path}")
    return max((r["exit_code"] != 0 for r in records.values()), default=0)


if __name__ == "__main__":
    sys.exit(main())
