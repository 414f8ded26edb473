"""``bench/gpu.py`` and ``scripts/gpu-check``: without CUDA the benchmark refuses, naming the fix; the check's dry run
(``--device cpu --quick``) runs its every step on the CPU, the benchmark's every code path included on tiny shapes
(``--smoke``; continuous batching left out: its manager costs ~10 s a call on a CPU), and writes what the GPU run
writes. Not marked ``gpu``: this runs in the CPU suite."""

import json
import os
import subprocess
import sys
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


@pytest.mark.slow
def test_the_gpu_check_dry_run_runs_every_step_and_path_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"), "--device", "cpu", "--quick",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    assert {"env.json", "gpu-check.log", "gpu-tests.log", "gpu-bench.log", "gpu-bench.json", "gpu-decode.log",
            "gpu-decode.json"} <= {p.name for p in out.iterdir()}
    report = json.loads((out / "env.json").read_text())
    assert [s["step"] for s in report["steps"]] == ["gpu tests", "decode benchmark", "gpu benchmark"]
    decode = json.loads((out / "gpu-decode.json").read_text())  # bench/gpu_decode.py --smoke: reference kernels
    assert decode["kernels"] == "reference" and [size["rows"] for size in decode["sizes"]] == [4]
    assert decode["sizes"][0]["max_logit_diff"] < 1e-4  # float32: the decode step's logits are the forward's
    assert {"hf_eager", "hf_graph", "rlvr_eager"} <= set(decode["sizes"][0])
    assert report["machine"]["packages"]["torch"] and report["machine"]["cuda_available"] is False
    log = (out / "gpu-bench.log").read_text()
    assert "wrote" in log
    assert "profile: sampling" in log and "profile: forward_backward" in log and "aten::mm" in log  # --profile's tables
    record = json.loads((out / "gpu-bench.json").read_text())
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
