"""rlvr on one GPU: sampling, training and an RL step, against what a user would otherwise run on the same GPU.

For models of the Qwen2.5-0.5B, Llama-3.2-1B and Qwen3-4B shapes (random weights with the real shapes and
vocabularies, written by ``rlvr.engine.models.random_models``: no download), in one process on one GPU, in
bfloat16 (rlvr's CUDA default; the baselines load the same folder in bfloat16 with transformers' default attention,
SDPA):

- **sampling**: tokens/s at ``--sizes`` sequences (64, 256, 1024) x ``--max-tokens`` new tokens (512), groups of
  8 samples per prompt, 128-token prompts, temperature 1, no early stop; rlvr's sampler (no adapter) against Hugging
  Face ``generate`` and transformers' continuous batching (``generate_batch``, where the installed transformers has
  it: its rate is taken over its requests' own lifespans, so its CUDA-graph warm-up is left out), the same prompts.
  rlvr and ``generate`` decode at most ``rows`` sequences at once, the most whose KV cache fits in a third of the
  GPU's memory (a multiple of 8; printed); continuous batching manages its own memory;
- **training**: ``forward_backward`` tokens/s (importance-sampling loss; groups of 8 datums sharing a 128-token
  prompt; LoRA rank 32 on q/k/v/o, gate/up/down and lm_head) against a plain torch + peft loop on the same batches
  (a padded forward, log-softmax over the full logits, the same loss, backward), microbatched to the same token
  budget (halved until it fits when the full logits do not);
- **an RL step** (sample ``--rl-prompts`` x 8 completions of ``--rl-tokens`` tokens, ``forward_backward``,
  ``optim_step``) against TRL's ``GRPOTrainer`` (its ``generate`` path, LoRA without lm_head on both: TRL refuses
  one there) when ``trl`` is importable; the second step of each is timed (the first warms up);
- **bounds**: each rlvr figure as a fraction of what this GPU allows, from its measured bfloat16 matmul rate F and
  memory bandwidth B: a decode step of R rows with c cached tokens each takes at least max(2 N R / F,
  (W + R c K) / B) (N: multiply-adds per token in the linear layers, W their weight bytes, K the KV bytes per
  token), summed over the steps; training takes at least 4 N / F per token (forward, and the input gradient of every
  frozen matmul; attention left out).

    python bench/gpu.py [--models qwen2.5-0.5b,llama-3.2-1b,qwen3-4b] [--sizes 64,256,1024] [--max-tokens 512]
                        [--json PATH] [--budget SECONDS]
    python bench/gpu.py --smoke    # tiny shapes on the CPU (the GPU paths forced): runs every code path, measures
                                   # nothing worth keeping (continuous batching alone takes ~10 s a call there)
    python bench/gpu.py --skip trl,continuous    # leave baselines out: generate, continuous, plain, trl
    python bench/gpu.py --profile    # and, after each model, the kernels that take the most device time in one
                                     # sampling call at the largest size and one forward_backward call

Without ``--json`` a GPU run writes ``bench/results/gpu-<date>-<gpu>.json``. Without CUDA it refuses (except
``--smoke``).
"""

from __future__ import annotations

import argparse
import gc
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench.common import RESULTS, machine, positive_int, today, write_json

GROUP = 8  # samples per prompt, in sampling and training batches alike
PROMPT_TOKENS = 128
LORA_RANK = 32
DECODE_MEMORY = 1 / 3  # of the GPU's memory, for the KV cache of the rows rlvr and generate decode at once
BASELINES = ("generate", "continuous", "plain", "trl")


# -- the machine ------------------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn: Callable[[], Any], device: torch.device, repeats: int = 5) -> float:
    fn()
    synchronize(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def gpu_bounds(device: torch.device, smoke: bool) -> dict[str, Any]:
    """The device's name and memory, and its measured bfloat16 matmul FLOP/s and memory bandwidth (bytes/s)."""
    n = 512 if smoke else 8192
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    flops = 2 * n**3 / best_seconds(lambda: a @ b, device)
    size = (2**22 if smoke else 2**30) // 4
    x = torch.empty(size, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    bandwidth = 2 * x.numel() * 4 / best_seconds(lambda: y.copy_(x), device)  # read + write
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info = {"name": torch.cuda.get_device_name(device), "memory_bytes": properties.total_memory,
                "capability": f"{properties.major}.{properties.minor}", "cuda": torch.version.cuda}
    else:
        info = {"name": "cpu (smoke)", "memory_bytes": 0, "capability": None, "cuda": None}
    return {**info, "matmul_flops": flops, "matmul_dtype": str(dtype).removeprefix("torch."),
            "memory_bandwidth": bandwidth}


# -- model shapes and bounds ------------------------------------------------------------------------------------------

def shape_of(config: Any, bytes_per_value: int) -> dict[str, float]:
    """Multiply-adds per token in the linear layers (lm_head included), their weight bytes, KV bytes per token."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = config.hidden_size * (2 * q + 2 * kv) + 3 * config.hidden_size * config.intermediate_size
    linear = config.num_hidden_layers * per_layer + config.vocab_size * config.hidden_size
    return {"linear_params": linear, "weight_bytes": linear * bytes_per_value,
            "kv_bytes_per_token": config.num_hidden_layers * 2 * kv * bytes_per_value}


def decode_bound(shape: dict[str, float], bounds: dict[str, Any], rows: int, prompt: int, new: int) -> float:
    """Tokens/s a decode of ``rows`` rows x ``new`` tokens after ``prompt``-token prompts cannot beat (roofline)."""
    seconds = 0.0
    for step in range(new):
        compute = 2 * shape["linear_params"] * rows / bounds["matmul_flops"]
        memory = (shape["weight_bytes"] + rows * (prompt + step) * shape["kv_bytes_per_token"]) / bounds[
            "memory_bandwidth"]
        seconds += max(compute, memory)
    return rows * new / seconds


def train_bound(shape: dict[str, float], bounds: dict[str, Any]) -> float:
    """Tokens/s LoRA training on frozen base weights cannot beat: 4 N FLOPs a token (attention left out)."""
    return bounds["matmul_flops"] / (4 * shape["linear_params"])


def decode_rows(shape: dict[str, float], bounds: dict[str, Any], prompt: int, new: int, largest: int) -> int:
    """The most rows (a multiple of ``GROUP``, at most ``largest``) whose KV cache fits ``DECODE_MEMORY``."""
    if not bounds["memory_bytes"]:
        return largest
    fits = int(DECODE_MEMORY * bounds["memory_bytes"] / ((prompt + new) * shape["kv_bytes_per_token"]))
    return max(GROUP, min(largest, fits // GROUP * GROUP))


# -- workloads --------------------------------------------------------------------------------------------------------

def prompts_for(count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` random byte-token prompts of ``length`` tokens (the folders hold a byte tokenizer)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (count, length), generator=g).tolist()


def training_batch(sequences: int, length: int, prompt: int, seed: int) -> list[Any]:
    """Importance-sampling datums: groups of ``GROUP`` sharing a ``prompt``-token prompt, ``length`` tokens each."""
    from rlvr import types

    g = torch.Generator().manual_seed(seed)
    data = []
    for p in prompts_for(max(1, sequences // GROUP), prompt, seed):
        for _ in range(min(GROUP, sequences)):
            completion = torch.randint(3, 256, (length - prompt,), generator=g).tolist()
            tokens = p + completion
            n = len(tokens) - 1
            data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                "target_tokens": tokens[1:], "logprobs": (-torch.rand(n, generator=g) * 4).tolist(),
                "advantages": [0.0] * (prompt - 1) + torch.randn(1, generator=g).expand(n - prompt + 1).tolist()}))
    return data


# -- sampling ---------------------------------------------------------------------------------------------------------

def sample_rlvr(sampler: Any, prompts: list[list[int]], new: int, device: torch.device) -> tuple[int, float]:
    from rlvr import types

    params = types.SamplingParams(max_tokens=new, temperature=1.0, stop=[], seed=0)
    synchronize(device)
    start = time.perf_counter()
    futures = [sampler.sample(types.ModelInput.from_ints(p), GROUP, params) for p in prompts]
    tokens = sum(len(s.tokens) for f in futures for s in f.result().sequences)
    return tokens, time.perf_counter() - start


def sample_generate(model: Any, prompts: list[list[int]], new: int, rows: int, pad: int, device: torch.device
                    ) -> tuple[int, float]:
    """Hugging Face ``generate``, ``rows // GROUP`` prompts at a time (their samples: ``num_return_sequences``)."""
    tokens, seconds = 0, 0.0
    step = max(1, rows // GROUP)
    for start in range(0, len(prompts), step):
        chunk = prompts[start:start + step]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        synchronize(device)
        began = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, num_return_sequences=GROUP, max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=pad)
        synchronize(device)
        seconds += time.perf_counter() - began
        tokens += (out.shape[1] - width) * out.shape[0]
    return tokens, seconds


def sample_continuous(model: Any, prompts: list[list[int]], new: int, pad: int) -> dict[str, Any]:
    """transformers' continuous batching: tokens/s over the requests' own lifespans, and over the whole call."""
    from transformers import GenerationConfig

    if not hasattr(model, "generate_batch"):
        return {"skipped": "this transformers has no generate_batch"}
    # each prompt sent GROUP times: generate_batch does not honour num_return_sequences (transformers 5.17 returned
    # one sequence a request)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                              eos_token_id=-1, pad_token_id=pad)
    start = time.perf_counter()
    outputs = model.generate_batch(inputs=[p for p in prompts for _ in range(GROUP)], generation_config=config,
                                   progress_bar=False)
    wall = time.perf_counter() - start
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    spans = [o.lifespan for o in outputs.values() if o.lifespan[0] >= 0]
    span = max(end for _, end in spans) - min(begin for begin, _ in spans) if spans else wall
    return {"tokens": tokens, "requests": len(outputs), "tokens_per_s": tokens / span, "wall_tokens_per_s":
            tokens / wall}


def rate(tokens: int, seconds: float) -> dict[str, float]:
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def skipped(args: argparse.Namespace, baseline: str) -> dict[str, str] | None:
    if baseline in args.skip:
        return {"skipped": "--skip"}
    return out_of_time(args)


def out_of_time(args: argparse.Namespace) -> dict[str, str] | None:
    """``{"skipped": ...}`` once the ``--budget`` is spent (what is left is not started), else None."""
    if args.deadline is not None and time.monotonic() > args.deadline:
        return {"skipped": f"--budget {args.budget:g} s spent"}
    return None


def guarded(fn: Callable[[], Any]) -> Any:
    """``fn()``, or what stopped it (out of memory, an error), recorded instead of ending the benchmark (the
    figures measured before it are kept)."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError as exc:
        return {"error": f"out of memory: {str(exc)[:200]}"}
    except Exception as exc:  # a measurement that fails here is a result, not a reason to stop
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure_sampling(service: Any, folder: str, reference: Any, shape: dict, bounds: dict, args: argparse.Namespace,
                     device: torch.device, rows: int) -> dict[str, Any]:
    sampler = service.create_sampling_client(base_model=folder)
    pad = 0
    sample_rlvr(sampler, prompts_for(1, PROMPT_TOKENS, 0), min(8, args.max_tokens), device)  # warm-up
    results = {}
    for size in args.sizes:
        prompts = prompts_for(max(1, size // GROUP), PROMPT_TOKENS, seed=size)
        bound = decode_bound(shape, bounds, min(rows, size), PROMPT_TOKENS, args.max_tokens)
        rlvr = out_of_time(args) or guarded(
            lambda prompts=prompts: rate(*sample_rlvr(sampler, prompts, args.max_tokens, device)))
        ours = rlvr.get("tokens_per_s", math.nan)
        generate = skipped(args, "generate") or guarded(
            lambda prompts=prompts: rate(*sample_generate(reference, prompts, args.max_tokens, rows, pad, device)))
        continuous = skipped(args, "continuous") or guarded(
            lambda prompts=prompts: sample_continuous(reference, prompts, args.max_tokens, pad))
        row = {"sequences": size, "rows_at_once": min(rows, size), "rlvr": rlvr, "rlvr_tokens_per_s": ours,
               "rlvr_fraction_of_bound": ours / bound, "bound_tokens_per_s": bound, "generate": generate,
               "continuous_batching": continuous}
        for name, other in (("generate", generate), ("continuous_batching", continuous)):
            if "tokens_per_s" in other:
                row[f"ratio_to_{name}"] = ours / other["tokens_per_s"]
        results[str(size)] = row
        print(f"  {size:>5} seqs | rlvr {_rate(rlvr)} ({ours / bound:.2f} of bound {bound:.0f}) | generate "
              f"{_rate(generate)} | continuous batching {_rate(continuous)}", flush=True)
    return results


def _rate(result: dict[str, Any]) -> str:
    if "tokens_per_s" in result:
        return f"{result['tokens_per_s']:.0f} tok/s"
    return result.get("error") or result.get("skipped") or "?"


# -- training ---------------------------------------------------------------------------------------------------------

def train_rlvr(tc: Any, batches: list[list[Any]], device: torch.device) -> tuple[int, float]:
    from rlvr import types

    tc.forward_backward(batches[0], "importance_sampling").result()  # warm-up
    synchronize(device)
    start = time.perf_counter()
    for batch in batches:
        tc.forward_backward(batch, "importance_sampling").result()
    synchronize(device)
    seconds = time.perf_counter() - start
    tc.optim_step(types.AdamParams(learning_rate=0.0)).result()
    return sum(len(d.model_input.to_ints()) for batch in batches for d in batch), seconds


def lora_targets(unembed: bool) -> list[str]:
    return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] + (
        ["lm_head"] if unembed else [])


def train_plain(reference: Any, batches: list[list[Any]], microbatch_tokens: int, device: torch.device
                ) -> dict[str, Any]:
    """The plain loop: peft LoRA on the model, each microbatch padded, full log-softmax, the same loss, backward."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(reference, LoraConfig(r=LORA_RANK, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules=lora_targets(True)))
    length = max(len(d.model_input.to_ints()) for batch in batches for d in batch)
    rows = max(1, microbatch_tokens // length)

    def step(batch: list[Any], rows: int) -> None:
        for start in range(0, len(batch), rows):
            part = batch[start:start + rows]
            width = max(len(d.model_input.to_ints()) for d in part)
            ids = torch.zeros(len(part), width, dtype=torch.long)
            mask = torch.zeros(len(part), width, dtype=torch.long)
            targets, old, advantages = (torch.zeros(len(part), width) for _ in range(3))
            for i, d in enumerate(part):
                n = len(d.model_input.to_ints())
                ids[i, :n], mask[i, :n] = torch.tensor(d.model_input.to_ints()), 1
                targets[i, :n] = d.loss_fn_inputs["target_tokens"].to_torch().float()
                old[i, :n] = d.loss_fn_inputs["logprobs"].to_torch()
                advantages[i, :n] = d.loss_fn_inputs["advantages"].to_torch()
            ids, mask, targets, old, advantages = (t.to(device) for t in (ids, mask, targets, old, advantages))
            logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (B, T, V)
            logprobs = torch.log_softmax(logits, -1).gather(-1, targets.long()[..., None]).squeeze(-1)
            loss = -(torch.exp(logprobs - old) * advantages * mask).sum()
            loss.backward()

    while True:  # a user halves the microbatch until the full logits fit
        try:
            step(batches[0], rows)  # warm-up
            break
        except torch.cuda.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            if rows == 1:
                raise
            rows //= 2
    synchronize(device)
    start = time.perf_counter()
    for batch in batches:
        step(batch, rows)
    synchronize(device)
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    model.unload()  # the reference model without its adapter again
    tokens = sum(len(d.model_input.to_ints()) for batch in batches for d in batch)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "rows_per_microbatch": rows}


def measure_training(service: Any, folder: str, reference: Any, shape: dict, bounds: dict, args: argparse.Namespace,
                     device: torch.device) -> dict[str, Any]:
    batches = [training_batch(args.train_sequences, args.train_length, min(PROMPT_TOKENS, args.train_length // 2),
                              seed=i) for i in range(args.train_batches)]
    tc = service.create_lora_training_client(base_model=folder, rank=LORA_RANK, seed=0)
    rlvr = out_of_time(args) or guarded(lambda: rate(*train_rlvr(tc, batches, device)))
    ours = rlvr.get("tokens_per_s", math.nan)
    bound = train_bound(shape, bounds)
    plain = skipped(args, "plain") or guarded(lambda: train_plain(reference, batches, args.microbatch_tokens, device))
    result = {"tokens": rlvr.get("tokens"), "rlvr": rlvr, "rlvr_tokens_per_s": ours,
              "rlvr_fraction_of_bound": ours / bound, "bound_tokens_per_s": bound, "plain_torch_peft": plain}
    if "tokens_per_s" in plain:
        result["ratio_to_plain"] = ours / plain["tokens_per_s"]
    print(f"  forward_backward | rlvr {_rate(rlvr)} ({ours / bound:.2f} of bound {bound:.0f}) | torch + peft "
          f"{_rate(plain)}", flush=True)
    return result


# -- where the time goes ----------------------------------------------------------------------------------------------

def profile(service: Any, folder: str, args: argparse.Namespace, device: torch.device, rows: int) -> None:
    """Print the kernels that take the most device time in one rlvr sampling call (the largest size, 32 new tokens)
    and one ``forward_backward`` call (a training batch of the benchmark's shape), each after a warm-up call."""
    size = min(rows, max(args.sizes))
    sampler = service.create_sampling_client(base_model=folder)
    prompts = prompts_for(max(1, size // GROUP), PROMPT_TOKENS, seed=1)
    new = min(32, args.max_tokens)
    _print_top(f"sampling {size} sequences x {new} tokens", lambda: sample_rlvr(sampler, prompts, new, device),
               device)  # the warm-up also captures this row count's CUDA graph
    tc = service.create_lora_training_client(base_model=folder, rank=LORA_RANK, seed=0)
    batch = training_batch(args.train_sequences, args.train_length, min(PROMPT_TOKENS, args.train_length // 2), 7)
    _print_top(f"forward_backward, {len(batch)} datums x {args.train_length} tokens",
               lambda: tc.forward_backward(batch, "importance_sampling").result(), device)


def _print_top(label: str, call: Callable[[], Any], device: torch.device) -> None:
    """Run ``call`` once to warm up, then once under torch's profiler, and print its 25 costliest ops and kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    try:  # the engine computes on its own worker thread
        options = {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (AttributeError, TypeError):
        options = {}
    call()
    synchronize(device)
    with torch_profile(activities=activities, **options) as prof:
        call()
        synchronize(device)
    print(f"\n  profile: {label}", flush=True)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=70), flush=True)


# -- one RL step ------------------------------------------------------------------------------------------------------

def rl_step_rlvr(service: Any, folder: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Sample ``rl_prompts`` x ``GROUP`` completions, build datums, forward_backward, optim_step; the 2nd step timed."""
    from rlvr import types

    tc = service.create_lora_training_client(base_model=folder, rank=LORA_RANK, seed=0, train_unembed=False)
    prompts = prompts_for(args.rl_prompts, PROMPT_TOKENS, seed=7)
    params = types.SamplingParams(max_tokens=args.rl_tokens, temperature=1.0, stop=[])
    seconds, tokens = [], 0
    for step in range(2):
        synchronize(device)
        start = time.perf_counter()
        sampler = tc.save_weights_and_get_sampling_client()
        futures = [sampler.sample(types.ModelInput.from_ints(p), GROUP, params.model_copy(update={"seed": step}))
                   for p in prompts]
        data = []
        for p, future in zip(prompts, futures, strict=True):
            sequences = future.result().sequences
            rewards = [sum(t % 2 for t in s.tokens) / len(s.tokens) for s in sequences]  # any reward will do
            mean = sum(rewards) / len(rewards)
            for seq, r in zip(sequences, rewards, strict=True):
                tokens_ = p + seq.tokens
                n = len(p) - 1
                data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens_[:-1]), loss_fn_inputs={
                    "target_tokens": tokens_[1:], "logprobs": [0.0] * n + list(seq.logprobs),
                    "advantages": [0.0] * n + [r - mean] * len(seq.tokens)}))
        tc.forward_backward(data, "importance_sampling")
        tc.optim_step(types.AdamParams(learning_rate=1e-5)).result()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
        tokens = sum(len(d.model_input.to_ints()) for d in data)
    return {"seconds": seconds[-1], "first_step_seconds": seconds[0], "trained_tokens": tokens}


def rl_step_trl(folder: str, args: argparse.Namespace, device: torch.device, out: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same folder and shapes (bf16, its generate path); the 2nd of 2 steps timed."""
    try:
        import trl  # noqa: F401
    except ImportError:
        return {"skipped": "trl is not importable (pip install 'rlvr[bench]')"}
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    texts = [tokenizer.decode(p) for p in prompts_for(args.rl_prompts, PROMPT_TOKENS, seed=7)]
    steps: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            synchronize(device)
            self.started = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            synchronize(device)
            steps.append(time.perf_counter() - self.started)

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [sum(ord(c) % 2 for c in text) / max(1, len(text)) for text in completions]

    config = GRPOConfig(
        output_dir=str(out / "trl"), max_steps=2, seed=0, per_device_train_batch_size=args.rl_prompts * GROUP,
        gradient_accumulation_steps=1, num_generations=GROUP, num_iterations=1, max_completion_length=args.rl_tokens,
        temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, beta=0.0, loss_type="dr_grpo", scale_rewards="none",
        learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
        bf16=device.type == "cuda", use_cpu=device.type == "cpu", gradient_checkpointing=False,
        disable_dropout=True, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                          train_dataset=Dataset.from_list([{"prompt": t} for t in texts]), processing_class=tokenizer,
                          peft_config=LoraConfig(r=LORA_RANK, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules=lora_targets(False)),
                          callbacks=[StepTimer()])
    trainer.train()
    del trainer, model
    return {"seconds": steps[-1], "first_step_seconds": steps[0]}


def measure_rl_step(service: Any, folder: str, shape: dict, bounds: dict, args: argparse.Namespace,
                    device: torch.device, out: Path) -> dict[str, Any]:
    ours = out_of_time(args) or guarded(lambda: rl_step_rlvr(service, folder, args, device))
    rows = args.rl_prompts * GROUP
    trained = rows * (PROMPT_TOKENS - 1 + args.rl_tokens)  # the datums' tokens when no row stops early
    floor = (rows * args.rl_tokens / decode_bound(shape, bounds, rows, PROMPT_TOKENS, args.rl_tokens)
             + ours.get("trained_tokens", trained) / train_bound(shape, bounds))
    ours["fraction_of_bound"] = floor / ours.get("seconds", math.nan)
    theirs = skipped(args, "trl") or guarded(lambda: rl_step_trl(folder, args, device, out))
    result = {"rlvr": ours, "trl": theirs, "bound_seconds": floor}
    if "seconds" in theirs and "seconds" in ours:
        result["ratio_to_trl"] = theirs["seconds"] / ours["seconds"]
    trl_text = f"{theirs['seconds']:.2f} s" if "seconds" in theirs else theirs.get("error") or theirs.get("skipped")
    rlvr_text = f"{ours['seconds']:.2f} s" if "seconds" in ours else ours.get("error") or ours.get("skipped")
    print(f"  RL step ({rows} completions x {args.rl_tokens} tokens) | rlvr {rlvr_text} "
          f"({ours['fraction_of_bound']:.2f} of bound {floor:.2f} s) | TRL {trl_text}", flush=True)
    return result


# -- driver -----------------------------------------------------------------------------------------------------------

def measure_model(name: str, config: Any, bounds: dict, args: argparse.Namespace, device: torch.device,
                  work: Path) -> dict[str, Any]:
    import rlvr
    from rlvr.engine import Engine
    from rlvr.engine.device import GpuPaths
    from rlvr.engine.models.load import load_base_model
    from rlvr.engine.models.random_models import write_model_folder

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    folder = str(write_model_folder(config, work / name, seed=0, dtype=dtype, device=device))
    shape = shape_of(config, torch.finfo(dtype).bits // 8)
    rows = decode_rows(shape, bounds, PROMPT_TOKENS, args.max_tokens, max(args.sizes))
    paths = GpuPaths(row_tokens=min(4096, args.microbatch_tokens)) if device.type == "cpu" else None
    engine = Engine(device=device, gpu_paths=paths, max_tokens_per_microbatch=args.microbatch_tokens,
                    max_sample_rows=rows)
    service = rlvr.ServiceClient(engine)
    reference = load_base_model(folder, device, dtype).model  # the baselines' own copy, transformers' defaults
    print(f"\n{name}: {shape['linear_params'] / 1e9:.2f}B multiply-adds per token, vocabulary {config.vocab_size}; "
          f"rlvr and generate decode up to {rows} rows at once", flush=True)
    record = {"config": config.to_dict(), "shape": shape, "decode_rows": rows,
              "sampling": measure_sampling(service, folder, reference, shape, bounds, args, device, rows),
              "training": measure_training(service, folder, reference, shape, bounds, args, device),
              "rl_step": measure_rl_step(service, folder, shape, bounds, args, device, work)}
    if args.profile and not out_of_time(args):
        guarded(lambda service=service: profile(service, folder, args, device, rows))
    engine._executor.shutdown(wait=True)
    engine._hosts.clear()
    del engine, service, reference
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from rlvr.engine.models.random_models import REAL_SHAPES, real_config, small_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b,qwen3-4b", help=f"of {sorted(REAL_SHAPES)}")
    parser.add_argument("--sizes", default="64,256,1024", help="sequence counts (groups of 8 per prompt)")
    parser.add_argument("--max-tokens", type=positive_int, default=512, help="new tokens per sequence")
    parser.add_argument("--train-sequences", type=positive_int, default=64, help="datums per training batch")
    parser.add_argument("--train-length", type=positive_int, default=512, help="tokens per datum")
    parser.add_argument("--train-batches", type=positive_int, default=4, help="timed forward_backward calls")
    parser.add_argument("--microbatch-tokens", type=positive_int, default=8192, help="rlvr's and the loop's budget")
    parser.add_argument("--rl-prompts", type=positive_int, default=8, help="prompts per RL step (x 8 completions)")
    parser.add_argument("--rl-tokens", type=positive_int, default=256, help="new tokens per completion in the RL step")
    parser.add_argument("--json", help="write the results here (default: bench/results/gpu-<date>-<gpu>.json)")
    parser.add_argument("--skip", default="", help=f"baselines to leave out, of {list(BASELINES)}")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: check the code paths")
    parser.add_argument("--profile", action="store_true", help="print the kernels that take the most time in one "
                        "sampling and one forward_backward call, after each model's measurements")
    parser.add_argument("--budget", type=float, help="seconds: measurements not started by then are skipped, and "
                        "the JSON (written after each model) keeps what was measured")
    args = parser.parse_args(argv)
    args.deadline = None if args.budget is None else time.monotonic() + args.budget
    args.skip = [s for s in args.skip.split(",") if s]
    if unknown := sorted(set(args.skip) - set(BASELINES)):
        parser.error(f"--skip {unknown}: choose from {list(BASELINES)}")
    if args.smoke:
        args.sizes, args.max_tokens, args.train_sequences, args.train_length = "8,16", 4, 8, 24
        args.train_batches, args.microbatch_tokens, args.rl_prompts, args.rl_tokens = 1, 128, 1, 4
        device = torch.device("cpu")
        configs = {"llama-small": small_config("llama"), "qwen3-small": small_config("qwen3")}
    else:
        if not torch.cuda.is_available():
            parser.exit(2, "bench/gpu.py measures a CUDA GPU, and torch sees none here (torch "
                           f"{torch.__version__}). Run it on a machine with an NVIDIA GPU and a CUDA build of torch, "
                           "or pass --smoke to check its code paths on this CPU.\n")
        device = torch.device("cuda", torch.cuda.current_device())
        names = args.models.split(",")
        unknown = [n for n in names if n not in REAL_SHAPES]
        if unknown:
            parser.error(f"--models {unknown}: choose from {sorted(REAL_SHAPES)}")
        configs = {name: real_config(name) for name in names}
    try:
        args.sizes = sorted({positive_int(s) for s in str(args.sizes).split(",")})
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--sizes: {exc}")
    bounds = gpu_bounds(device, args.smoke)
    print(f"{bounds['name']}: matmul {bounds['matmul_flops'] / 1e12:.1f} TFLOP/s ({bounds['matmul_dtype']}), memory "
          f"{bounds['memory_bandwidth'] / 1e9:.0f} GB/s", flush=True)
    record: dict[str, Any] = {"gpu": bounds, "machine": machine(), "smoke": args.smoke,
                              "settings": {k: v for k, v in vars(args).items() if k != "json"}, "models": {}}
    record["settings"].pop("deadline")
    target = args.json or (None if args.smoke else
                           RESULTS / f"gpu-{today()}-{re.sub(r'[^a-z0-9]+', '-', bounds['name'].lower()).strip('-')}"
                                     f".json")
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-gpu-") as work:
        for name, config in configs.items():
            if late := out_of_time(args):
                record["models"][name] = late
                continue
            record["models"][name] = guarded(
                lambda name=name, config=config: measure_model(name, config, bounds, args, device, Path(work)))
            if target:  # after each model, so a run stopped later keeps what it measured
                write_json(target, record)
    if target:
        print(f"\nwrote {target}")
    return record


if __name__ == "__main__":
    main()
