"""Shared-prefix training forward: the clusters it plans, and logprobs and gradients equal to one plain forward per
datum (no cache, no padding), which is the definition of the trainer's logprobs."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rlvr.engine.models.tiny import build_tiny_model
from rlvr.engine.train import prefix
from rlvr.engine.train.prefix import MIN_SHARED, cluster_logprobs, find_clusters, plan

SYSTEM = list(range(10, 40))  # 30 tokens every prompt starts with, as a chat template's system turn


def test_a_group_shares_its_prompt_even_when_answers_begin_alike():
    prompt = SYSTEM + [50, 51, 52]
    answers = [[7, 8, 9], [7, 8, 5], [7, 1], [3, 3, 3, 3]]  # two answers share 2 more tokens
    clusters = find_clusters([prompt + a for a in answers])
    assert [(sorted(c.rows), c.shared) for c in clusters] == [([0, 1, 2, 3], len(prompt))]


def test_groups_with_a_common_system_turn_stay_separate():
    a, b = SYSTEM + [60] * 20, SYSTEM + [61] * 20  # two problems: 30 common tokens, 50 each
    sequences = [a + [i] for i in range(4)] + [b + [i] for i in range(4)]
    clusters = find_clusters(sequences)
    assert sorted((sorted(c.rows), c.shared) for c in clusters) == [([0, 1, 2, 3], 50), ([4, 5, 6, 7], 50)]


def test_unrelated_datums_are_clusters_of_one_holding_the_whole_sequence():
    sequences = [[1, 2, 3, 4, 5], [1, 2, 9], [6, 6, 6, 6, 6, 6]]  # [1,2] in common is below MIN_SHARED
    assert MIN_SHARED > 2
    clusters = find_clusters(sequences)
    assert sorted((c.rows, c.shared) for c in clusters) == [((0,), 5), ((1,), 3), ((2,), 6)]


def test_a_datum_that_is_a_prefix_of_another_is_all_prefix():
    short, long = SYSTEM[:6], SYSTEM[:6] + [1, 2, 3]
    clusters = find_clusters([long, short, long + [4]])
    assert len(clusters) == 1 and clusters[0].shared == 6


def test_plan_covers_every_row_once_within_the_token_budget():
    prompt = SYSTEM + [70] * 10
    sequences = [prompt + [i] * (5 + i % 7) for i in range(40)] + [[200 + i] * (3 + i) for i in range(6)]
    batches = plan(sequences, max_tokens=256)
    rows = [r for batch in batches for c in batch for r in c.rows]
    assert sorted(rows) == list(range(len(sequences)))
    for batch in batches:
        width = max(c.shared for c in batch)
        tail = max(len(sequences[r]) - c.shared for c in batch for r in c.rows)
        assert len(batch) * width + sum(len(c.rows) for c in batch) * tail <= 256 or sum(
            len(c.rows) for c in batch) == 1
    assert len(batches) > 1  # the 40-row group did not fit one microbatch: split, prefix recomputed


@pytest.fixture(scope="module", params=["lora_head", "frozen_head"])
def model(request):
    """tiny with LoRA, on the output layer too or not (``train_unembed=False``: the frozen head's own backward)."""
    base, tokenizer = build_tiny_model()
    torch.manual_seed(0)
    head = ["lm_head"] if request.param == "lora_head" else []
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj", *head],
                        init_lora_weights=False)
    return get_peft_model(base, config), tokenizer.pad_token_id


def _plain(model, ids: list[int], targets: list[int]) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (T, V)
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(targets)]


def _lora_grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def chunked(monkeypatch, rows: int = 5) -> None:
    """Every forward's logits over the size limit: the output layer runs on target positions, ``rows`` at a time."""
    monkeypatch.setattr(prefix, "LOGITS_MAX_BYTES", 0)
    monkeypatch.setattr(prefix, "CHUNK_VALUES", rows * 259)  # tiny's vocabulary


@pytest.mark.parametrize("logits", ["whole", "chunked"])
@pytest.mark.parametrize(("max_tokens", "min_bucket"), [(64, 512), (4096, 512), (4096, 1)])
def test_logprobs_and_gradients_equal_one_forward_per_datum(model, max_tokens, min_bucket, logits, monkeypatch):
    """Several microbatches; all clusters in one; and the rests of the rows in several suffix forwards; the logits
    whole, or only at target positions in chunks of 5 rows, recomputed in the backward pass (the LoRA on the output
    layer gets its gradient through the recomputation)."""
    monkeypatch.setattr(prefix, "MIN_BUCKET", min_bucket)
    if logits == "chunked":
        chunked(monkeypatch)
    model, pad_id = model
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (12, 9)]
    sequences = [prompts[0] + torch.randint(3, 200, (n,), generator=g).tolist() for n in (1, 5, 8, 3)]
    sequences += [prompts[1] + torch.randint(3, 200, (n,), generator=g).tolist() for n in (6, 2)]
    sequences += [prompts[1][:7], torch.randint(3, 200, (11,), generator=g).tolist()]  # all-prefix row; a single
    targets = [torch.randint(3, 200, (len(s),), generator=g).tolist() for s in sequences]
    weights = [torch.rand(len(s), generator=g) for s in sequences]

    expected = [_plain(model, s, t) for s, t in zip(sequences, targets, strict=True)]
    torch.stack([(w * e).sum() for w, e in zip(weights, expected, strict=True)]).sum().backward()
    expected_grads = _lora_grads(model)

    batches = plan(sequences, max_tokens=max_tokens)
    assert any(len(c.rows) > 1 for batch in batches for c in batch)  # sharing happened
    assert (len(batches) == 1) == (max_tokens == 4096)
    rests = [len(sequences[r]) - c.shared for batch in batches for c in batch for r in c.rows]
    if min_bucket == 1:
        assert len(prefix._buckets([j for j, n in enumerate(rests) if n], rests)) > 2
    got: dict[int, torch.Tensor] = {}
    for batch in batches:
        got.update(cluster_logprobs(model, [torch.tensor(s) for s in sequences],
                                    [torch.tensor(t) for t in targets], batch, pad_id))
    assert sorted(got) == list(range(len(sequences)))
    for i, e in enumerate(expected):
        torch.testing.assert_close(got[i], e.detach(), atol=1e-5, rtol=1e-5)
    torch.stack([(weights[i] * got[i]).sum() for i in range(len(sequences))]).sum().backward()
    grads = _lora_grads(model)
    assert grads.keys() == expected_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=3e-5, rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="the run-to-run difference needs two threads to show")
@pytest.mark.parametrize("logits", ["whole", "chunked"])
def test_a_group_gives_the_same_gradients_bit_for_bit_every_time(model, logits, monkeypatch):
    """16 answers to a 160-token prompt: the prompt's keys and values, which every answer reads, and the prompt's
    logprobs, which every answer's datum holds, recur 16 times. Their gradients must be summed in the same order on
    every run (advanced indexing summed them with parallel atomic adds once 32k elements were scattered, here 16 x 2
    heads x 160 x 24, and two runs in one process differed in the last bits: issue 34's cross-process drift)."""
    if logits == "chunked":
        chunked(monkeypatch, rows=64)
    model, pad_id = model
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 200, (160,), generator=g).tolist()
    sequences = [prompt + torch.randint(3, 200, (4,), generator=g).tolist() for _ in range(16)]
    targets = [torch.randint(3, 200, (len(s),), generator=g).tolist() for s in sequences]
    weights = [torch.randn(len(s), generator=g) for s in sequences]
    runs = []
    for _ in range(6):
        got: dict[int, torch.Tensor] = {}
        for batch in plan(sequences, max_tokens=8192):
            got.update(cluster_logprobs(model, [torch.tensor(s) for s in sequences],
                                        [torch.tensor(t) for t in targets], batch, pad_id))
        torch.stack([(weights[i] * got[i]).sum() for i in range(len(sequences))]).sum().backward()
        runs.append(_lora_grads(model))
    for run in runs[1:]:
        assert run.keys() == runs[0].keys()
        differ = [name for name in run if not torch.equal(run[name], runs[0][name])]
        assert not differ, f"gradients differ between two runs of one batch: {differ}"
