"""The fused decode attention kernel: its output against attention computed by hand in PyTorch (softmax over the
prompt's and the row's own scores, weighted sum of values), its cache writes, its key layout, its build and the
errors it gives, for the AVX-512 and the AVX2 code. Kernel tests skip where it cannot run (neither, or no C
compiler); the decoder's own tests (``test_decode.py``) run it inside whole decode steps."""

import math

import pytest
import torch

from rlvr.engine.cpu import fused_attention, native
from rlvr.errors import ConfigurationError


@pytest.fixture(scope="module", params=["native", "avx2"])
def kernel(request):
    """The kernel as built, without ``kernel()``'s self-check (which would turn a broken kernel into a skip):
    "native" for this CPU (AVX-512 where it has it), "avx2" the 8-lane code, built with AVX-512 switched off."""
    if not fused_attention.buildable():
        pytest.skip("the fused attention kernel cannot run here (no AVX-512 or AVX2, or no C compiler)")
    if request.param == "avx2":
        if not {"avx2", "fma"} <= native.cpu()[1]:
            pytest.skip("no AVX2 with FMA here")
        return fused_attention.bind(fused_attention.build(("-mno-avx512f",)))
    return fused_attention.bind(fused_attention.build())


def by_hand(q, prompt_keys, prompt_values, bias, keys, values, chunk, scale):
    """Attention of each row's query heads over its chunk's prompt and its own columns, one (row, head) at a time."""
    slots, kv_heads, _, head_dim = keys.shape
    query_heads = q.shape[1] // head_dim // kv_heads
    out = torch.zeros(slots, kv_heads * query_heads, head_dim, dtype=torch.float64)
    for s in range(slots):
        c = s // chunk
        for g in range(kv_heads):
            k = torch.cat((prompt_keys[c, g], keys[s, g])).double()
            v = torch.cat((prompt_values[c, g], values[s, g])).double()
            mask = torch.cat((bias[c].double() if bias is not None else torch.zeros(prompt_keys.shape[2]),
                              torch.zeros(keys.shape[2]))).double()
            for i in range(query_heads):
                h = g * query_heads + i
                scores = k @ q[s, h * head_dim:(h + 1) * head_dim].double() * scale + mask
                weights = scores.exp() / scores.exp().sum()
                out[s, h] = weights @ v
    return out.reshape(slots, -1).float()


@pytest.mark.parametrize(("query_heads", "head_dim", "width", "chunk", "generated", "padded"), [
    (3, 64, 45, 4, 1, True),  # SmolLM2's heads; the first generated column; a left-padded prompt
    (3, 64, 45, 4, 70, False),  # own columns past one block group of 64
    (1, 16, 16, 1, 17, True),  # one query head per key/value head, a prompt of exactly one block
    (2, 32, 3, 2, 64, False),
    (4, 128, 130, 8, 33, True),  # Llama 3's 4 per key/value head on heads of 128 (two slabs of values)
    (2, 24, 37, 2, 20, True),  # the tiny model's heads of 24: a part-filled vector of values
    (1, 8, 5, 1, 3, True),  # heads of 8: half a vector of 16
    (7, 64, 57, 8, 40, True),  # Qwen2.5-0.5B's 7 per key/value head: a group of 4, then one of 3
    (8, 128, 21, 2, 17, False),  # Qwen2.5-3B's and Llama 3 70B's 8: two groups of 4
    (6, 128, 9, 1, 5, True),  # Qwen2.5-1.5B's 6
])
def test_kernel_equals_attention_by_hand(kernel, query_heads, head_dim, width, chunk, generated, padded):
    gen = torch.Generator().manual_seed(query_heads * 1000 + generated)
    slots, kv_heads, capacity = 2 * chunk, 2, generated + 5
    chunks, heads = slots // chunk, kv_heads * query_heads
    # q and the new key and value are row views of wider projections, as in the decoder
    projections = torch.randn(slots, (heads + 2 * kv_heads) * head_dim + 7, generator=gen)
    q = projections[:, : heads * head_dim]
    new_k = projections[:, heads * head_dim : (heads + kv_heads) * head_dim]
    new_v = projections[:, (heads + kv_heads) * head_dim : (heads + 2 * kv_heads) * head_dim]
    prompt_keys = torch.randn(chunks, kv_heads, width, head_dim, generator=gen)
    prompt_values = torch.randn(chunks, kv_heads, width, head_dim, generator=gen)
    bias = None
    if padded:
        bias = torch.zeros(chunks, width)
        bias[-1, : width // 3] = float("-inf")
    keys = torch.randn(slots, kv_heads, capacity, head_dim, generator=gen)
    values = torch.randn(slots, kv_heads, capacity, head_dim, generator=gen)
    blocked, cached = fused_attention.to_blocks(keys), values.clone()
    out = torch.full((slots, heads * head_dim), float("nan"))
    scratch = torch.empty(slots * heads * (width + generated))
    scale = head_dim**-0.5
    fused_attention.attend(kernel, q, new_k, new_v, fused_attention.to_blocks(prompt_keys), prompt_values, bias,
                           blocked, cached, out, scratch, chunk, generated, scale)

    column = generated - 1  # the new key and value land there; nothing else in the cache changes
    keys[:, :, column] = new_k.reshape(slots, kv_heads, head_dim)
    values[:, :, column] = new_v.reshape(slots, kv_heads, head_dim)
    assert torch.equal(blocked, fused_attention.to_blocks(keys))
    assert torch.equal(cached, values)
    expected = by_hand(q, prompt_keys, prompt_values, bias, keys[:, :, :generated], values[:, :, :generated],
                       chunk, scale)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)
    reference = fused_attention.reference(q, prompt_keys, prompt_values, bias, keys[:, :, :generated],
                                          values[:, :, :generated], chunk, scale)
    torch.testing.assert_close(reference, expected, atol=2e-6, rtol=1e-5)


def test_padding_gets_no_weight(kernel):
    # Prompt values under -inf bias are huge: any weight on them would show in the output.
    slots, kv_heads, query_heads, head_dim, width = 2, 1, 3, 16, 20
    q = torch.randn(slots, query_heads * head_dim)
    new = torch.randn(slots, head_dim)
    prompt_values = torch.randn(1, kv_heads, width, head_dim)
    prompt_values[..., :5, :] = 1e30
    bias = torch.zeros(1, width)
    bias[0, :5] = float("-inf")
    values = torch.zeros(slots, kv_heads, 16, head_dim)
    out = torch.full((slots, query_heads * head_dim), float("nan"))
    fused_attention.attend(kernel, q, new, new, fused_attention.to_blocks(torch.randn(1, kv_heads, width, head_dim)),
                           prompt_values, bias, fused_attention.to_blocks(torch.zeros(slots, kv_heads, 16, head_dim)),
                           values, out, torch.empty(slots * query_heads * (width + 1)), 2, 1, 0.25)
    assert out.abs().max() < 100


def test_to_blocks_lays_keys_out_in_blocks_of_16():
    keys = torch.arange(2 * 37 * 3, dtype=torch.float32).view(2, 37, 3)  # (G, L, D)
    blocked = fused_attention.to_blocks(keys)
    assert blocked.shape == (2, 3, 3, 16)  # ceil(37 / 16) blocks of (D, 16)
    for g, position, d in [(0, 0, 0), (1, 17, 2), (1, 36, 1)]:
        assert blocked[g, position // 16, d, position % 16] == keys[g, position, d]
    assert blocked[:, 2, :, 5:].abs().sum() == 0  # the padding past 37 positions is zero


def test_supports_only_the_shapes_it_handles():
    assert fused_attention.supports(3, 64) and fused_attention.supports(4, 128) and fused_attention.supports(1, 16)
    assert fused_attention.supports(7, 64) and fused_attention.supports(16, 64)  # in groups of up to 4
    assert not fused_attention.supports(17, 64)  # more query heads per key/value head than it takes
    assert fused_attention.supports(2, 24)  # the tiny model's heads
    assert not fused_attention.supports(2, 20)  # heads not a multiple of 8 floats


def test_attend_rejects_what_it_cannot_read(kernel):
    q = torch.randn(2, 48)
    new = torch.randn(2, 16)
    args = (new, new, torch.zeros(1, 1, 1, 16, 16), torch.zeros(1, 1, 4, 16), None,
            torch.zeros(2, 1, 1, 16, 16), torch.zeros(2, 1, 8, 16), torch.empty(2, 48), torch.empty(1000))
    with pytest.raises(ValueError, match="q: rows of unit stride"):
        fused_attention.attend(kernel, q.t().contiguous().t(), *args, 2, 1, 0.25)
    with pytest.raises(ValueError, match="keys: a contiguous float32"):
        fused_attention.attend(kernel, q, *args[:5], args[5].double(), *args[6:], 2, 1, 0.25)
    with pytest.raises(ValueError, match="scratch"):
        fused_attention.attend(kernel, q, *args[:-1], torch.empty(3), 2, 1, 0.25)
    with pytest.raises(ValueError, match=r"keys: shape \(2, 1, 2, 16, 16\), expected \(2, 1, 1, 16, 16\)"):
        fused_attention.attend(kernel, q, *args[:5], torch.zeros(2, 1, 2, 16, 16), *args[6:], 2, 1, 0.25)
    with pytest.raises(ValueError, match="rows per chunk"):  # 2 rows cannot be one chunk of 3
        fused_attention.attend(kernel, q, *args, 3, 1, 0.25)
    with pytest.raises(ValueError, match="outside what the kernel handles"):
        fused_attention.attend(kernel, q, *args, 2, 9, 0.25)  # 9 columns asked of a cache of 8


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """``kernel()`` recomputed for this test, with its library built under an empty ``RLVR_HOME``."""
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    fused_attention.kernel.cache_clear()
    yield tmp_path
    fused_attention.kernel.cache_clear()


def test_environment_chooses_the_attention(fresh, monkeypatch):
    monkeypatch.setenv("RLVR_ATTENTION", "torch")
    assert fused_attention.kernel() is None
    fused_attention.kernel.cache_clear()
    monkeypatch.setenv("RLVR_ATTENTION", "flash")
    with pytest.raises(ConfigurationError, match="RLVR_ATTENTION='flash': choose auto, torch or fused"):
        fused_attention.kernel()


def test_an_unbuildable_kernel_falls_back_or_fails_as_asked(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(fresh / "no-such-compiler"))
    if not fused_attention.buildable():
        pytest.skip("the kernel is unavailable here before any compiler runs")
    assert fused_attention.kernel() is None  # auto: PyTorch's ops instead
    fused_attention.kernel.cache_clear()
    monkeypatch.setenv("RLVR_ATTENTION", "fused")
    with pytest.raises(ConfigurationError, match="RLVR_ATTENTION=fused, but the fused attention kernel cannot run"):
        fused_attention.kernel()
    assert not list(fresh.glob("kernels/*.so"))  # no half-built library left behind


def test_the_library_is_built_once_per_machine(fresh, kernel):
    assert fused_attention.kernel() is not None  # built, and it passed its self-check
    built = list(fresh.glob("kernels/*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    fused_attention.kernel.cache_clear()
    assert fused_attention.kernel() is not None
    assert [p.stat().st_mtime_ns for p in fresh.glob("kernels/*.so")] == [stamp]  # loaded, not rebuilt


def test_a_kernel_that_disagrees_is_not_used(kernel):
    def wrong(*args):  # writes nothing: out keeps its garbage
        return 0

    with pytest.raises(RuntimeError, match="disagrees with PyTorch"):
        fused_attention.self_check(wrong)


def test_exp_of_scores_matches_torch_at_float32_rounding(kernel):
    # One row, one query, all weight on a wide range of scores: the softmax inside the kernel against torch's.
    width, head_dim = 200, 16
    q = torch.zeros(1, head_dim)
    q[0, 0] = 1.0
    prompt_keys = torch.zeros(1, 1, width, head_dim)
    prompt_keys[0, 0, :, 0] = torch.linspace(-80, 5, width)  # scores from -80 to 5 (scale 1)
    prompt_values = torch.randn(1, 1, width, head_dim, generator=torch.Generator().manual_seed(0))
    out = torch.full((1, head_dim), float("nan"))
    new = torch.zeros(1, head_dim)
    fused_attention.attend(kernel, q, new, new, fused_attention.to_blocks(prompt_keys), prompt_values, None,
                           torch.zeros(1, 1, 1, head_dim, 16), torch.zeros(1, 1, 16, head_dim), out,
                           torch.empty(width + 1), 1, 1, 1.0)
    scores = torch.cat((prompt_keys[0, 0, :, 0], torch.zeros(1))).double()
    weights = scores.softmax(-1)
    expected = weights[:width] @ prompt_values[0, 0].double()
    torch.testing.assert_close(out[0].double(), expected, atol=1e-6, rtol=1e-5)
    assert math.isfinite(out.sum().item())


@pytest.mark.parametrize(("query_heads", "head_dim"), [(2, 24), (3, 64)])  # tiny's heads, SmolLM2's
def test_a_rows_output_does_not_depend_on_padding_chunks_or_other_rows(kernel, query_heads, head_dim):
    # One row (its query, prompt of 21 columns, 19 generated columns) alone, then beside other rows of other
    # prompts: its prompt left-padded to widths up to 70 (padding under -inf bias, holding anything finite), in
    # chunks of 1 to 4 rows, at every place in the batch. Its output must be the same bit for bit: this is what
    # lets a seeded request sample the same tokens whatever else is batched (a softmax summed in lanes counted
    # from column 0 fails this as soon as the padding is not a multiple of the vector width).
    gen = torch.Generator().manual_seed(head_dim)
    kv_heads, length, generated = 2, 21, 19
    heads = kv_heads * query_heads

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q, new_k, new_v = randn(heads * head_dim), randn(kv_heads * head_dim), randn(kv_heads * head_dim)
    prompt_keys, prompt_values = randn(kv_heads, length, head_dim), randn(kv_heads, length, head_dim)
    own_keys, own_values = randn(kv_heads, generated + 3, head_dim), randn(kv_heads, generated + 3, head_dim)

    def run(padding: int, chunk: int, place: int) -> torch.Tensor:
        slots, width = 2 * chunk, length + padding
        rows_q, rows_k, rows_v = randn(slots, heads * head_dim), randn(slots, kv_heads * head_dim), randn(
            slots, kv_heads * head_dim)
        rows_q[place], rows_k[place], rows_v[place] = q, new_k, new_v
        chunk_keys, chunk_values = randn(2, kv_heads, width, head_dim), randn(2, kv_heads, width, head_dim)
        chunk_keys[place // chunk, :, padding:] = prompt_keys
        chunk_values[place // chunk, :, padding:] = prompt_values
        bias = torch.zeros(2, width)
        bias[place // chunk, :padding] = float("-inf")
        keys, values = randn(slots, kv_heads, generated + 3, head_dim), randn(slots, kv_heads, generated + 3, head_dim)
        keys[place], values[place] = own_keys, own_values
        out = torch.full((slots, heads * head_dim), float("nan"))
        fused_attention.attend(kernel, rows_q, rows_k, rows_v, fused_attention.to_blocks(chunk_keys), chunk_values,
                               bias if padding else None, fused_attention.to_blocks(keys), values, out,
                               torch.empty(slots * heads * (width + generated)), chunk, generated, head_dim**-0.5)
        return out[place]

    alone = run(0, 1, 0)
    for padding in (1, 3, 7, 8, 15, 16, 49):
        for chunk in (1, 2, 4):
            for place in {0, chunk - 1, chunk, 2 * chunk - 1}:
                assert torch.equal(run(padding, chunk, place), alone), (padding, chunk, place)
