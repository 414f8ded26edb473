"""Training throughput: rlvr's ``TrainingClient.forward_backward`` against a plain PyTorch + peft loop.

Both train a LoRA (rank 16 or ``--rank``, alpha 32, on q/k/v/o, gate/up/down and lm_head: rlvr's default targets)
on ``smollm2-135m`` (or ``--model``: a published shape with random weights, e.g. ``qwen2.5-0.5b``) in float32 (or
``--precision bfloat16``: rlvr's frozen base matmuls in bfloat16; the baseline's model loaded in bfloat16 under
``torch.autocast``, peft's adapter in float32; losses then agree less closely, see below), from
the same initial weights (A drawn from ``torch.manual_seed(seed)`` in peft's module order, B = 0), over the same
batches with the same loss: PPO's clipped surrogate summed over tokens (rlvr's ``ppo``, clip 0.8/1.2), written out
by hand in the baseline the way a researcher would (logits -> log_softmax -> gather ->
ratio -> clipped objective), a group of 8 sequences per forward with gradients accumulated
(``--baseline-microbatch``: a whole batch's full-vocabulary logits of a real shape would not fit in memory). After
each ``forward_backward`` both take the same AdamW step (lr 2e-4, betas (0.9, 0.95), eps 1e-12, no weight decay),
untimed, so the weights move as in training.

The batches look like one RL step's: ``--batch-size`` sequences, each an arithmetic prompt in the chat template
followed by 8 to ``--max-tokens`` random completion tokens, in groups of 8 with centred 0/1 rewards as advantages.
The "sampler" logprobs are the current model's logprobs of each batch (one rlvr ``forward``, untimed), so the PPO
ratio starts at 1, as on-policy RL has it. Batches alternate which side runs first; the first ``--warmup`` batches
are not counted.

Printed: tokens/s of each (all tokens of every sequence, prompt included; rlvr computes a group's shared prompt
once, the plain loop once per sequence, as a researcher's loop does), the ratio, and the largest gap between the two
losses on the same batch, relative to the batch's sum of |advantage| over completion tokens (the loss's scale: it
is a sum of +-ratio x advantage that mostly cancels, so a gap relative to the loss itself grows without bound as
the loss nears 0); they should agree (same weights, same formula), and the script fails when they differ by more
than 1e-3 (1e-2 in bfloat16). Also printed: the fraction of this machine's bound
rlvr reaches (LoRA on frozen weights costs at least 4 x linear multiply-adds FLOPs a token: the forward, and the
input gradient of every frozen matmul) and the process's peak memory.

    python bench/train_throughput.py [--model smollm2-135m] [--rank 16] [--batches 4] [--batch-size 32]
                                     [--max-tokens 64] [--json PATH]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    BENCH_MODELS,
    bench_model,
    linear_shape,
    load_average,
    machine,
    matmul_flops,
    positive_int,
    write_json,
)

ALPHA, LEARNING_RATE, CLIP, SEED = 32, 2e-4, 0.2, 0
GROUP = 8
"""Sequences per prompt (advantages are centred within each group)."""


def make_batches(tokenizer: Any, count: int, size: int, max_tokens: int) -> list[list[dict[str, Any]]]:
    """``count`` batches of ``size`` sequences: prompt ids, completion ids and one advantage per sequence."""
    from rlvr.tasks.arithmetic import ArithmeticSource

    source = ArithmeticSource(levels=(1,), instruction="Answer with only the number.", num_test=0, seed=SEED)
    problems = source.problems("train")
    rng = random.Random(SEED)
    vocab = len(tokenizer)
    batches = []
    for b in range(count):
        batch = []
        for g in range(-(-size // GROUP)):
            prompt = source.render_ids(problems[(b * size // GROUP + g) % len(problems)], tokenizer)
            rewards_G = [float(rng.random() < 0.5) for _ in range(GROUP)]
            mean = sum(rewards_G) / GROUP
            for reward in rewards_G[: size - len(batch)]:
                completion = [rng.randrange(vocab) for _ in range(rng.randint(8, max_tokens))]
                batch.append({"prompt": prompt, "completion": completion, "advantage": reward - mean})
        batches.append(batch)
    return batches


def datum_arrays(row: dict[str, Any], sampler_logprobs: list[float] | None) -> dict[str, list]:
    """Tinker's alignment: inputs = sequence[:-1], targets = sequence[1:]; prompt positions get advantage 0."""
    full = row["prompt"] + row["completion"]
    n_prompt = len(row["prompt"]) - 1
    return {"inputs": full[:-1], "targets": full[1:],
            "logprobs": sampler_logprobs if sampler_logprobs is not None else [0.0] * (len(full) - 1),
            "advantages": [0.0] * n_prompt + [row["advantage"]] * len(row["completion"])}


# -- rlvr ---------------------------------------------------------------------------------------------------------

def rlvr_datums(batch: list[dict[str, Any]], logprobs: list[list[float]]) -> list[Any]:
    from rlvr import types

    out = []
    for row, lp in zip(batch, logprobs, strict=True):
        arrays = datum_arrays(row, lp)
        out.append(types.Datum(model_input=types.ModelInput.from_ints(arrays["inputs"]),
                               loss_fn_inputs={"target_tokens": arrays["targets"], "logprobs": arrays["logprobs"],
                                               "advantages": arrays["advantages"]}))
    return out


def sampler_logprobs(client: Any, batch: list[dict[str, Any]]) -> list[list[float]]:
    """The current model's logprobs of each sequence's targets, from rlvr's ``forward`` (no gradient)."""
    from rlvr import types

    data = []
    for row in batch:
        arrays = datum_arrays(row, None)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(arrays["inputs"]),
                                loss_fn_inputs={"target_tokens": arrays["targets"],
                                                "weights": [1.0] * len(arrays["targets"])}))
    out = client.forward(data, "cross_entropy").result()
    return [o["logprobs"].tolist() for o in out.loss_fn_outputs]


# -- the plain PyTorch + peft baseline ----------------------------------------------------------------------------

def baseline_model(folder: str, targets: list[str], rank: int,
                   dtype: torch.dtype = torch.float32) -> tuple[Any, torch.optim.Optimizer]:
    """The model from the same folder in ``dtype``, a peft LoRA drawn from the same seed (float32: peft's default
    casts the adapter up), and a plain AdamW."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    model.requires_grad_(False)
    torch.manual_seed(SEED)
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=ALPHA, lora_dropout=0.0, bias="none",
                                             target_modules=targets))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    return model, optimizer


def baseline_forward_backward(model: Any, batch: list[dict[str, Any]], logprobs: list[list[float]],
                              pad_id: int, microbatch: int) -> float:
    """One forward and backward of the summed PPO loss over ``batch``, ``microbatch`` sequences at a time (their
    gradients add up, as a researcher's loop accumulates them to fit memory); returns the loss."""
    rows = [datum_arrays(row, lp) for row, lp in zip(batch, logprobs, strict=True)]
    return sum(_microbatch_loss(model, rows[start:start + microbatch], pad_id)
               for start in range(0, len(rows), microbatch))


def _microbatch_loss(model: Any, rows: list[dict[str, list]], pad_id: int) -> float:
    """Forward and backward of the summed PPO loss over ``rows`` (``datum_arrays``), right-padded; returns the loss."""
    width = max(len(r["inputs"]) for r in rows)

    def padded(key: str, value: float, dtype: torch.dtype) -> torch.Tensor:  # (B, T), right padding
        return torch.tensor([r[key] + [value] * (width - len(r[key])) for r in rows], dtype=dtype)

    input_ids, targets = padded("inputs", pad_id, torch.long), padded("targets", 0, torch.long)
    old, advantages = padded("logprobs", 0.0, torch.float32), padded("advantages", 0.0, torch.float32)
    attention_mask = torch.tensor([[1] * len(r["inputs"]) + [0] * (width - len(r["inputs"])) for r in rows])
    bf16 = model.get_input_embeddings().weight.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()  # (B, T, V)
    new = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    ratio = torch.exp(new - old)
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * advantages)
    loss = -(objective * attention_mask).sum()
    loss.backward()
    return loss.item()


# -- measuring ----------------------------------------------------------------------------------------------------

def measure(model_name: str, rank: int, batches: int, batch_size: int, max_tokens: int, warmup: int,
            baseline_microbatch: int, precision: str = "float32") -> dict[str, Any]:
    import rlvr
    from rlvr import types

    base_model, folder = bench_model(model_name)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    client = rlvr.ServiceClient(precision=precision).create_lora_training_client(base_model=base_model, rank=rank,
                                                                                  seed=SEED)
    tokenizer = client.get_tokenizer()
    targets = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in client.parameters()})
    model, optimizer = baseline_model(folder, targets, rank, dtype)
    adam = types.AdamParams(learning_rate=LEARNING_RATE)  # betas (0.9, 0.95), eps 1e-12, no decay or clipping
    all_batches = make_batches(tokenizer, warmup + batches, batch_size, max_tokens)
    rows: list[dict[str, float]] = []
    for i, batch in enumerate(all_batches):
        logprobs = sampler_logprobs(client, batch)  # untimed: the current weights', as a fresh sampler's would be
        row: dict[str, float] = {"tokens": sum(len(r["prompt"]) + len(r["completion"]) - 1 for r in batch)}

        def run_rlvr(batch=batch, logprobs=logprobs, row=row) -> None:
            data = rlvr_datums(batch, logprobs)
            started = time.perf_counter()
            out = client.forward_backward(data, "ppo", {"clip_low_threshold": 1 - CLIP,
                                                         "clip_high_threshold": 1 + CLIP}).result()
            row["rlvr_s"] = time.perf_counter() - started
            row["rlvr_loss"] = out.metrics["loss:sum"]
            started = time.perf_counter()
            client.optim_step(adam).result()
            row["rlvr_optim_s"] = time.perf_counter() - started

        def run_baseline(batch=batch, logprobs=logprobs, row=row) -> None:
            started = time.perf_counter()
            row["baseline_loss"] = baseline_forward_backward(model, batch, logprobs, tokenizer.pad_token_id,
                                                             baseline_microbatch)
            row["baseline_s"] = time.perf_counter() - started
            started = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            row["baseline_optim_s"] = time.perf_counter() - started

        for run in (run_rlvr, run_baseline) if i % 2 == 0 else (run_baseline, run_rlvr):
            run()
        # the loss is a sum of +-ratio x advantage over completion tokens that mostly cancels: the gap is measured
        # against the sum of |advantage| (the loss at ratio 1 were every advantage of one sign), a per-token share
        scale = sum(abs(r["advantage"]) * len(r["completion"]) for r in batch)
        row["loss_gap"] = abs(row["rlvr_loss"] - row["baseline_loss"]) / max(scale, 1.0)
        row["warmup"] = i < warmup
        rows.append(row)
        print(f"batch {i}{' (warm-up)' if i < warmup else ''}: {row['tokens']:.0f} tokens; rlvr {row['rlvr_s']:.2f} s, "
              f"baseline {row['baseline_s']:.2f} s; loss {row['rlvr_loss']:.6g} vs {row['baseline_loss']:.6g}",
              flush=True)
    counted = [r for r in rows if not r["warmup"]]
    tokens = sum(r["tokens"] for r in counted)
    ours = tokens / sum(r["rlvr_s"] for r in counted)
    theirs = tokens / sum(r["baseline_s"] for r in counted)
    bound = matmul_flops(dtype) / (4 * linear_shape(folder)["linear_params"])
    return {"rlvr_tokens_per_s": ours, "baseline_tokens_per_s": theirs, "ratio": ours / theirs,
            "bound_tokens_per_s": bound, "fraction_of_bound": ours / bound,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "max_loss_gap": max(r["loss_gap"] for r in rows),
            "rlvr_optim_s": statistics.fmean(r["rlvr_optim_s"] for r in counted),
            "baseline_optim_s": statistics.fmean(r["baseline_optim_s"] for r in counted), "batches": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help=BENCH_MODELS)
    parser.add_argument("--rank", type=positive_int, default=16, help="LoRA rank (default 16)")
    parser.add_argument("--batches", type=positive_int, default=4, help="measured batches (default 4)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="sequences per batch (default 32)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="longest completion (default 64)")
    parser.add_argument("--warmup", type=int, default=1, help="batches run first and not counted (default 1)")
    parser.add_argument("--baseline-microbatch", type=positive_int, default=GROUP,
                        help=f"sequences per forward in the plain loop, gradients accumulated (default {GROUP}: a "
                        "group; a whole batch's full-vocabulary logits of a real shape do not fit in memory)")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                        help="the frozen base matmuls' precision in both (bfloat16 needs a CPU that multiplies it)")
    parser.add_argument("--json", metavar="PATH", help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    load_before = load_average()
    print(f"{args.model}, {args.precision}, LoRA r{args.rank}, ppo loss; {args.batches} batches of "
          f"{args.batch_size} sequences (+{args.warmup} warm-up), completions up to {args.max_tokens} tokens; "
          f"{torch.get_num_threads()} threads, load average {load_before}", flush=True)
    result = measure(args.model, args.rank, args.batches, args.batch_size, args.max_tokens, args.warmup,
                     args.baseline_microbatch, args.precision)
    print(f"forward_backward tokens/s: rlvr {result['rlvr_tokens_per_s']:.0f} ({result['fraction_of_bound']:.2f} of "
          f"the bound {result['bound_tokens_per_s']:.0f}), plain torch+peft "
          f"{result['baseline_tokens_per_s']:.0f}, ratio {result['ratio']:.2f}x; peak memory (both, one process) "
          f"{result['peak_rss_bytes'] / 2**30:.1f} GiB; optim_step "
          f"{result['rlvr_optim_s'] * 1e3:.0f} ms vs {result['baseline_optim_s'] * 1e3:.0f} ms; "
          f"largest loss gap {result['max_loss_gap']:.1e} (of the batch's sum of |advantage|)")
    if args.json:
        write_json(args.json, {"benchmark": "train_throughput", "machine": machine(),
                               "load_average": {"before": load_before, "after": load_average()},
                               "settings": {"model": args.model, "batches": args.batches,
                                            "batch_size": args.batch_size, "max_tokens": args.max_tokens,
                                            "warmup": args.warmup, "rank": args.rank,
                                            "baseline_microbatch": args.baseline_microbatch,
                                            "precision": args.precision,
                                            "loss": "ppo"}, **result})
    tolerance = 1e-2 if args.precision == "bfloat16" else 1e-3
    if result["max_loss_gap"] > tolerance:
        print(f"error: rlvr's and the baseline's losses differ by up to {result['max_loss_gap']:.2e} of the "
              "batch's sum of |advantage|: they are not computing the same thing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
