"""rlvr on the models researchers train, on this CPU: sampling, ``forward_backward`` and an RL step on random weights
of published shapes (Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.2-1B; speed does not depend on the weights, and nothing is
downloaded), each against what a user would run instead.

For each ``--models`` shape, one after another, each in a fresh process (so none competes with another for the
cores), this runs the existing benchmarks with ``--model``:

- ``bench/sampling.py``: 1 / 8 / 64 sequences x 128 new tokens against Hugging Face ``generate``, float32 (and
  bfloat16 where oneDNN multiplies it on this CPU), with the fraction of the machine's bound;
- ``bench/train_throughput.py --rank 32``: ``forward_backward`` against a torch + peft loop on the same batches,
  with the fraction of the bound and the peak memory;
- ``bench/rl_step.py --steps 2 --reward alternating``: one RL step of rlvr's loop against TRL's ``GRPOTrainer``,
  matched settings (needs ``pip install -e '.[bench]'``; left out, and said, without TRL); every other answer earns
  1, since random weights are never correct and groups of equal rewards would leave rlvr nothing to train (it drops
  them, TRL does not);

and prints one table. The per-script JSON files are kept in the combined record
(``bench/results/real_models-<date>.json``, or ``--json``).

    python bench/real_models.py [--models qwen2.5-0.5b,qwen3-0.6b,llama-3.2-1b] [--parts sampling,training,rl_step]
                                [--quick] [--json PATH]

``--quick``: 1 and 8 sequences x 8 tokens, one small training batch, one RL step of 8 tokens: checks that every part
runs, measures nothing worth keeping.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, machine, today, write_json

BENCH = Path(__file__).resolve().parent
PARTS = ("sampling", "training", "rl_step")
DEFAULT_MODELS = "qwen2.5-0.5b,qwen3-0.6b,llama-3.2-1b"


def commands(part: str, model: str, out: Path, quick: bool) -> list[str] | None:
    """The benchmark command for ``part`` on ``model`` writing its JSON to ``out`` (None: not runnable here)."""
    if part == "sampling":
        extra = ["--sizes", "1,8", "--max-tokens", "8", "--repeats", "1"] if quick else ["--repeats", "1"]
        return [sys.executable, str(BENCH / "sampling.py"), "--model", model, "--json", str(out), *extra]
    if part == "training":
        extra = ["--batches", "1", "--batch-size", "8", "--max-tokens", "16", "--warmup", "0"] if quick else [
            "--batches", "2"]
        return [sys.executable, str(BENCH / "train_throughput.py"), "--model", model, "--rank", "32", "--json",
                str(out), *extra]
    try:
        import trl  # noqa: F401
    except ImportError:
        return None
    extra = ["--steps", "1", "--max-tokens", "8"] if quick else ["--steps", "2"]
    return [sys.executable, str(BENCH / "rl_step.py"), "--model", model, "--eval-problems", "4", "--reward",
            "alternating", "--json", str(out), *extra]


def summary(part: str, record: dict[str, Any]) -> str:
    """One line of the table for ``part``'s record."""
    if "skipped" in record or "error" in record:
        return record.get("skipped") or record["error"]
    if part == "sampling":
        rows = record["results"]
        return ", ".join(f"{size}: {row['ratio']:.2f}x generate ({row['rlvr_tokens_per_s']:.1f} tok/s, "
                         f"{row['fraction_of_bound']:.2f} of bound)" for size, row in rows.items())
    if part == "training":
        return (f"{record['ratio']:.2f}x torch + peft ({record['rlvr_tokens_per_s']:.0f} tok/s, "
                f"{record['fraction_of_bound']:.2f} of bound), peak memory {record['peak_rss_bytes'] / 2**30:.1f} GiB")
    rlvr, trl = record["summary"]["rlvr"], record["summary"]["trl"]
    speedup = record["summary"]["speedup"]
    return f"{speedup:.2f}x TRL (rlvr {rlvr['s_per_step']:.1f} s/step, TRL {trl['s_per_step']:.1f})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="shapes, comma-separated")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"of {list(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="tiny settings: check that every part runs")
    parser.add_argument("--json", help="the combined record (default: bench/results/real_models-<date>.json)")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"--parts {unknown}: choose from {list(PARTS)}")
    record: dict[str, Any] = {"benchmark": "real_models", "machine": machine(), "quick": args.quick, "models": {}}
    target = args.json or (None if args.quick else RESULTS / f"real_models-{today()}.json")
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-real-") as work:
        for model in args.models.split(","):
            record["models"][model] = {}
            for part in parts:
                out = Path(work) / f"{model}-{part}.json"
                command = commands(part, model, out, args.quick)
                if command is None:
                    result = {"skipped": "TRL is not installed (pip install -e '.[bench]')"}
                else:
                    print(f"\n== {model}, {part}: {' '.join(command[1:])}", flush=True)
                    started = time.perf_counter()
                    done = subprocess.run(command)
                    result = json.loads(out.read_text()) if out.exists() else {
                        "error": f"exit {done.returncode}, no result"}
                    result["wall_s"] = time.perf_counter() - started
                record["models"][model][part] = result
                if target:  # after each part, so a stopped run keeps what it measured
                    write_json(target, record)
    print("\n| model | part | rlvr against the baseline |\n|---|---|---|")
    for model, results in record["models"].items():
        for part, result in results.items():
            print(f"| {model} | {part} | {summary(part, result)} |")
    if target:
        print(f"\nwrote {target}")
    return record


if __name__ == "__main__":
    main()
