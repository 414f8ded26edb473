"""``bench/gpu.py``: without CUDA it refuses, naming the fix; ``--smoke`` runs every code path of it on the CPU with
tiny shapes (continuous batching left out: its manager costs ~10 s a call on a CPU) and writes its JSON. Not marked
``gpu``: this runs in the CPU suite."""

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delenv("RLVR_PRECISION", raising=False)
    import bench.gpu

    return bench.gpu


def test_it_refuses_without_cuda(bench_gpu, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        bench_gpu.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "torch sees none here" in err and "pass --smoke" in err


def test_smoke_runs_every_path_on_the_cpu(bench_gpu, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    bench_gpu.main(["--smoke", "--skip", "continuous", "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["smoke"] and record["gpu"]["matmul_flops"] > 0 and record["gpu"]["memory_bandwidth"] > 0
    assert set(record["models"]) == {"llama-small", "qwen3-small"}
    for model in record["models"].values():
        assert set(model["sampling"]) == {"8", "16"}
        for row in model["sampling"].values():
            assert row["rlvr_tokens_per_s"] > 0 and 0 < row["rlvr_fraction_of_bound"]
            assert row["generate"]["tokens"] == row["sequences"] * 4 and row["ratio_to_generate"] > 0
            assert row["continuous_batching"] == {"skipped": "--skip"}
        training = model["training"]
        assert training["rlvr_tokens_per_s"] > 0 and training["plain_torch_peft"]["tokens_per_s"] > 0
        assert training["tokens"] == training["plain_torch_peft"]["tokens"] == 8 * 23
        step = model["rl_step"]
        assert step["rlvr"]["seconds"] > 0 and step["rlvr"]["trained_tokens"] == 8 * (128 - 1 + 4)
        if "seconds" in step["trl"]:  # TRL's step ran (trl importable here)
            assert step["trl"]["seconds"] > 0 and step["ratio_to_trl"] > 0
        else:
            assert step["trl"] == {"skipped": "trl is not importable (pip install 'rlvr[bench]')"}
    assert "wrote" in capsys.readouterr().out
