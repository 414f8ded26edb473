"""GrowingCache gives the same logits as Hugging Face's DynamicCache, through growth, row selection and repeats."""

import warnings

import torch
from transformers import DynamicCache

from rlvr.engine.models.tiny import build_tiny_model
from rlvr.engine.sample.kv_cache import MIN_CAPACITY, GrowingCache, cache_kwargs, returned_cache


@torch.inference_mode()
def test_growing_cache_matches_dynamic_cache():
    model, _ = build_tiny_model()
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    outs = []
    for cache in (DynamicCache(), GrowingCache()):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # a deprecated keyword would be a warning, then an error
            out = model(input_ids=prompt, **cache_kwargs(cache))
        assert returned_cache(out) is cache
        cache.batch_select_indices(torch.tensor([0, 0, 1]))  # repeat row 0 (two samples of one prompt)
        logits = [out.logits[[0, 0, 1], -1]]
        token = torch.tensor([[3], [4], [5]])
        for step in range(MIN_CAPACITY + 10):  # past the first capacity, so the buffer must grow
            if step == 20:
                cache.batch_select_indices(torch.tensor([0, 2]))  # a row finished
                token = token[[0, 2]]
            out = model(input_ids=token, **cache_kwargs(cache))
            logits.append(out.logits[:, -1])
            token = out.logits[:, -1:].argmax(-1)
        assert cache.get_seq_length() == 4 + MIN_CAPACITY + 10
        outs.append(logits)
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b)
