"""The GPU decode step (``rlvr.engine.gpu.decode``, Triton kernels) against Hugging Face's forward, one step at a time.

On a model of the Qwen2.5-0.5B shape (random weights, bfloat16, on the GPU; no download), for each of ``--rows``
rows (64 and 1024) each continuing its own ``--prompt``-token prompt: milliseconds per decode step and tokens/s of

- ``hf_eager``: the model's forward over the sampler's cache (``GrowingCache``), one token per row;
- ``hf_graph``: the same step as the device sampler runs it today (``device_sampler._FixedStep``, a CUDA graph);
- ``rlvr_eager``: ``GpuDecoder.step`` on the Triton kernels;
- ``rlvr_graph``: that step captured as one CUDA graph and replayed;

and how far the decoder's first-step logits are from the forward's (``max_logit_diff``, bfloat16 rounding). Each
variant starts from its own prefill of the same prompts, is warmed up, then timed over ``--steps`` steps between
CUDA events.

    python bench/gpu_decode.py [--rows 64,1024] [--steps 32] [--json PATH]
    python bench/gpu_decode.py --smoke     # the CPU dry run: every code path on a tiny shape, reference kernels

Not here: the sampler's end-to-end benchmark (``bench/gpu.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

PROMPT = 128
WARMUP = 2


def build_model(smoke: bool, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from rlvr.engine.models.random_models import real_config, small_config

    config = small_config("qwen2") if smoke else real_config("qwen2.5-0.5b")
    dtype = torch.float32 if smoke else torch.bfloat16
    with torch.random.fork_rng(devices=[]), device:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def timed(device: torch.device, steps: int, one_step: Callable[[int], Any]) -> float:
    """Seconds for ``steps`` calls of ``one_step(i)`` after ``WARMUP`` untimed ones."""
    for i in range(WARMUP):
        one_step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(steps):
            one_step(WARMUP + i)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000
    began = time.perf_counter()
    for i in range(steps):
        one_step(WARMUP + i)
    return time.perf_counter() - began


@torch.inference_mode()
def measure(model: torch.nn.Module, rows: int, steps: int, prompt: int, device: torch.device, kernels: Any
            ) -> dict[str, Any]:
    from rlvr.engine.gpu.decode import GpuDecoder
    from rlvr.engine.gpu.device_sampler import _FixedStep
    from rlvr.engine.sample.kv_cache import cache_kwargs
    from rlvr.engine.sample.sampler import prefill

    vocab = model.config.vocab_size
    prompts = torch.randint(3, min(vocab, 256), (rows, prompt), generator=torch.Generator().manual_seed(rows))
    capacity = prompt + WARMUP + steps + 1
    tokens = torch.randint(3, min(vocab, 256), (rows,), generator=torch.Generator().manual_seed(1)).to(device)
    result: dict[str, Any] = {"rows": rows, "prompt": prompt, "steps": steps}

    def report(name: str, seconds: float) -> None:
        result[name] = {"ms_per_step": 1000 * seconds / steps, "tokens_per_s": rows * steps / seconds}
        print(f"  {rows:>5} rows | {name:<10} {1000 * seconds / steps:8.2f} ms/step "
              f"{rows * steps / seconds:10.0f} tok/s", flush=True)

    # Hugging Face's forward, eagerly
    cache, mask, _ = prefill(model, prompts.tolist(), 0, capacity)
    full = torch.ones((rows, capacity), dtype=torch.long, device=device)

    def hf_step(i: int) -> torch.Tensor:
        with torch.inference_mode():
            out = model(input_ids=tokens[:, None], attention_mask=full[:, : prompt + i + 1],
                        position_ids=torch.full((rows, 1), prompt + i, device=device), **cache_kwargs(cache))
        return out.logits[:, -1].float()

    first_hf = hf_step(0)
    cache, mask, _ = prefill(model, prompts.tolist(), 0, capacity)
    report("hf_eager", timed(device, steps, hf_step))

    # the device sampler's step today: the same forward on fixed buffers, a CUDA graph on CUDA
    cache, mask, _ = prefill(model, prompts.tolist(), 0, capacity)
    fixed_mask = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
    fixed_mask[:, :prompt] = mask.bool()
    fixed = _FixedStep(model, cache, fixed_mask, capture=device.type == "cuda")
    positions = torch.full((rows,), prompt, device=device)
    report("hf_graph", timed(device, steps, lambda i: fixed(tokens, positions + i, prompt + i)))

    # rlvr's decode step, eagerly
    cache, mask, _ = prefill(model, prompts.tolist(), 0, capacity)
    decoder = GpuDecoder.build(model, kernels)
    decoder.start([(layer.keys, layer.values) for layer in cache.layers], mask, capacity)
    first = decoder.step(tokens, positions)
    result["max_logit_diff"] = float((first - first_hf).abs().max())
    print(f"  {rows:>5} rows | first step's logits within {result['max_logit_diff']:.4f} of the forward's",
          flush=True)
    decoder.lengths.fill_(prompt)
    report("rlvr_eager", timed(device, steps, lambda i: decoder.step(tokens, positions + i)))

    # rlvr's decode step as one CUDA graph
    if device.type == "cuda":
        decoder.lengths.fill_(prompt)
        static_positions = positions.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            decoder.step(tokens, static_positions)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        decoder.lengths.fill_(prompt)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decoder.step(tokens, static_positions)

        def replay(i: int) -> None:
            static_positions.fill_(prompt + i)
            graph.replay()

        report("rlvr_graph", timed(device, steps, replay))
    for name in ("rlvr_eager", "rlvr_graph"):
        if name in result:
            result[f"{name}_speedup_over_hf_graph"] = result["hf_graph"]["ms_per_step"] / result[name]["ms_per_step"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,1024", help="batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per variant")
    parser.add_argument("--json", default="", help="write the results here")
    parser.add_argument("--smoke", action="store_true", help="the CPU dry run: tiny shape, reference kernels")
    args = parser.parse_args(argv)
    from rlvr.engine.gpu import kernels

    if args.smoke:
        device, chosen, rows, steps, prompt = torch.device("cpu"), kernels.REFERENCE, [4], 2, 8
    else:
        if not torch.cuda.is_available():
            print("bench/gpu_decode.py measures a GPU and torch sees none here; pass --smoke for the CPU dry run",
                  file=sys.stderr)
            return 2
        device, chosen, steps, prompt = torch.device("cuda"), kernels.triton_kernels(), args.steps, PROMPT
        rows = [int(r) for r in args.rows.split(",")]
    model = build_model(args.smoke, device)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                               "kernels": chosen.name, "shape": "small qwen2" if args.smoke else "qwen2.5-0.5b",
                               "sizes": []}
    for r in rows:
        try:
            results["sizes"].append(measure(model, r, steps, prompt, device, chosen))
        except Exception as exc:  # a size that fails is a result; the next one still runs
            print(f"  {r:>5} rows | failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            results["sizes"].append({"rows": r, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if all("error" not in s for s in results["sizes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
