"""``rlvr.export`` and ``rlvr export``: which checkpoint a run folder, a run name or a checkpoint path means, the three
outputs from the command line, and one-line errors that name the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

import rlvr
from datums import ce_datum
from rlvr import types
from rlvr.cli import app
from rlvr.errors import CheckpointNotFoundError
from rlvr.rl.checkpoints import own_checkpoints, record_checkpoint
from rlvr.weights import checkpoint_of

runner = CliRunner()
TOKENS = [5, 72, 101, 108, 108, 111, 257, 3]


def steps(tc, n: int) -> None:
    for _ in range(n):
        tc.forward_backward([ce_datum(TOKENS)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()


@pytest.fixture(scope="module")
def run(service, tmp_path_factory):
    """A run folder as ``rlvr train`` leaves one: its checkpoints inside it, listed in checkpoints.jsonl."""
    run_dir = tmp_path_factory.mktemp("runs") / "arith"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"base_model": "tiny", "steps": 2}))
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=9)
    own_checkpoints(run_dir, tc)
    paths = []
    for step in (1, 2):
        steps(tc, 2)
        paths.append(tc.save_state(f"step-{step:06d}").result().path)
        record_checkpoint(run_dir, {"step": step, "state_path": paths[-1]})
    return run_dir, tc.model_id, paths


def logprobs_of(model: torch.nn.Module) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([TOKENS])).logits[0], -1).numpy()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_run_folder_a_run_name_and_a_checkpoint_path_name_the_same_checkpoint(run):
    run_dir, run_id, paths = run
    assert checkpoint_of(run_dir) == paths[-1]  # the last one
    assert checkpoint_of(run_id) == paths[-1]
    assert checkpoint_of(paths[0]) == paths[0]
    folder = run_dir / "checkpoints" / "weights" / "step-000001"
    assert checkpoint_of(folder) == str(folder)


def test_a_name_of_checkpoints_saved_through_the_api_means_the_newest(service):
    tc = service.create_lora_training_client(base_model="tiny", rank=4, seed=10)
    tc.save_state("a").result()
    newest = tc.save_weights_for_sampler("b").result().path
    assert checkpoint_of(tc.model_id) == newest


def test_rlvr_export_on_a_run_writes_all_three_forms(service, run, tmp_path):
    run_dir, _, paths = run
    out = invoke("export", str(run_dir), "--merged", str(tmp_path / "merged"), "--adapter", str(tmp_path / "lora"),
                 "--gguf", str(tmp_path / "model.gguf"), "--gguf-type", "q8_0", "--dtype", "float32")
    assert f"merged   {tmp_path / 'merged'}" in out and "adapter" in out and "model.gguf" in out
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    expected = service.create_sampling_client(model_path=paths[-1]).compute_logprobs(
        types.ModelInput.from_ints(TOKENS)).result()[1:]
    got = logprobs_of(merged)[np.arange(len(TOKENS) - 1), TOKENS[1:]]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert json.loads((tmp_path / "lora" / "adapter_config.json").read_text())["r"] == 4
    assert (tmp_path / "model.gguf").read_bytes()[:4] == b"GGUF"


def test_the_python_face_is_rlvr_export(run, tmp_path):
    run_dir, _, _ = run
    done = rlvr.export(run_dir, adapter=tmp_path / "lora")
    assert done.adapter == tmp_path / "lora" and done.merged is None and done.gguf is None
    assert "export" in rlvr.__all__


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_a_missing_path_is_one_line_naming_it(tmp_path):
    result = runner.invoke(app, ["export", str(tmp_path / "nope"), "--adapter", str(tmp_path / "a")])
    assert result.exit_code == 1
    assert "nope" in error_line(result) and "rlvr runs" in error_line(result)
    with pytest.raises(CheckpointNotFoundError):
        checkpoint_of("no-such-run")


def test_a_run_without_checkpoints_says_so(tmp_path):
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "config.yaml").write_text("steps: 1\n")
    result = runner.invoke(app, ["export", str(tmp_path / "fresh"), "--adapter", str(tmp_path / "a")])
    assert result.exit_code == 1 and "has no checkpoint yet" in error_line(result)


def test_a_non_empty_destination_needs_force(run, tmp_path):
    run_dir, _, _ = run
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["export", str(run_dir), "--adapter", str(tmp_path / "lora")])
    assert result.exit_code == 2 and "--force" in error_line(result)
    assert (tmp_path / "lora" / "notes.txt").exists()
    invoke("export", str(run_dir), "--adapter", str(tmp_path / "lora"), "--force")
    assert sorted(p.name for p in (tmp_path / "lora").iterdir()) == ["adapter_config.json",
                                                                     "adapter_model.safetensors"]


def test_no_output_asked_for_names_the_options(run):
    result = runner.invoke(app, ["export", str(run[0])])
    assert result.exit_code == 2
    line = error_line(result)
    assert "--merged" in line and "--adapter" in line and "--gguf" in line


def test_a_bad_dtype_names_the_choices(run, tmp_path):
    result = runner.invoke(app, ["export", str(run[0]), "--merged", str(tmp_path / "m"), "--dtype", "fp8"])
    assert result.exit_code == 2 and "float32" in error_line(result) and "bfloat16" in error_line(result)


def test_a_bare_name_is_a_folder_of_runs_first(run, tmp_path, monkeypatch):
    run_dir, _, paths = run
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine").symlink_to(run_dir, target_is_directory=True)
    assert checkpoint_of("mine") == paths[-1]


def test_rlvr_export_prints_one_progress_line_and_no_library_warnings(run, tmp_path):
    """No FutureWarning from transformers' internals (peft calls them), no progress bars drawn by the libraries: one
    line saying what is being written, then the paths."""
    import warnings

    run_dir, _, paths = run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(app, ["export", str(run_dir), "--merged", str(tmp_path / "merged"), "--gguf",
                                     str(tmp_path / "model.gguf")])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"exporting {paths[-1]} (base model tiny): merged folder, GGUF (f16)"]
    assert result.stdout.splitlines() == [f"merged   {tmp_path / 'merged'}", f"gguf     {tmp_path / 'model.gguf'}"]
    assert [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
