"""Everything that can be checked without the model is checked before it loads (``rlvr/app/checks.py``): a bad
loss, loss config, reward, data field, model name or run folder fails in under a second with the model loader
never called, and ``rlvr train --check`` prints the resolved configuration and stops."""

import json
import os
import time

import pytest
import yaml
from typer.testing import CliRunner

import rlvr.engine.engine
import rlvr.engine.models.load
from rlvr.app.checks import check_loss, check_out, check_run
from rlvr.app.settings import resolve_config
from rlvr.cli import app
from rlvr.errors import ConfigurationError, ModelLoadError

runner = CliRunner()
TINY = ["base_model=tiny", "steps=2", "eval_problems=2"]


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the checks must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model loader was called")

    monkeypatch.setattr(rlvr.engine.models.load, "load_base_model", refuse)
    monkeypatch.setattr(rlvr.engine.engine, "load_base_model", refuse)


def gsm8k_file(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def train(*args):
    started = time.monotonic()
    result = runner.invoke(app, ["train", *args])
    return result, time.monotonic() - started


@pytest.mark.parametrize(("args", "message"), [
    (["loss_fn=bogus"], "loss_fn='bogus' is not a built-in loss; choose one of ['cispo', 'dro', "
                        "'importance_sampling', 'ppo']"),
    (["loss_fn=ppoo"], "(did you mean 'ppo'?)"),
    (["loss_fn=cross_entropy"], "loss_fn='cross_entropy' needs loss_fn_inputs the RL loop does not make"),
    (["loss_fn=ppo", "loss_fn_config.clip_lo=0.5"], "loss_fn_config keys ['clip_lo'] are not used by loss_fn='ppo'"),
    (["loss_fn=dro"], "loss_fn='dro' needs loss_fn_config={'beta': ...}"),
    (["reward=no_such_reward"], "unknown reward 'no_such_reward'"),
    (["task.num_trian=5"], "task.num_trian: did you mean task.num_train?"),
])
def test_a_bad_setting_is_refused_before_any_model_loads_in_under_a_second(args, message, tmp_path, no_model):
    run = tmp_path / "run"
    result, took = train(*TINY, *args, f"out={run}")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert took < 1.0
    assert not run.exists()  # nothing written either


def test_a_missing_data_field_is_refused_before_the_model_loads(tmp_path, no_model):
    good = {"question": "1 + 1?", "answer": "2 #### 2"}
    data = gsm8k_file(tmp_path / "g.jsonl", [good] * 5 + [{"question": "2 + 2?", "solution": "4"}] + [good] * 4)
    run = tmp_path / "run"
    result, took = train(*TINY, "--recipe", "gsm8k", "--data", str(data), "task.test_fraction=0.2", f"out={run}")
    assert result.exit_code == 2, result.output
    assert "record 5 of split" in result.output and "KeyError: 'answer'" in result.output
    assert took < 1.0
    assert not run.exists()


def test_an_unknown_hub_id_without_the_hub_fails_in_seconds_with_the_whole_message(tmp_path, monkeypatch,
                                                                                     no_model):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    result, took = train("base_model=rlvr-tests/no-such-model", f"out={tmp_path / 'run'}")
    assert result.exit_code == 1, result.output
    assert took < 10.0
    error = " ".join(result.output.split())  # the CliRunner's terminal may wrap it; the words must all be there
    assert ("error: base_model='rlvr-tests/no-such-model' is neither a known name ('tiny', 'smollm2-135m'), a local "
            "folder, a .gguf file, nor a Hugging Face hub id this machine could load: HF_HUB_OFFLINE is set and the "
            "local Hugging Face cache does not hold it. Without hub access, use 'smollm2-135m' or a local path.") \
        in error


def test_the_loader_refuses_an_unknown_hub_id_offline_at_once_without_cutting_the_message(monkeypatch):
    """The engine's own load (rlvr eval, the server) asks no hub with HF_HUB_OFFLINE=1: no minute of retries."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    started = time.monotonic()
    with pytest.raises(ModelLoadError) as caught:
        rlvr.engine.models.load.load_base_model("rlvr-tests/no-such-model")
    assert time.monotonic() - started < 10.0
    assert str(caught.value).endswith("Without hub access, use 'smollm2-135m' or a local path.")


@pytest.mark.parametrize(("model", "message"), [
    ("./no/such/folder", "no such file or folder, and not a hub id"),
    ("missing.gguf", "GGUF file"),
])
def test_a_model_path_that_does_not_exist_is_refused(model, message, tmp_path, no_model):
    result, took = train(f"base_model={model}", f"out={tmp_path / 'run'}")
    assert result.exit_code == 1 and message in result.output, result.output
    assert took < 1.0


def test_a_model_folder_without_config_is_refused(tmp_path, no_model):
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ModelLoadError, match="a folder without config.json"):
        check_run(resolve_config(overrides=[f"base_model={folder}", f"out={tmp_path / 'run'}"]))


def test_a_run_folder_that_cannot_be_made_is_refused(tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(ConfigurationError, match="is a file, not a folder"):
        check_out(file)
    with pytest.raises(ConfigurationError, match="is a file, so the run folder cannot be created under it"):
        check_out(file / "run")
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigurationError, match="cannot create a folder in"):
            check_out(locked / "run")
    check_out(tmp_path / "new" / "run")  # made on demand: fine, and nothing is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["file", *(["locked"] if os.geteuid() else [])])


def test_the_losses_the_loop_can_train_with_come_from_the_loss_table():
    from rlvr.engine.train.losses import LOSSES

    for name in ("importance_sampling", "ppo", "cispo"):
        check_loss(name, None)
    check_loss("dro", {"beta": 0.1})
    for name in set(LOSSES) - {"importance_sampling", "ppo", "cispo", "dro"}:  # their inputs: not the loop's
        with pytest.raises(ConfigurationError, match="needs loss_fn_inputs the RL loop does not make"):
            check_loss(name, None)


def test_check_prints_the_resolved_config_and_loads_nothing(tmp_path, no_model):
    run = tmp_path / "run"
    for flag in ("--check", "--dry-run"):
        result, _ = train(flag, *TINY, "loss_fn=ppo", f"out={run}")
        assert result.exit_code == 0, result.output
        printed = yaml.safe_load(result.stdout)
        assert printed["steps"] == 2 and printed["loss_fn"] == "ppo" and printed["out"] == str(run)
        assert printed["reward"] == "math_correct" and printed["task"]["levels"] == [1]  # the recipe's presets
        assert "the model was not loaded" in result.stderr
        assert not run.exists()


def test_quick_cuts_the_recipe_to_a_first_look_and_overrides_still_apply():
    quick = resolve_config(quick=True)
    full = resolve_config()
    assert (quick.steps, quick.eval_problems, quick.save_every) == (3, 8, 0)
    assert (quick.base_model, quick.task, quick.reward) == (full.base_model, full.task, full.reward)
    assert resolve_config(quick=True, overrides=["steps=5"]).steps == 5
    rpn = resolve_config(recipe="rpn", quick=True)
    assert rpn.warmup.steps == 10 and rpn.warmup.batch_size == 32  # the recipe's own warm-up, shortened
    assert resolve_config(recipe="rpn", quick=True, overrides=["warmup.steps=0"]).warmup.steps == 0


def test_quick_on_the_command_line(tmp_path, no_model):
    result, _ = train("--quick", "--check", f"out={tmp_path / 'run'}")
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert (printed["steps"], printed["eval_problems"]) == (3, 8)
