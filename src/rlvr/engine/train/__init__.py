"""The trainer: datums checked against a loss (``batch.py``), the loss table (``losses.py``), AdamW (``optim.py``),
the CPU trainer's forward with shared prompts (``prefix.py``) and chunked target logprobs (``logprobs.py``).

Not here: the GPU paths' forward (``gpu/packing.py``), the order of requests (``engine.py``).
"""
