"""Multi-turn code refinement on MBPP with the full loop: the model writes a program, sees which tests failed, and
tries again; each attempt runs in the sandbox.

    .venv/bin/python examples/mbpp_refine.py --data ../shared/data/mbpp [--steps 10] [--out runs/mbpp-refine]

``--data`` is a folder with MBPP's ``train.jsonl`` (the format of the Hugging Face ``mbpp`` "full" config) and,
optionally, ``validation.jsonl``, whose first ``--eval-problems`` problems are played greedily before and after.
Prints each step's mean episode reward, the share solved and the attempts used.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from transformers import AutoTokenizer

from rlvr.engine.models.load import ensure_smollm2
from rlvr.integrations.refine import code_refine_dataset
from rlvr.rl import LoopConfig, train
from rlvr.tasks import MbppSource


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder with MBPP's train.jsonl")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-attempts", type=int, default=2)
    parser.add_argument("--eval-problems", type=int, default=8)
    parser.add_argument("--out", default="runs/mbpp-refine")
    args = parser.parse_args()

    files = {split: Path(args.data) / f"{split}.jsonl" for split in ("train", "validation")}
    source = MbppSource({split: str(path) for split, path in files.items() if path.is_file()}, show_tests=1,
                        instruction="Answer with one ```python block.")
    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2())
    dataset = code_refine_dataset(source, tokenizer, problems_per_batch=2, group_size=4, max_attempts=args.max_attempts,
                                  test_split="validation" if files["validation"].is_file() else None,
                                  test_problems=args.eval_problems)
    config = LoopConfig(base_model="smollm2-135m", steps=args.steps, group_size=4, max_tokens=192,
                        max_turns=args.max_attempts, learning_rate=1e-4, out=args.out)
    start = time.time()
    result = train(config, dataset, progress=lambda step, m: print(
        f"step {step:3d}  reward {m['env/all/reward/mean']:+.3f}  solved {m.get('env/all/passed', 0):.2f}  "
        f"turns {m['env/all/turns']:.2f}  {m['time/total']:.0f}s", flush=True))
    if "after" in result:
        print(f"held-out solved: before {result['before']['test/correct']:.3f}, after "
              f"{result['after']['test/correct']:.3f}")
    print(f"wall {time.time() - start:.0f}s; rollouts in {args.out}/rollouts/index.html")


if __name__ == "__main__":
    main()
