"""Sampling throughput: rlvr's sampler against Hugging Face ``generate`` (the path TRL takes without vLLM).

The same prompts, group sizes and parameters go through both, on ``smollm2-135m``: 1, 8 and 64 sequences (64 =
8 prompts x 8 samples), 128 new tokens each (no early stop, so both produce exactly that many). Printed: tokens/s of
both, the ratio, and the fraction of this machine's bound rlvr reaches: decoding many rows is compute-bound at about
2 x parameters FLOPs per token, measured against the matmul FLOP/s this machine sustains.

Everything that computes runs on the engine's thread, generate included: torch work split between two threads of
one process ran about a third slower here than the same work on one thread, whichever side it hit.

These VMs share their cores (steal time of 25% is common), so each size runs ``--repeats`` times, rlvr and
``generate`` alternating, and the best rate of each is compared.

    python bench/sampling.py [--max-tokens 128] [--sizes 1,8,64] [--repeats 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import rlvr
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.models import load_base_model


def matmul_flops() -> float:
    """Sustained float32 matmul FLOP/s of this machine (best of a few 1024^3 products)."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


def prompts_for(tokenizer, count: int) -> list[list[int]]:
    questions = [f"Explain step by step: what is {7 * i + 3} + {5 * i + 11}?" for i in range(count)]
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                           add_generation_prompt=True)) for q in questions]


def run_rlvr(sampler, prompts: list[list[int]], samples: int, max_tokens: int) -> float:
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=[], seed=0)
    start = time.perf_counter()
    futures = [sampler.sample(types.ModelInput.from_ints(p), samples, params) for p in prompts]
    tokens = sum(len(s.tokens) for f in futures for s in f.result().sequences)
    return tokens / (time.perf_counter() - start)


def run_generate(model, tokenizer, prompts: list[list[int]], samples: int, max_tokens: int) -> float:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding, as generate wants
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=0, top_p=1.0,
                             num_return_sequences=samples, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             pad_token_id=pad)
    tokens = (out.shape[1] - width) * out.shape[0]
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--sizes", default="1,8,64", help="sequence counts; above 8 they are 8 prompts x n/8")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per size; the best of each counts")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    engine = Engine.default()
    sampler = rlvr.ServiceClient(engine).create_sampling_client(base_model="smollm2-135m")
    reference = engine.run(load_base_model, "smollm2-135m")  # a separate copy for generate
    model, tokenizer = reference.model, reference.tokenizer
    params = sum(p.numel() for p in model.parameters())
    flops = engine.run(matmul_flops)
    bound = flops / (2 * params)
    print(f"smollm2-135m: {params / 1e6:.1f}M parameters; matmul {flops / 1e9:.0f} GFLOP/s -> compute bound "
          f"{bound:.0f} tokens/s; {torch.get_num_threads()} threads; {args.max_tokens} new tokens per sequence")
    run_rlvr(sampler, prompts_for(tokenizer, 1), 1, 4)  # warm-up
    results = {}
    print(f"{'sequences':>9} | {'rlvr tok/s':>10} | {'generate tok/s':>14} | {'ratio':>5} | {'of bound':>8}")
    for size in [int(s) for s in args.sizes.split(",")]:
        n_prompts = min(size, 8)
        samples = size // n_prompts
        prompts = prompts_for(tokenizer, n_prompts)
        ours = theirs = 0.0
        for _ in range(args.repeats):
            ours = max(ours, run_rlvr(sampler, prompts, samples, args.max_tokens))
            theirs = max(theirs, engine.run(run_generate, model, tokenizer, prompts, samples, args.max_tokens))
        results[str(size)] = {"rlvr_tokens_per_s": ours, "baseline_tokens_per_s": theirs, "ratio": ours / theirs,
                              "fraction_of_bound": ours / bound, "prompts": n_prompts, "samples_per_prompt": samples}
        print(f"{size:>9} | {ours:>10.1f} | {theirs:>14.1f} | {ours / theirs:>5.2f} | {ours / bound:>8.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": {"threads": torch.get_num_threads(), "matmul_flops": flops},
                       "max_tokens": args.max_tokens, "repeats": args.repeats, "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()
