"""Logprobs of target tokens a chunk of rows at a time (``train.logprobs.target_logprobs``): equal to the full
log-softmax in values and gradients, for an output layer with a LoRA-style update (recomputed in the backward pass)
and for a frozen one (its own backward), without keeping a tokens x vocabulary tensor for the backward pass."""

import pytest
import torch

from rlvr.engine.train.logprobs import target_logprobs


def _lora_head(vocab: int, hidden: int, seed: int) -> torch.nn.Module:
    """An output layer with a frozen base weight and a trainable LoRA-style update, as peft makes lm_head."""
    g = torch.Generator().manual_seed(seed)
    base = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    base.weight.copy_(torch.randn(vocab, hidden, generator=g))
    low = torch.nn.Parameter(torch.randn(4, hidden, generator=g) * 0.1)
    up = torch.nn.Parameter(torch.randn(vocab, 4, generator=g) * 0.1)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base, self.low, self.up = base, low, up

        def forward(self, x):
            return self.base(x) + (x @ self.low.t()) @ self.up.t()

    return Head()


def _frozen_head(vocab: int, hidden: int, bias: bool) -> torch.nn.Linear:
    torch.manual_seed(4)
    head = torch.nn.Linear(hidden, vocab, bias=bias)
    head.requires_grad_(False)
    return head


def _inputs(k: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """50 hidden states (H = 24), their targets in a 301-token vocabulary ((50,), or (50, k) with a repeat) and a
    weight per target."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(50, 24, generator=g, requires_grad=True)
    shape = (50,) if k is None else (50, k)
    targets = torch.randint(0, 301, shape, generator=g)
    if k is not None:
        targets[:, 2] = targets[:, 0]
    return hidden, targets, torch.randn(shape, generator=g)


def _largest_saved(fn, ignore: torch.Tensor | None = None) -> int:
    """The most elements of one tensor autograd keeps for the backward pass while ``fn`` runs (``ignore`` left out)."""
    sizes = [0]

    def pack(t):
        if t is not ignore:
            sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


CHUNKS = pytest.mark.parametrize("chunk", [1, 7, 50, 1000])
TARGETS = pytest.mark.parametrize("k", [None, 3])  # one target a row, or three (top-K; a repeat among them)


@CHUNKS
@TARGETS
def test_chunked_logprobs_equal_the_full_log_softmax_values_and_gradients(chunk, k):
    head = _lora_head(vocab=301, hidden=24, seed=2)
    hidden, targets, weights = _inputs(k)

    rows = torch.arange(50) if k is None else torch.arange(50)[:, None]
    full = torch.log_softmax(head(hidden), -1)[rows, targets]  # the definition
    (weights * full).sum().backward()
    want = [hidden.grad.clone(), head.low.grad.clone(), head.up.grad.clone()]
    for t in (hidden, head.low, head.up):
        t.grad = None

    got = target_logprobs(hidden, head, targets, chunk)
    torch.testing.assert_close(got, full.detach(), atol=1e-5, rtol=1e-5)
    (weights * got).sum().backward()
    for grad, expected in zip([hidden.grad, head.low.grad, head.up.grad], want, strict=True):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-4)


def test_chunked_logprobs_keep_no_tokens_by_vocabulary_tensor():
    # What autograd keeps for the backward pass: with chunks, the inputs (N x hidden), never logits; the full
    # computation keeps N x vocabulary floats (the control: this check sees them).
    head = _lora_head(vocab=1000, hidden=16, seed=3)
    hidden = torch.randn(64, 16, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))

    assert _largest_saved(lambda: target_logprobs(hidden, head, targets, 16)) < 16 * 1000
    assert _largest_saved(lambda: torch.log_softmax(head(hidden), -1)[torch.arange(64), targets]) >= 64 * 1000


@CHUNKS
@TARGETS
@pytest.mark.parametrize("bias", [False, True])
def test_a_frozen_heads_logprobs_and_hidden_gradient_are_the_log_softmax_by_hand(chunk, k, bias):
    head = _frozen_head(vocab=301, hidden=24, bias=bias)
    hidden, targets, weights = _inputs(k)
    shape = targets.shape

    # By hand: log p_t = z_t - log sum_v exp z_v, z = W h + b; d log p_t / d h = W_t - sum_v p_v W_v.
    z = hidden.detach() @ head.weight.T + (head.bias if bias else 0)  # (50, V)
    lse = torch.log(torch.exp(z - z.max(-1, keepdim=True).values).sum(-1)) + z.max(-1).values
    wanted = targets.reshape(50, -1)
    logp = z.gather(-1, wanted) - lse[:, None]  # (50, K)
    probs = torch.softmax(z, -1)
    w = weights.reshape(50, -1)
    by_hand = (w[:, :, None] * head.weight[wanted]).sum(1) - w.sum(-1, keepdim=True) * (probs @ head.weight)

    got = target_logprobs(hidden, head, targets, chunk, cpu_paths=True)
    torch.testing.assert_close(got, logp.reshape(shape), atol=1e-5, rtol=1e-5)
    (weights * got).sum().backward()
    torch.testing.assert_close(hidden.grad, by_hand, atol=1e-5, rtol=1e-4)


def test_a_frozen_head_keeps_one_hidden_sized_row_per_token_for_the_backward():
    head = _frozen_head(vocab=1000, hidden=16, bias=False)
    hidden = torch.randn(64, 16, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))
    assert _largest_saved(lambda: target_logprobs(hidden, head, targets, 16, cpu_paths=True),
                          ignore=head.weight) <= 64 * 16


@pytest.mark.parametrize("k", [None, 3])
def test_a_frozen_bfloat16_heads_logprobs_and_gradient_are_the_log_softmax_of_its_bfloat16_product(k, bfloat16_kind):
    # A head that pack_frozen_linears runs in bfloat16 (precision="bfloat16"): its logits are the bfloat16 product
    # (oneDNN's rounds it to bfloat16, the AMX kernel's keeps its float32 sum), and the gradient's E = softmax @ W
    # runs on the same bfloat16 weights (its packed transpose).
    from rlvr.engine.cpu.packed import bfloat16_head, pack_frozen_linears

    head = _frozen_head(vocab=301, hidden=24, bias=False)
    assert pack_frozen_linears(torch.nn.Sequential(head), "bfloat16") == 1 and bfloat16_head(head)
    hidden, targets, weights = _inputs(k)
    hidden = (hidden.detach() * 8).requires_grad_()  # peaked softmaxes: E's term in the gradient is up to ~0.8
    shape = targets.shape

    w16 = head.weight.bfloat16().float()
    z = hidden.detach().bfloat16().double() @ w16.double().T  # (50, V): the product of the rounded operands
    z = (z.bfloat16() if bfloat16_kind == "bf16" else z).float()  # and its output, rounded as the kernel rounds it
    wanted = targets.reshape(50, -1)
    logp = z.gather(-1, wanted) - torch.logsumexp(z, -1, keepdim=True)
    w = weights.reshape(50, -1)
    by_hand = (w[:, :, None] * head.weight[wanted]).sum(1) - w.sum(-1, keepdim=True) * (torch.softmax(z, -1) @ w16)

    got = target_logprobs(hidden, head, targets, 16, cpu_paths=True)
    # oneDNN's: a few bfloat16 steps of a logit (its float32 sums round to bfloat16 apart); the AMX kernel: float32 sums
    torch.testing.assert_close(got, logp.reshape(shape), atol=5e-2 if bfloat16_kind == "bf16" else 1e-4, rtol=0)
    (weights * got).sum().backward()
    # within 3e-3 here (bfloat16 probabilities in E); 3% off in E would be 2.4e-2
    torch.testing.assert_close(hidden.grad, by_hand, atol=1e-2, rtol=0)


def _peft_head(vocab: int, hidden: int, precision: str | None) -> torch.nn.Module:
    """peft's LoRA layer over a frozen output layer, as the engine makes ``lm_head`` (``precision``: its base packed
    by ``pack_frozen_linears``, None: a plain ``nn.Linear``), with a non-zero B so that both factors matter."""
    from peft import LoraConfig, get_peft_model

    from rlvr.engine.cpu.packed import pack_frozen_linears

    torch.manual_seed(5)
    model = torch.nn.Sequential()
    model.add_module("lm_head", torch.nn.Linear(hidden, vocab, bias=False))
    model.requires_grad_(False)
    if precision is not None:
        pack_frozen_linears(model, precision)
    wrapped = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head"]))
    head = wrapped.base_model.model.lm_head
    with torch.no_grad():
        head.lora_B["default"].weight.normal_(0, 0.2)
    return head


def _peft_head_by_hand(head: torch.nn.Module, hidden: torch.Tensor, kind: str) -> torch.Tensor:
    """log_softmax(W h + s B A h), (50, V), differentiable in hidden, A and B (for a bfloat16 ``kind``, W and h
    rounded to bfloat16 as the packed product takes them, and the output rounded to bfloat16 too for "bf16")."""
    weight = head.base_layer.weight
    a, b, s = head.lora_A["default"].weight, head.lora_B["default"].weight, head.scaling["default"]
    if kind in ("bf16", "bf16x1"):
        base = hidden.bfloat16().float() @ weight.bfloat16().float().T
        base = base.bfloat16().float() if kind == "bf16" else base
    else:
        base = hidden @ weight.T
    return torch.log_softmax(base + s * (hidden @ a.T) @ b.T, -1)


@pytest.mark.parametrize("chunk", [1, 7, 50])
@TARGETS
@pytest.mark.parametrize("precision", [None, "float32"])
def test_a_lora_heads_logprobs_and_gradients_are_the_log_softmax_by_hand(chunk, k, precision):
    _check_lora_head(chunk, k, precision, "")


@pytest.mark.parametrize("chunk", [1, 50])
@TARGETS
def test_a_bfloat16_lora_heads_logprobs_and_gradients_are_the_log_softmax_by_hand(chunk, k, bfloat16_kind):
    _check_lora_head(chunk, k, "bfloat16", bfloat16_kind)


def _check_lora_head(chunk: int, k: int | None, precision: str | None, kind: str) -> None:
    """Logprobs and gradients of hidden, A and B through ``target_logprobs`` against autograd's on the formula."""
    from rlvr.engine.train.logprobs import lora_head

    head = _peft_head(vocab=301, hidden=24, precision=precision)
    assert lora_head(head) is not None  # the path under test
    hidden, targets, weights = _inputs(k)
    weights[10:20] = 0  # rows without a gradient (a prompt's positions): skipped in the backward, still exact
    rows = torch.arange(50) if k is None else torch.arange(50)[:, None]
    params = [hidden, head.lora_A["default"].weight, head.lora_B["default"].weight]

    full = _peft_head_by_hand(head, hidden, kind)[rows, targets]
    (weights * full).sum().backward()
    want = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None

    got = target_logprobs(hidden, head, targets, chunk, cpu_paths=True)
    (weights * got).sum().backward()
    # oneDNN's bfloat16 output: float32 sums may round a logit one bfloat16 step apart from the exact sum's rounding;
    # the input gradient's d_logits W runs on oneDNN's bfloat16 kernel in either bfloat16 kind
    close = {"atol": 2e-2, "rtol": 0} if kind == "bf16" else {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(got, full.detach(), **close)
    for p, expected in zip(params, want, strict=True):
        torch.testing.assert_close(p.grad, expected, **(close if p is not hidden or not kind else {"atol": 2e-2,
                                                                                                     "rtol": 0}))


def test_a_lora_heads_backward_recomputes_only_the_rows_with_a_gradient():
    # The backward's one pass of the output layer runs on the rows whose gradient is not zero: 40 of 50 here.
    head = _peft_head(vocab=301, hidden=24, precision=None)
    hidden, targets, weights = _inputs(None)
    weights[10:20] = 0
    seen = []
    head.base_layer.register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    got = target_logprobs(hidden, head, targets, 16, cpu_paths=True)
    forward_rows = sum(seen)
    (weights * got).sum().backward()
    assert forward_rows == 50 and sum(seen) - forward_rows == 40
