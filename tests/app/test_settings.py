"""Run configuration: precedence, dotted overrides, strict validation with suggestions, and speed of failure."""

import resource
import subprocess
import sys

import pytest
import yaml

from rlvr.app.recipes import PRESETS as RECIPES
from rlvr.app.settings import TrainConfig, options, parse_overrides, resolve_config
from rlvr.errors import ConfigurationError
from rlvr.numerics import PRECISIONS
from rlvr.rl.config import save_config


def test_precedence_defaults_recipe_file_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"recipe": "rpn", "steps": 7, "group_size": 4, "task": {"max_operand": 5}}))
    config = resolve_config(config_file=path, overrides=["steps=9", "task.num_test=10"])
    assert isinstance(config, TrainConfig)
    assert config.recipe == "rpn"
    assert config.steps == 9                                  # override beats file
    assert config.group_size == 4                             # file beats recipe (rpn presets 8)
    assert config.rank == RECIPES["rpn"]["rank"]              # recipe beats default
    assert config.temperature == 1.0                          # default
    # nested dicts merge key by key: the recipe's other task keys survive
    assert config.task["max_operand"] == 5 and config.task["num_test"] == 10
    assert config.task["complexity_range"] == RECIPES["rpn"]["task"]["complexity_range"]


def test_recipe_argument_beats_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("recipe: rpn\n")
    assert resolve_config(recipe="arithmetic", config_file=path).recipe == "arithmetic"


def test_overrides_parse_yaml_values_and_nest():
    assert parse_overrides(["a.b.c=1", "d=[1, 2]", "e=null", "f=ppo", "g=1e-3", "h=true"]) == {
        "a": {"b": {"c": 1}}, "d": [1, 2], "e": None, "f": "ppo", "g": 1e-3, "h": True}
    config = resolve_config(overrides=["distributed.backend=ray", "loss_fn_config.clip_low_threshold=0.8",
                                       "warmup.steps=3", "learning_rate=1e-3"])
    assert config.distributed.backend == "ray"
    assert config.loss_fn_config == {"clip_low_threshold": 0.8}
    assert config.warmup.steps == 3 and config.learning_rate == 1e-3


@pytest.mark.parametrize("recipe", ["gsm8k", "mbpp", "rpn"])
def test_a_recipes_warm_up_runs_on_its_own_model_and_elsewhere_only_when_asked(recipe, tmp_path):
    """The recipe table's rule: the warm-up a recipe presets is for the model it names (under any of its names);
    another base_model (a folder, a GGUF file, a hub id) starts RL at once unless a layer sets warmup.steps, which
    then uses the recipe's other warm-up presets. A saved run's config keeps what it ran."""
    preset = RECIPES[recipe]["warmup"]
    own = RECIPES[recipe]["base_model"]
    aliases = ["HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"] if own == "smollm2-135m" else []
    for model in (None, own, *aliases):
        overrides = [f"base_model={model}"] if model else []
        assert resolve_config(recipe=recipe, overrides=overrides).warmup.steps == preset["steps"], model
    other = str(tmp_path / "qwen2.5-0.5b-instruct-q4_k_m.gguf")
    config = resolve_config(recipe=recipe, overrides=[f"base_model={other}"])
    assert config.warmup.steps == 0
    assert (config.warmup.batch_size, config.warmup.learning_rate) == (preset["batch_size"], preset["learning_rate"])
    assert config.rank == RECIPES[recipe]["rank"]
    asked = resolve_config(recipe=recipe, overrides=[f"base_model={other}", "warmup.steps=5"])
    assert asked.warmup.steps == 5 and asked.warmup.batch_size == preset["batch_size"]
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "warmup": {"steps": 7}}))
    assert resolve_config(recipe=recipe, config_file=file).warmup.steps == 7
    file.write_text(yaml.safe_dump({"base_model": "Qwen/Qwen2.5-0.5B-Instruct"}))
    assert resolve_config(recipe=recipe, config_file=file).warmup.steps == 0
    assert resolve_config(recipe=recipe, config_file=file, overrides=[f"base_model={own}"]).warmup.steps > 0
    saved = tmp_path / "saved.yaml"
    save_config(resolve_config(recipe=recipe), saved)  # a run on the recipe's model, resumed on another name
    assert resolve_config(config_file=saved, overrides=[f"base_model={other}"]).warmup.steps == preset["steps"]


def test_a_task_config_override_is_a_yaml_mapping_and_belongs_to_its_dataset():
    """``task.config={...}`` parses as a mapping; the reasoning-gym recipe's preset config is for its preset dataset,
    so naming another dataset drops it, while naming none merges key by key as any nested setting does."""
    preset = RECIPES["reasoning-gym"]["task"]
    assert parse_overrides(["task.config={min_animals: 1, max_animals: 2}"]) == {
        "task": {"config": {"min_animals": 1, "max_animals": 2}}}
    config = resolve_config(recipe="reasoning-gym", overrides=["task.name=leg_counting",
                                                               "task.config={min_animals: 1, max_animals: 2}"])
    assert config.task["name"] == "leg_counting" and config.task["config"] == {"min_animals": 1, "max_animals": 2}
    assert config.task["num_test"] == preset["num_test"]              # the other presets stay
    assert "config" not in resolve_config(recipe="reasoning-gym", overrides=["task.name=gcd"]).task
    config = resolve_config(recipe="reasoning-gym", overrides=["task.config.max_terms=3"])
    assert config.task["config"] == {**preset["config"], "max_terms": 3}
    config = resolve_config(recipe="reasoning-gym", overrides=[
        "task.name=composite", "task.config={datasets: [{name: gcd, weight: 2}, {name: lcm, config: {max_value: 9}}]}"])
    assert config.task["config"] == {"datasets": [{"name": "gcd", "weight": 2},
                                                  {"name": "lcm", "config": {"max_value": 9}}]}


@pytest.mark.parametrize(("overrides", "named"), [
    (["stpes=3"], "'stpes' (did you mean 'steps'?)"),
    (["distributed.bakend=ray"], "'distributed.bakend' (did you mean 'distributed.backend'?)"),
    (["warmup.step=3"], "'warmup.step' (did you mean 'warmup.steps'?)"),
    (["steps=many"], "steps: Input should be a valid integer"),
    (["group_size=1"], "group_size=1"),
    (["recipe=arithmatic"], "did you mean 'arithmetic'?"),
    (["data=/no/such/file.jsonl"], "data: file '/no/such/file.jsonl' does not exist"),
    (["steps"], "override 'steps': write key=value"),
    (["distributed=3"], "distributed"),
    (["stream_minibatches=-1"], "stream_minibatches=-1"),
    (["stream_minibatches=3", "num_substeps=2"], "a multiple of num_substeps=2"),
    (["max_steps_off_policy=-1"], "max_steps_off_policy=-1"),
    (["precision=float16"], "precision='float16': choose one of ['float32', 'bfloat16']"),
])
def test_bad_config_names_the_key(overrides, named):
    with pytest.raises(ConfigurationError) as info:
        resolve_config(overrides=overrides)
    assert named in str(info.value)


def test_precision_choices_are_the_engines():
    from rlvr import numerics as precision  # the one list, torch-free, which the engine reads too

    assert PRECISIONS is precision.PRECISIONS


def test_bad_config_file(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        resolve_config(config_file=tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("steps: [1,\n")
    with pytest.raises(ConfigurationError, match="not valid YAML"):
        resolve_config(config_file=tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigurationError, match="mapping"):
        resolve_config(config_file=tmp_path / "list.yaml")


def test_saved_config_round_trips(tmp_path):
    config = resolve_config(recipe="rpn", overrides=["steps=3", "distributed.num_samplers=2"])
    save_config(config, tmp_path / "config.yaml")
    again = resolve_config(base=yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert again == config


def test_every_option_is_documented():
    keys = {key: doc for key, _, _, doc in options()}
    assert "distributed.backend" in keys and "warmup.learning_rate" in keys and "task" in keys
    assert all(keys.values()), [k for k, doc in keys.items() if not doc]


@pytest.mark.parametrize("argv", [["train", "stpes=3"], ["train", "task.levls=[1]"],
                                  ["train", "--recipe", "gsm8k", "--data", "/no/such.jsonl"],
                                  ["train", "steps=abc"]])
def test_cli_rejects_a_bad_config_in_under_a_second(argv):
    """The whole process, interpreter start included: validation happens before torch or the model load. Measured
    as the child's CPU time, which is its wall time on a quiet machine and does not grow when the machine is busy."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", "import sys; from rlvr.cli import app; app(); ", *argv],
                          capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 2, done.stderr
    key = argv[-1].split("=")[0] if "=" in argv[-1] else "data"
    assert key in done.stderr and "error:" in done.stderr
    assert cpu < 1.0, f"took {cpu:.2f}s of CPU"


def test_cli_does_not_load_torch_to_check_a_config():
    code = ("import sys\nfrom rlvr.cli import app\ntry:\n    app(['train', 'stpes=3'])\nexcept SystemExit:\n"
            "    pass\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr
