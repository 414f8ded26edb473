"""The decode step's kernels against the Hugging Face code they replace (``LlamaRMSNorm`` and the residual add, the
MLP's SiLU(gate) * up, ``apply_rotary_pos_emb``, SDPA over the cache with ``repeat_kv``), in float32 and bfloat16:
the plain-torch references exactly or to float32 rounding, the Triton kernels in the interpreter on the CPU and
compiled on CUDA (``gpu``); and (``slow``) every kernel compiled ahead of time for an H100, on a machine without one,
which catches what only the compiler refuses (the interpreter takes the bfloat16 products' branch in float32)."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from rlvr.engine.gpu import kernels
from rlvr.engine.gpu.kernels import REFERENCE
from triton_devices import DEVICES, triton_kernels_on

DTYPES = [torch.float32, torch.bfloat16]
# float32: rounding; bfloat16: a last bit or two (the interpreter rounds to bfloat16 toward zero, torch to nearest)
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2**-6, "rtol": 2**-6}}


def implementations(device: str) -> list:
    return [REFERENCE, triton_kernels_on(device)]


def random(*shape: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_equals_llama_rms_norm_after_the_residual_add(device, dtype, with_residual):
    norm = LlamaRMSNorm(96, eps=1e-5).to(dtype=dtype, device=device)
    with torch.no_grad():
        norm.weight.copy_(random(96, dtype=dtype, device=device, seed=1))
    x = random(5, 96, dtype=dtype, device=device, seed=2) * 3
    residual = random(5, 96, dtype=dtype, device=device, seed=3)
    stream = residual + x if with_residual else x  # the residual stream after the block's add
    expected = norm(stream)
    for impl in implementations(device):
        kept = residual.clone()
        out = impl.rms_norm(x, norm.weight, norm.variance_epsilon, kept if with_residual else None)
        torch.testing.assert_close(out, expected, **TOLERANCE[dtype], msg=impl.name)
        if with_residual:
            torch.testing.assert_close(kept, stream, **TOLERANCE[dtype], msg=f"{impl.name}: residual += x in place")
        else:
            assert torch.equal(kept, residual)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_equals_the_mlps_activation_times_up(device, dtype):
    gate = random(4, 300, dtype=dtype, device=device, seed=4) * 4  # 300: not a power of two, masked tail
    up = random(4, 300, dtype=dtype, device=device, seed=5)
    expected = ACT2FN["silu"](gate) * up  # LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    for impl in implementations(device):
        torch.testing.assert_close(impl.swiglu(gate, up), expected, **TOLERANCE[dtype], msg=impl.name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_equals_apply_rotary_pos_emb(device, dtype):
    R, H, G, D = 3, 4, 2, 32
    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=G, rope_theta=10000.0)
    rotary = LlamaRotaryEmbedding(config).to(device)
    positions = torch.tensor([0, 7, 300], device=device)
    qkv = random(R, (H + 2 * G) * D, dtype=dtype, device=device, seed=6)  # as the decode step holds them: views
    cos, sin = rotary(qkv, positions[:, None])  # (R, 1, D)
    q, k = qkv[:, : H * D].view(R, H, D), qkv[:, H * D : (H + G) * D].view(R, G, D)
    expected_q, expected_k = apply_rotary_pos_emb(q[:, :, None], k[:, :, None], cos, sin)  # (R, heads, 1, D)
    for impl in implementations(device):
        rotated = qkv.clone()
        impl.rotary_(rotated[:, : H * D].view(R, H, D), rotated[:, H * D : (H + G) * D].view(R, G, D), cos[:, 0],
                     sin[:, 0])
        torch.testing.assert_close(rotated[:, : H * D], expected_q.reshape(R, H * D), **TOLERANCE[dtype],
                                   msg=impl.name)
        torch.testing.assert_close(rotated[:, H * D : (H + G) * D], expected_k.reshape(R, G * D),
                                   **TOLERANCE[dtype], msg=impl.name)
        assert torch.equal(rotated[:, (H + G) * D :], qkv[:, (H + G) * D :])  # the values stay as they were


def sdpa_over_the_cache(q, keys, values, lengths, scale):
    """What transformers' SDPA attention computes for one new token per row: keys and values repeated per query head
    (``repeat_kv``), the columns at and beyond each row's length masked out."""
    H, G, C = q.shape[1], keys.shape[1], keys.shape[2]
    mask = (torch.arange(C, device=q.device) < lengths[:, None])[:, None, None, :]  # (R, 1, 1, C)
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], repeat_kv(keys, H // G), repeat_kv(values, H // G), attn_mask=mask, scale=scale)
    return out[:, :, 0]  # (R, H, D)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 16), (7, 1, 32), (2, 2, 64)])
def test_decode_attention_equals_sdpa_over_the_cache(device, dtype, heads, kv_heads, head_dim):
    capacity = 100  # columns reserved; split in 32s: 4 splits, the last partial, some empty for the short rows
    q = random(4, heads, head_dim, dtype=dtype, device=device, seed=7)
    keys = random(4, kv_heads, capacity, head_dim, dtype=dtype, device=device, seed=8) * 2
    values = random(4, kv_heads, capacity, head_dim, dtype=dtype, device=device, seed=9)
    lengths = torch.tensor([1, 33, 64, 100], dtype=torch.int32, device=device)  # one column; past a split's edge
    scale = head_dim**-0.5
    expected = sdpa_over_the_cache(q, keys, values, lengths.long(), scale)
    torch.testing.assert_close(REFERENCE.decode_attention(q, keys, values, lengths, scale), expected,
                               **TOLERANCE[dtype])
    triton = triton_kernels_on(device)
    for split in (32, None):  # several splits to reduce, and the one the kernel picks (here: one per 32 columns)
        out = triton.decode_attention(q, keys, values, lengths, scale, split)
        torch.testing.assert_close(out, expected, **TOLERANCE[dtype], msg=f"split={split}")


@pytest.mark.parametrize("device", DEVICES)
def test_decode_attention_reads_strided_caches_and_ignores_columns_past_the_length(device):
    # A cache buffer holding garbage (inf) past each row's length, and q a view of a wider projection output.
    triton = triton_kernels_on(device)
    wide = random(2, 3 * 4 * 16, dtype=torch.float32, device=device, seed=10)
    q = wide[:, : 4 * 16].view(2, 4, 16)
    keys = random(2, 2, 64, 16, dtype=torch.float32, device=device, seed=11)
    values = random(2, 2, 64, 16, dtype=torch.float32, device=device, seed=12)
    lengths = torch.tensor([5, 40], dtype=torch.int32, device=device)
    for r, n in enumerate(lengths.tolist()):
        keys[r, :, n:] = float("inf")
        values[r, :, n:] = float("nan")
    expected = sdpa_over_the_cache(q, keys[:, :, :40].nan_to_num(0, 0, 0), values[:, :, :40].nan_to_num(0),
                                   lengths.long(), 0.25)
    torch.testing.assert_close(triton.decode_attention(q, keys, values, lengths, 0.25, 32), expected,
                               **TOLERANCE[torch.float32])


def test_split_sizes_fill_the_gpu_and_keep_to_whole_blocks():
    pytest.importorskip("triton", reason="the split rule lives beside the Triton kernels")
    from rlvr.engine.gpu import triton_kernels

    block = triton_kernels.BLOCK_COLUMNS
    # 8 rows x 2 kv heads = 16 programs: 512 / 16 = 32 splits wanted, of 1152 / 32 = 36 blocks -> 2 blocks each
    assert triton_kernels.splits_for(8, 2, 1152) == 2 * block
    # 1024 rows x 2 kv heads fill the GPU without splitting: one split of all 20 blocks
    assert triton_kernels.splits_for(1024, 2, 640) == 20 * block
    # a short cache splits no finer than a block
    assert triton_kernels.splits_for(1, 1, 40) == block


def test_the_module_imports_without_triton_and_says_how_to_get_it(monkeypatch):
    import importlib
    import sys

    from rlvr.engine import gpu

    monkeypatch.setitem(sys.modules, "triton", None)  # ``import triton`` raises ImportError
    monkeypatch.delitem(sys.modules, "rlvr.engine.gpu.triton_kernels", raising=False)
    monkeypatch.delattr(gpu, "triton_kernels", raising=False)
    fresh = importlib.reload(kernels)  # the module itself imports
    try:
        assert not fresh.triton_available()
        with pytest.raises(ImportError, match="pip install triton"):
            fresh.triton_kernels()
        assert fresh.REFERENCE.name == "reference"
    finally:
        monkeypatch.undo()
        importlib.reload(kernels)


# Compiles every kernel, as the launchers call them, to a cubin for an H100 (sm_90) with the ptxas triton ships: no
# GPU needed, only a process where Triton compiles rather than interprets (this one interprets, see conftest.py).
AHEAD_OF_TIME = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rlvr.engine.gpu import triton_kernels as k

assert not k.INTERPRETED
ROWS = {"x_stride": "i32", "r_stride": "i32", "o_stride": "i32"}
for dt in ("fp32", "bf16"):
    kernels = [
        (k._rms_norm_kernel, {"x": f"*{dt}", "residual": f"*{dt}", "weight": f"*{dt}", "out": f"*{dt}", "n": "i32",
                              "eps": "fp32", **ROWS}, {"HAS_RESIDUAL": True, "BLOCK": 1024}),
        (k._rms_norm_kernel, {"x": f"*{dt}", "residual": f"*{dt}", "weight": f"*{dt}", "out": f"*{dt}", "n": "i32",
                              "eps": "fp32", **ROWS}, {"HAS_RESIDUAL": False, "BLOCK": 128}),
        (k._swiglu_kernel, {"gate": f"*{dt}", "up": f"*{dt}", "out": f"*{dt}", "n": "i32", "g_stride": "i32",
                            "u_stride": "i32", "o_stride": "i32"}, {"BLOCK": 1024}),
        (k._rotary_kernel, {"x": f"*{dt}", "cos": f"*{dt}", "sin": f"*{dt}", "x_row_stride": "i32",
                            "x_head_stride": "i32", "c_stride": "i32"}, {"HALF": 32}),
        (k._attention_reduce_kernel, {"m_in": "*fp32", "l_in": "*fp32", "acc_in": "*fp32", "out": f"*{dt}",
                                      "o_row": "i32", "o_head": "i32"},
         {"HEADS": 14, "D": 64, "SPLITS": 3, "BLOCK_S": 4}),
    ]
    # Qwen2.5-0.5B (7 query heads per key/value head, heads of 64), Qwen3 (2 of 128), Llama-3.2-1B (4 of 64)
    for group, d in ((7, 64), (2, 128), (4, 64)):
        strides = {name: "i32" for name in ("q_row", "q_head", "k_row", "k_head", "k_col", "v_row", "v_head",
                                            "v_col")}
        kernels.append((k._attention_split_kernel, {
            "q": f"*{dt}", "keys": f"*{dt}", "values": f"*{dt}", "lengths": "*i32", "m_out": "*fp32",
            "l_out": "*fp32", "acc_out": "*fp32", "scale": "fp32", **strides},
            {"HEADS": 2 * group, "GROUP": group, "BLOCK_Q": 16, "D": d, "BLOCK_N": k.BLOCK_COLUMNS,
             "SPLIT": 4 * k.BLOCK_COLUMNS, "SPLITS": 3, "IEEE": dt == "fp32"}))
    for fn, signature, constants in kernels:
        signature = {**signature, **{name: "constexpr" for name in constants}}
        compiled = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], fn.__name__
        print("compiled", fn.__name__, dt)
"""


@pytest.mark.slow
def test_the_kernels_compile_for_an_h100_without_one():
    import os
    import subprocess
    import sys

    pytest.importorskip("triton", reason="compiling the kernels needs triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3] / "src"), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = os.path.join(os.environ.get("RLVR_HOME", "/tmp"), "triton-cache")
    done = subprocess.run([sys.executable, "-c", AHEAD_OF_TIME], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled") == 2 * 8
