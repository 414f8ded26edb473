"""Sampling's optional scores (top-k prompt and sample logprobs, target prompt logprobs, prompt alternatives, last-N
prompt logprobs) against the model's full-vocabulary log-softmax computed here by hand."""

import math

import numpy as np
import pytest
import torch

from rlvr import types
from rlvr.errors import ContextFullError, InvalidDatumError, SamplingError

PROMPT = [5, 17, 42, 8, 99, 3]
PARAMS = types.SamplingParams(max_tokens=4, temperature=1.0, seed=11)


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_sampling_client(base_model="tiny")


def _log_softmax(sampler, tokens):
    """(len(tokens) - 1, V): row i is log p(. | tokens[:i + 1]), straight from the model's logits."""
    host = sampler._handle.host
    with torch.no_grad(), host.active(sampler._handle.adapter) as model:
        return model(input_ids=torch.tensor([tokens[:-1]])).logits[0].float().log_softmax(-1)


def test_topk_prompt_logprobs_are_the_k_largest_entries_of_each_row(sampler):
    k = 4
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, PARAMS, include_prompt_logprobs=True,
                         topk_prompt_logprobs=k).result()
    full = _log_softmax(sampler, PROMPT)
    rows = out.topk_prompt_logprobs
    assert len(rows) == len(PROMPT) and rows[0] is None  # position 0 has no context
    for i, row in enumerate(rows[1:]):
        values, ids = full[i].topk(k)
        assert [t for t, _ in row] == ids.tolist()
        np.testing.assert_allclose([lp for _, lp in row], values.numpy(), atol=1e-5)
        # the prompt token's own logprob sits in the same distribution
        assert out.prompt_logprobs[i + 1] == pytest.approx(full[i, PROMPT[i + 1]].item(), abs=1e-5)


def test_prompt_logprobs_last_n_scores_only_the_suffix(sampler):
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, PARAMS, include_prompt_logprobs=True,
                         topk_prompt_logprobs=2, prompt_logprobs_last_n=2).result()
    full = _log_softmax(sampler, PROMPT)
    assert out.prompt_logprobs[:-2] == [None] * (len(PROMPT) - 2)
    assert out.prompt_logprobs[-2:] == pytest.approx([full[-2, PROMPT[-2]].item(), full[-1, PROMPT[-1]].item()],
                                                     abs=1e-5)
    assert out.topk_prompt_logprobs[:-2] == [None] * (len(PROMPT) - 2)
    assert [t for t, _ in out.topk_prompt_logprobs[-1]] == full[-1].topk(2).indices.tolist()


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_target_prompt_logprobs_score_the_named_ids(sampler, sparse):
    ids = torch.full((len(PROMPT) - 1, 3), -1, dtype=torch.int64)  # (T - 1, K), -1 = nothing
    ids[0, 0], ids[2, 1], ids[2, 2], ids[4, 0] = 7, 100, 0, PROMPT[5]
    request = types.TensorData.from_torch_sparse(ids, pad_value=-1) if sparse else types.TensorData.from_torch(ids)
    assert (request.sparse_crow_indices is not None) == sparse
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, PARAMS, target_prompt_logprobs=request).result()
    full = _log_softmax(sampler, PROMPT)
    got = out.target_prompt_logprobs
    assert (got.sparse_crow_indices is not None) == sparse  # answered in the request's layout
    want = torch.where(ids >= 0, full.gather(-1, ids.clamp(min=0)), torch.zeros(()))
    torch.testing.assert_close(got.to_torch(), want, atol=1e-5, rtol=1e-5)
    assert got.to_torch()[1].abs().sum() == 0  # an all -1 row gets zeros


def test_prompt_alt_tokens_are_draws_with_their_model_logprobs(sampler):
    k = 64
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, PARAMS, prompt_alt_tokens_k=k).result()
    full = _log_softmax(sampler, PROMPT)
    tokens, logprobs = out.prompt_alt_tokens.tokens.to_torch(), out.prompt_alt_tokens.logprobs.to_torch()
    assert tokens.shape == logprobs.shape == (len(PROMPT) - 1, k)
    torch.testing.assert_close(logprobs, full.gather(-1, tokens), atol=1e-5, rtol=1e-5)
    # 64 draws from the tiny model's near-uniform rows are not all one token; at temperature 0 they are the argmax
    assert all(len(set(row.tolist())) > 1 for row in tokens)
    greedy = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1, temperature=0),
                            prompt_alt_tokens_k=3).result().prompt_alt_tokens.tokens.to_torch()
    assert torch.equal(greedy, full.argmax(-1, keepdim=True).expand(-1, 3))


def test_topk_sample_logprobs_are_the_distribution_each_token_was_drawn_from(sampler):
    k = 3
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 2, PARAMS, topk_sample_logprobs=k).result()
    for seq in out.sequences:
        full = _log_softmax(sampler, PROMPT + seq.tokens)[len(PROMPT) - 1:]  # (n, V): row j drew seq.tokens[j]
        assert len(seq.topk_logprobs) == len(seq.tokens)
        for j, row in enumerate(seq.topk_logprobs):
            values, ids = full[j].topk(k)
            assert [t for t, _ in row] == ids.tolist()
            np.testing.assert_allclose([lp for _, lp in row], values.numpy(), atol=1e-5)
            assert seq.logprobs[j] == pytest.approx(full[j, seq.tokens[j]].item(), abs=1e-4)


def test_bad_score_arguments_are_refused_by_name(sampler):
    prompt = types.ModelInput.from_ints(PROMPT)
    cases = [
        ({"prompt_logprobs_last_n": 2}, "needs include_prompt_logprobs=True"),
        ({"include_prompt_logprobs": True, "prompt_logprobs_last_n": 6}, r"between 1 and len\(prompt\) - 1 = 5"),
        ({"topk_prompt_logprobs": -1}, r"topk_prompt_logprobs=-1 must be an integer in \[0, "),
        ({"target_prompt_logprobs": types.TensorData.from_torch(torch.zeros(3, 2, dtype=torch.int64))},
         r"shape \(3, 2\); it must be \(len\(prompt\) - 1, K\) = \(5, K\)"),
        ({"target_prompt_logprobs": types.TensorData.from_torch(torch.full((5, 1), -1, dtype=torch.int64))},
         "names no token id"),
    ]
    for kwargs, message in cases:
        with pytest.raises(SamplingError, match=message):
            sampler.sample(prompt, 1, PARAMS, **kwargs).result()
    assert math.isfinite(sampler.sample(prompt, 1, PARAMS).result().sequences[0].logprobs[0])


def _greedy_run(sampler, start: list[int], n: int) -> list[int]:
    """``start`` followed by n tokens, each the argmax after what precedes it (by the model's logits)."""
    tokens = list(start)
    for _ in range(n):
        tokens.append(int(_log_softmax(sampler, [*tokens, 0])[-1].argmax()))
    return tokens


def test_compute_topk_logprobs_ranks_the_k_largest_and_scores_them_as_compute_logprobs(sampler):
    k = 4
    tokens = [*PROMPT, *_greedy_run(sampler, PROMPT, 3)[len(PROMPT):]]  # the last three are each position's argmax
    prompt = types.ModelInput.from_ints(tokens)
    out = sampler.compute_topk_logprobs(prompt, k).result()
    assert out.logprobs == sampler.compute_logprobs(prompt).result()  # the same forward's numbers, to the bit
    full = _log_softmax(sampler, tokens)
    assert len(out.topk) == len(tokens) and out.topk[0] is None
    for i, row in enumerate(out.topk[1:]):
        values, ids = full[i].topk(k)
        assert [t for t, _ in row] == ids.tolist()
        np.testing.assert_allclose([lp for _, lp in row], values.numpy(), atol=1e-5)
        assert [lp for _, lp in row] == sorted((lp for _, lp in row), reverse=True)
        if tokens[i + 1] in dict(row):  # the prompt's token among them carries exactly its logprob
            assert dict(row)[tokens[i + 1]] == out.logprobs[i + 1]
    assert all(max(lp for _, lp in out.topk[i]) == out.logprobs[i] for i in range(len(PROMPT), len(tokens)))


def test_compute_topk_logprobs_edges_and_refusals(sampler):
    none = sampler.compute_topk_logprobs(types.ModelInput.from_ints(PROMPT), 0).result()
    assert none.topk == [None] + [[]] * (len(PROMPT) - 1)
    assert none.logprobs == sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    one = sampler.compute_topk_logprobs(types.ModelInput.from_ints([7]), 3).result()
    assert one.logprobs == [None] and one.topk == [None]
    with pytest.raises(SamplingError, match=r"k=-1 must be an integer in \[0, "):
        sampler.compute_topk_logprobs(types.ModelInput.from_ints(PROMPT), -1).result()
    with pytest.raises(InvalidDatumError, match="outside the vocabulary"):
        sampler.compute_topk_logprobs(types.ModelInput.from_ints([5, 10**6]), 2).result()
    with pytest.raises(ContextFullError, match="more than the model's context"):
        sampler.compute_topk_logprobs(types.ModelInput.from_ints([5] * 9000), 2).result()
