"""tinker-cookbook's RL loop, unchanged, training SmolLM2-135M on its arithmetic recipe through ``rlvr serve``.

    pip install --no-deps tinker-cookbook==0.6.1 && pip install chz==0.4.0 blobfile==3.3.0
    .venv/bin/python examples/cookbook_rl.py [--steps 10] [--out runs/cookbook_arith]

Starts ``rlvr serve`` on a free loopback port (a subprocess, as a user would run it), then runs
``tinker_cookbook.rl.train.main`` with the cookbook's own ``ArithmeticDatasetBuilder`` ("What is x + y?", x, y in
0..100, with its few-shot prefix) and its reward: 1 for the right sum, minus 0.1 when the reply does not end with the
stop token. The cookbook talks to the server only through the official ``tinker`` SDK. Its metrics.jsonl and
checkpoints.jsonl land in ``--out``; the script prints the per-step reward at the end.

Two things are set here because the cookbook expects the hosted service: the tokenizer (the cookbook loads it from
the Hugging Face hub by model name; here it is the one rlvr caches for smollm2-135m) and the price list it downloads
for cost metrics (rlvr has no prices). The renderer is ``qwen3_instruct``, which renders exactly SmolLM2's ChatML.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tinker_cookbook import tokenizer_utils
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.rl import train
from transformers import AutoTokenizer

from rlvr.engine.models.load import ensure_smollm2

MODEL = "smollm2-135m"
RENDERER = "qwen3_instruct"


def start_server(api_key: str) -> tuple[subprocess.Popen, str]:
    """``rlvr serve`` on a free loopback port; returns the process and its base URL once it answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rlvr_bin = Path(sys.executable).with_name("rlvr")
    proc = subprocess.Popen([str(rlvr_bin), "serve", "--port", str(port)], env={**os.environ, "RLVR_API_KEY": api_key})
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base_url}/api/v1/healthz", timeout=1).close()
            return proc, base_url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("rlvr serve did not start") from None
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/cookbook_arith")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    args = parser.parse_args()

    api_key = f"tml-{secrets.token_hex(16)}"
    os.environ["TINKER_API_KEY"] = api_key  # the cookbook's ServiceClient reads it
    tokenizer_utils.register_tokenizer(MODEL, lambda: AutoTokenizer.from_pretrained(ensure_smollm2()))
    train.fetch_model_pricing = lambda *_args, **_kwargs: None

    proc, base_url = start_server(api_key)
    try:
        config = train.Config(
            learning_rate=args.learning_rate,
            dataset_builder=ArithmeticDatasetBuilder(batch_size=4, group_size=8, n_batches=args.steps,
                                                     model_name_for_tokenizer=MODEL, renderer_name=RENDERER),
            model_name=MODEL,
            recipe_name="rlvr_example_cookbook_arithmetic",
            renderer_name=RENDERER,
            max_tokens=8,
            log_path=args.out,
            base_url=base_url,
            lora_rank=16,
            eval_every=0,
            save_every=0,
        )
        start = time.time()
        asyncio.run(train.main(config))
        wall = time.time() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    rows = [json.loads(line) for line in (Path(args.out) / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if "env/all/reward/total" in row:
            print(f"step {row['step']:3d}  reward {row['env/all/reward/total']:.3f}  "
                  f"correct {row['env/all/correct']:.3f}  {row['time/total']:.1f}s")
    print(f"wall {wall:.0f}s")


if __name__ == "__main__":
    main()
