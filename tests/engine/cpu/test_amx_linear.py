"""The AMX product kernel (engine/cpu/amx_linear.c): its products against the three bfloat16 products computed by hand
in float64 and against exact products, its RMSNorm and gated inputs, its packed layout, its argument checks, and
its self-check. Skipped where the CPU has no AMX-BF16 (or there is no C compiler)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlvr.engine.cpu import amx_linear, packed
from rlvr.errors import ConfigurationError

pytestmark = pytest.mark.skipif(not amx_linear.buildable(), reason="no AMX-BF16 with AVX512-BF16, or no C compiler")


@pytest.fixture(scope="module")
def kernel():
    """The freshly built kernel, without its self-check (so a broken kernel fails these tests, not skips them)."""
    return amx_linear.bind()


def parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low bfloat16 parts by hand, as float64: high = t rounded to bfloat16, low = the rest rounded."""
    high = t.to(torch.bfloat16).double()
    return high, (t.double() - high).float().to(torch.bfloat16).double()


def by_hand(a: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The three products ah Wh + ah Wl + al Wh in float64, and the sum of |terms| of the exact product (the scale
    a float32 sum's rounding is measured against)."""
    (ah, al), (wh, wl) = parts(a), parts(weight)
    return ah @ wh.T + ah @ wl.T + al @ wh.T, a.double().abs() @ weight.double().abs().T


@pytest.mark.parametrize(("rows", "inputs", "outputs"), [
    (1, 40, 20),  # everything padded: one row, a part step, a part block
    (16, 64, 96),  # one row tile (the kernel's form for 16 rows or fewer)
    (31, 96, 32),
    (32, 100, 50),  # exactly one row group; inputs and columns not filling a step or a pair
    (33, 64, 96),  # one row past a group
    (64, 576, 960),  # SmolLM2's q/k/v at the sampler's 64 rows
    (70, 1536, 64),  # its MLP's down width, over two groups and a part
    (300, 2048, 40),  # a trainer's rows over 2,048 inputs: bands of 128 rows (1 MiB of inputs), two and a part
])
def test_products_equal_three_bfloat16_products_by_hand(kernel, rows, inputs, outputs):
    generator = torch.Generator().manual_seed(rows + inputs + outputs)
    x = torch.randn(rows, inputs, generator=generator)
    weight = torch.randn(outputs, inputs, generator=generator) * 0.05
    out = amx_linear.linear(kernel, x, amx_linear.pack(weight), outputs)
    three, scale = by_hand(x, weight)
    # float32 sums of the three products: within a few float32 roundings of the sum of |terms|
    assert ((out.double() - three).abs() / scale).max() < 1e-6
    # and they are the product to ~16 bits (bfloat16 alone: ~1e-3; without the low parts this fails)
    exact = x.double() @ weight.double().T
    assert ((out.double() - exact).abs() / scale).max() < 4e-6


@pytest.mark.parametrize(("rows", "inputs", "outputs"), [(1, 40, 20), (8, 896, 1152), (33, 64, 96), (64, 576, 960)])
def test_the_one_product_form_is_a_bfloat16_product(kernel, rows, inputs, outputs):
    # Packs of the high parts alone: ah Wh in float32 sums, what a bfloat16 matmul computes (the trainer's product
    # when the base runs in bfloat16), not the float32 product; and still row by row.
    generator = torch.Generator().manual_seed(rows + inputs)
    x = torch.randn(rows, inputs, generator=generator)
    weight = torch.randn(outputs, inputs, generator=generator) * 0.05
    packed_high = amx_linear.pack(weight, products=1)
    assert packed_high.shape[2] == 1 and packed_high.numel() * 2 == amx_linear.pack(weight).numel()
    out = amx_linear.linear(kernel, x, packed_high, outputs)
    (ah, _), (wh, _) = parts(x), parts(weight)
    scale = x.double().abs() @ weight.double().abs().T
    assert ((out.double() - ah @ wh.T).abs() / scale).max() < 1e-6
    exact = x.double() @ weight.double().T
    assert ((out.double() - exact).abs() / scale).max() > 1e-4  # bfloat16's rounding shows: not the float32 form
    assert torch.equal(amx_linear.linear(kernel, x[-1:], packed_high, outputs), out[-1:])


def test_a_rows_products_do_not_depend_on_the_rows_beside_it(kernel):
    # A row's result, bit for bit, alone, among 16 (one row tile) or among 40 (two groups of two tiles): what lets a
    # seeded request decode to the same tokens whatever is batched beside it.
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(40, 200, generator=generator)
    packed = amx_linear.pack(torch.randn(96, 200, generator=generator) * 0.05)
    every = amx_linear.linear(kernel, x, packed, 96)
    for rows in (1, 5, 16, 17, 33):
        assert torch.equal(amx_linear.linear(kernel, x[:rows], packed, 96), every[:rows]), rows


@pytest.mark.parametrize("products", [3, 1])
def test_a_rows_products_do_not_depend_on_its_band(kernel, products):
    # The kernel works in bands of rows whose inputs fill 1 MiB (here 4,096 inputs: 64 rows in the three-product form,
    # 128 in the one-product form): a trainer's row, among 300, gets the sampler's product for it alone, bit for bit,
    # in either form (with RLVR_MATMUL=bf16x1 the bfloat16 trainer's forward and the sampler share the second).
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(300, 4096, generator=generator)
    packed = amx_linear.pack(torch.randn(96, 4096, generator=generator) * 0.05, products)
    every = amx_linear.linear(kernel, x, packed, 96)
    for row in (0, 63, 64, 127, 128, 200, 255, 256, 299):
        assert torch.equal(amx_linear.linear(kernel, x[row:row + 1], packed, 96), every[row:row + 1]), row


def test_rmsnorm_and_gated_inputs(kernel):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40, 2 * 96, generator=generator) * 3
    x[:4] *= 1e-3  # rows whose mean square is of eps's size
    weight = torch.randn(48, 96, generator=generator)
    norm = torch.rand(96, generator=generator) + 0.5
    pack = amx_linear.pack(weight)
    normed = x[:, :96] * torch.rsqrt(x[:, :96].pow(2).mean(-1, keepdim=True) + 1e-5) * norm  # RMSNorm by hand
    gate, up = x[:, :96].double(), x[:, 96:].double()
    gated = (gate / (1 + torch.exp(-gate)) * up).float()  # SiLU(gate) * up by hand
    for a, options, source in ((normed, {"norm": norm, "eps": 1e-5}, x[:, :96]), (gated, {"gated": True}, x)):
        inputs = torch.full((40, 96), float("nan"))
        out = amx_linear.linear(kernel, source, pack, 48, inputs=inputs, **options)
        torch.testing.assert_close(inputs, a, atol=1e-6, rtol=2e-6)  # the input the adapters get
        three, scale = by_hand(a, weight)
        assert ((out.double() - three).abs() / scale).max() < 1e-5


def test_gated_input_at_large_and_small_gates(kernel):
    """SiLU where e^-|g| underflows or is 1: 0 for very negative gates, the gate itself for large ones."""
    gate = torch.tensor([[-200.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 200.0] + [0.5] * 23])
    x = torch.cat([gate, torch.ones_like(gate)], dim=1)
    inputs = torch.empty(1, 32)
    amx_linear.linear(kernel, x, amx_linear.pack(torch.ones(16, 32)), 16, gated=True, inputs=inputs)
    torch.testing.assert_close(inputs, F.silu(gate), atol=1e-12, rtol=2e-7)


def test_pack_layout():
    """Tile entry [block, step, part, pair, column, 2] holds W[16 block + column, 32 step + 2 pair + (0, 1)]."""
    outputs, inputs = 40, 70
    index = torch.arange(outputs * inputs, dtype=torch.float64).view(outputs, inputs)
    weight = (1 + index / 4096).float()  # distinct values whose high part tells the index
    pack = amx_linear.pack(weight).view(torch.bfloat16).float()
    assert pack.shape == (4, 3, 2, 16, 16, 2)  # blocks padded to pairs, inputs to whole steps
    high, low = parts(weight)
    for block, step, pair, column, half in [(0, 0, 0, 0, 0), (1, 2, 2, 7, 1), (2, 1, 15, 3, 1), (0, 2, 2, 15, 1)]:
        n, k = 16 * block + column, 32 * step + 2 * pair + half
        assert pack[block, step, 0, pair, column, half] == high[n, k]
        assert pack[block, step, 1, pair, column, half] == low[n, k]
    assert (pack[2, :, :, :, 8:] == 0).all() and (pack[3] == 0).all()  # columns 40..63 are padding
    assert (pack[:, 2, :, 3:] == 0).all()  # inputs 70..95 are padding


def test_arguments_are_checked(kernel):
    weight = torch.randn(32, 64)
    pack = amx_linear.pack(weight)
    x = torch.randn(4, 64)
    cases = [
        ({"x": x.double()}, "x: rows of unit stride in float32"),
        ({"x": torch.randn(64, 4).T}, "x: rows of unit stride"),
        ({"x": torch.randn(4, 30)}, "the shapes disagree"),
        ({"out_features": 33}, "the shapes disagree"),
        ({"packed": pack.view(torch.bfloat16)}, "packed: a contiguous int16 tensor"),
        ({"norm": torch.ones(32)}, "norm: a contiguous float32 \\(64,\\) weight"),
        ({"norm": torch.ones(128), "gated": True, "x": torch.randn(4, 128)}, "one input transform at a time"),
        ({"inputs": torch.empty(4, 32)}, "inputs: float32 \\(4, 64\\)"),
        ({"out": torch.empty(4, 33)}, "out: float32 \\(4, 32\\)"),
    ]
    for change, message in cases:
        arguments = {"x": x, "packed": pack, "out_features": 32, **change}
        with pytest.raises(ValueError, match=message):
            amx_linear.linear(kernel, **arguments)
    assert amx_linear.linear(kernel, torch.empty(0, 64), pack, 32).shape == (0, 32)


def test_a_disagreeing_kernel_is_rejected():
    def writes_nothing(*_args) -> int:
        return 0

    with pytest.raises(RuntimeError, match="disagrees with products by hand"):
        amx_linear.self_check(writes_nothing)


def test_a_machine_without_amx_is_not_offered_the_kind(monkeypatch):
    monkeypatch.setattr(amx_linear, "_granted", lambda: False)  # Linux refusing the tile state, as before 5.16
    assert not amx_linear.buildable()
    assert "bf16x3" not in packed.pack_kinds()
    monkeypatch.setenv("RLVR_MATMUL", "bf16x3")
    with pytest.raises(ConfigurationError, match="RLVR_MATMUL='bf16x3': choose plain or one of"):
        packed.fastest_kind("decode", torch.randn(8, 4), 16)


def test_the_kernel_is_offered_and_can_be_forced(kernel, monkeypatch):
    assert "bf16x3" in packed.pack_kinds()
    assert amx_linear.kernel() is not None  # built, and it agreed with products by hand on its self-check
    monkeypatch.setenv("RLVR_MATMUL", "bf16x3")
    weight = torch.randn(64, 96) * 0.1
    assert packed.fastest_kind("decode", weight, 16) == "bf16x3"
    assert packed.fastest_kind("train", weight, 16, kinds=["mkldnn"]) == ""  # the trainer stays float32
    x = torch.randn(5, 96)
    out = packed.packed_linear(x, packed.pack(weight, "bf16x3", 5), "bf16x3", torch.zeros(1, 1).expand(64, 96),
                               torch.ones(64), 5)
    torch.testing.assert_close(out, F.linear(x, weight) + 1, atol=3e-5, rtol=1e-5)


def test_the_one_product_form_is_what_bf16x1_asks_for(kernel, monkeypatch):
    # A bfloat16 model multiplies on oneDNN's kernel unless RLVR_MATMUL=bf16x1 asks for the AMX kernel's one-product
    # form; float32 products then take its three-product form.
    monkeypatch.delenv("RLVR_MATMUL", raising=False)
    assert packed.bfloat16_kind() == "bf16"
    monkeypatch.setenv("RLVR_MATMUL", "bf16x1")
    assert packed.bfloat16_kind() == "bf16x1"
    assert packed.fastest_kind("decode", torch.randn(8, 4), 16) == "bf16x3"
    assert packed.fastest_kind("train", torch.randn(8, 4), 16, kinds=["mkldnn"]) == ""  # as with bf16x3


def test_bf16x1_on_a_machine_without_amx_is_refused(monkeypatch):
    monkeypatch.setattr(amx_linear, "_granted", lambda: False)
    monkeypatch.setenv("RLVR_MATMUL", "bf16x1")
    with pytest.raises(ConfigurationError, match="RLVR_MATMUL=bf16x1 needs rlvr's AMX kernel"):
        packed.bfloat16_kind()
    with pytest.raises(ConfigurationError, match="RLVR_MATMUL='bf16x1': choose plain or one of"):
        packed.fastest_kind("decode", torch.randn(8, 4), 16)
