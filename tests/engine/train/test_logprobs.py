import pytest
import torch

from rlvr.engine.train.logprobs import target_logprobs


def _frozen_head(vocab: int, hidden: int, bias: bool) -> torch.nn.Linear:
    torch.manual_seed(4)
    head = torch.nn.Linear(hidden, vocab, bias=bias)
    head.requires_grad_(False)
    return head


@pytest.mark.parametrize("chunk", [1, 7, 50, 1000])
@pytest.mark.parametrize("k", [None, 3])  # one target a row, or three (top-K distillation; a repeat among them)
@pytest.mark.parametrize("bias", [False, True])
def test_a_frozen_heads_logprobs_and_hidden_gradient_are_the_log_softmax_by_hand(chunk, k, bias):
    g = torch.Generator().manual_seed(1)
    head = _frozen_head(vocab=301, hidden=24, bias=bias)
    hidden = torch.randn(50, 24, generator=g, requires_grad=True)
    shape = (50,) if k is None else (50, k)
    targets = torch.randint(0, 301, shape, generator=g)
    if k is not None:
        targets[:, 2] = targets[:, 0]
    weights = torch.randn(shape, generator=g)

    # By hand: log p_t = z_t - log sum_v exp z_v, z = W h + b; d log p_t / d h = W_t - sum_v p_v W_v.
    z = hidden.detach() @ head.weight.T + (head.bias if bias else 0)  # (50, V)
    lse = torch.log(torch.exp(z - z.max(-1, keepdim=True).values).sum(-1)) + z.max(-1).values
    wanted = targets.reshape(50, -1)
    logp = z.gather(-1, wanted) - lse[:, None]  # (50, K)
    probs = torch.softmax(z, -1)
    w = weights.reshape(50, -1)
    by_hand = (w[:, :, None] * head.weight[wanted]).sum(1) - w.sum(-1, keepdim=True) * (probs @ head.weight)

    got = target_logprobs(hidden, head, targets, chunk)
    torch.testing.assert_close(got, logp.reshape(shape), atol=1e-5, rtol=1e-5)
    (weights * got).sum().backward()
    torch.testing.assert_close(hidden.grad, by_hand, atol=1e-5, rtol=1e-4)


def test_a_frozen_head_keeps_one_hidden_sized_row_per_token_for_the_backward():
    head = _frozen_head(vocab=1000, hidden=16, bias=False)
    hidden = torch.randn(64, 16, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))
    sizes = [0]

    def pack(t):
        if t is not head.weight:
            sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        target_logprobs(hidden, head, targets, 16)
    assert max(sizes) <= 64 * 16
