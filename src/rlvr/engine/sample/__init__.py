"""The sampler: jobs, the token choice and draw, prefill and the CPU sampling loop (``sampler.py``), the KV cache
that grows in place (``kv_cache.py``) and the scores a request may ask for (``scores.py``).

Not here: the CPU decode step (``cpu/decode.py``), the GPU paths' sampler (``gpu/device_sampler.py``), the batching
of requests (``engine/sample_queue.py``).
"""
