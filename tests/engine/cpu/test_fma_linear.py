"""The float32 FMA product kernel (engine/cpu/fma_linear.c): its products against float64 ones, a row's products the
same bit for bit whatever else is in the batch, its bias, packed layout, argument checks and self-check, and the
fixed preference that gives it the decoder where AMX does not run. Skipped where the CPU has no AVX2 and FMA (or
there is no C compiler)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlvr.engine.cpu import amx_linear, fma_linear, packed
from rlvr.errors import ConfigurationError

pytestmark = pytest.mark.skipif(not fma_linear.buildable(), reason="no AVX2 with FMA, or no C compiler")


@pytest.fixture(scope="module")
def kernel():
    """The freshly built kernel, without its self-check (so a broken kernel fails these tests, not skips them)."""
    return fma_linear.bind()


@pytest.mark.parametrize(("rows", "inputs", "outputs"), [
    (1, 40, 20),  # one row (two blocks at a time), a part block
    (3, 17, 16),  # an odd input count, exactly one block
    (8, 96, 48),  # two tiles of 4
    (13, 100, 33),  # three tiles (5, 5, 3), a part block
    (64, 576, 960),  # SmolLM2's q/k/v at the sampler's 64 rows
    (70, 1536, 64),  # its MLP's down width, 12 tiles
])
def test_products_equal_float64_products(kernel, rows, inputs, outputs):
    generator = torch.Generator().manual_seed(rows + inputs + outputs)
    x = torch.randn(rows, inputs, generator=generator)
    weight = torch.randn(outputs, inputs, generator=generator) * 0.05
    bias = torch.randn(outputs, generator=generator)
    out = fma_linear.linear(kernel, x, fma_linear.pack(weight), outputs, bias)
    exact = x.double() @ weight.double().T + bias.double()
    scale = x.double().abs() @ weight.double().abs().T + bias.double().abs()
    # float32 sums in order: within ~inputs x 2^-24 of the sum of |terms| (bfloat16 products would be ~4e-3 off)
    assert ((out.double() - exact).abs() / scale).max() < inputs * 6e-8
    assert ((out.double() - exact).abs() / scale).max() > 0  # float32, not float64: the check above has a scale


def test_a_rows_products_do_not_depend_on_the_other_rows(kernel):
    # What the sampler's seed guarantee needs: row i of a batch of any size equals row i computed alone, bit for bit
    # (a plain F.linear on MKL fails this: it takes another path for 1 to 3 rows and odd counts).
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(64, 200, generator=generator)
    weight = torch.randn(130, 200, generator=generator)
    pack = fma_linear.pack(weight)
    alone = torch.cat([fma_linear.linear(kernel, x[i : i + 1], pack, 130) for i in range(64)])
    for rows in (2, 3, 7, 8, 13, 31, 64):
        assert torch.equal(fma_linear.linear(kernel, x[:rows], pack, 130), alone[:rows]), rows
    strided = torch.randn(64, 256, generator=generator)
    strided[:, :200] = x  # rows of a wider tensor, as the decoder hands them over
    assert torch.equal(fma_linear.linear(kernel, strided[:, :200], pack, 130), alone)


def test_packed_layout_and_out():
    weight = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    pack = fma_linear.pack(weight)
    assert pack.shape == (2, 3, 16)
    assert torch.equal(pack[0, 1], weight[:16, 1])  # block 0, input 1: columns 0-15 side by side
    assert torch.equal(pack[1, 2, :4], weight[16:, 2]) and not pack[1, :, 4:].any()  # zero past the last column
    out = torch.full((2, 20), float("nan"))
    assert fma_linear.linear(fma_linear.kernel(), torch.ones(2, 3), pack, 20, out=out) is out
    torch.testing.assert_close(out, weight.sum(1).expand(2, 20))


def test_bad_arguments_are_refused_before_the_kernel_runs(kernel):
    pack = fma_linear.pack(torch.randn(20, 8))
    with pytest.raises(ValueError, match="x: rows of unit stride in float32"):
        fma_linear.linear(kernel, torch.randn(2, 8).double(), pack, 20)
    with pytest.raises(ValueError, match="x: rows of unit stride"):
        fma_linear.linear(kernel, torch.randn(8, 2).t(), pack, 20)
    with pytest.raises(ValueError, match="the shapes disagree"):
        fma_linear.linear(kernel, torch.randn(2, 9), pack, 20)
    with pytest.raises(ValueError, match="the shapes disagree"):
        fma_linear.linear(kernel, torch.randn(2, 8), pack, 33)
    with pytest.raises(ValueError, match="packed: a contiguous float32 tensor"):
        fma_linear.linear(kernel, torch.randn(2, 8), pack.transpose(1, 2), 20)
    with pytest.raises(ValueError, match="bias: a contiguous float32"):
        fma_linear.linear(kernel, torch.randn(2, 8), pack, 20, torch.randn(19))
    with pytest.raises(ValueError, match="out: float32"):
        fma_linear.linear(kernel, torch.randn(2, 8), pack, 20, out=torch.empty(2, 19))
    assert fma_linear.linear(kernel, torch.randn(0, 8), pack, 20).shape == (0, 20)


def test_a_disagreeing_kernel_is_rejected():
    def writes_nothing(*_args) -> None:
        return None

    with pytest.raises(RuntimeError, match="disagrees with float64 products"):
        fma_linear.self_check(writes_nothing)


def test_the_kernel_is_the_decoders_where_amx_does_not_run_and_can_be_forced(monkeypatch):
    assert "fma" in packed.pack_kinds() and fma_linear.kernel() is not None  # built, and passed its self-check
    weight = torch.randn(64, 96) * 0.1
    monkeypatch.setattr(packed, "_CHOSEN", {})
    monkeypatch.delenv("RLVR_MATMUL", raising=False)
    expected = "bf16x3" if amx_linear.buildable() else "fma"
    assert packed.fastest_kind("decode", weight, 64) == expected
    assert packed.fastest_kind("train", weight, 64, kinds=["mkldnn"]) in ("mkldnn", "")  # never the trainer's
    monkeypatch.setenv("RLVR_MATMUL", "fma")
    assert packed.fastest_kind("decode", weight, 16) == "fma"
    assert packed.fastest_kind("train", weight, 16, kinds=["mkldnn"]) == ""
    x = torch.randn(5, 96)
    out = packed.packed_linear(x, packed.pack(weight, "fma", 5), "fma", torch.zeros(1, 1).expand(64, 96),
                               torch.ones(64), 5)
    torch.testing.assert_close(out, F.linear(x, weight) + 1, atol=1e-5, rtol=1e-5)


def test_a_machine_without_avx2_is_not_offered_the_kind(monkeypatch):
    monkeypatch.setattr(fma_linear.native, "cpu", lambda: ("a CPU", frozenset({"sse2"})))
    assert not fma_linear.buildable()
    assert "fma" not in packed.pack_kinds()
    monkeypatch.setenv("RLVR_MATMUL", "fma")
    with pytest.raises(ConfigurationError, match="RLVR_MATMUL='fma': choose plain or one of"):
        packed.fastest_kind("decode", torch.randn(8, 4), 16)
