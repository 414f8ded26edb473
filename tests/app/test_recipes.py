"""The recipe registry (``app/recipes/``): one definition per recipe, which the README's recipe table, ``rlvr train
--help``, ``recipe=`` and the source builder all follow; and the recipes' rules for a base model other than their
own (the token budget)."""

import re
import sys
import textwrap
from pathlib import Path

import pytest
import typer.rich_utils
import yaml
from typer.testing import CliRunner

import rlvr.app.recipes
from rlvr.app.recipes import DEFAULT, Data, Recipe, get_recipe, register
from rlvr.app.recipes import PRESETS as RECIPES
from rlvr.app.settings import resolve_config
from rlvr.app.sources import build_source
from rlvr.app.usage import RECIPES_FOLDER, recipe_model
from rlvr.cli import app
from rlvr.errors import ConfigurationError
from rlvr.rl.config import save_config

OTHER = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_recipes_budget_is_its_models_and_another_model_gets_the_stated_one(recipe):
    own, stated = RECIPES[recipe]["max_tokens"], RECIPES[recipe].get("other_models", {}).get("max_tokens")
    assert resolve_config(recipe=recipe).max_tokens == own
    model = RECIPES[recipe]["base_model"]
    assert resolve_config(recipe=recipe, overrides=[f"base_model={model}"]).max_tokens == own
    assert resolve_config(recipe=recipe, overrides=[f"base_model={OTHER}"]).max_tokens == (stated or own)


def test_gsm8k_on_another_model_gets_512_tokens_unless_set(tmp_path):
    """200 tokens (the 135M model's) cut 61% of a real 0.5B model's baseline answers: another model gets 512; a
    budget the user sets, in an override, a file or a saved run's config, is kept."""
    assert resolve_config(recipe="gsm8k", overrides=["base_model=smollm2"]).max_tokens == 200
    assert resolve_config(recipe="gsm8k", overrides=[f"base_model={OTHER}"]).max_tokens == 512
    assert resolve_config(recipe="gsm8k", overrides=[f"base_model={OTHER}", "max_tokens=300"]).max_tokens == 300
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"base_model": OTHER, "max_tokens": 64}))
    assert resolve_config(recipe="gsm8k", config_file=file).max_tokens == 64
    saved = tmp_path / "saved.yaml"
    save_config(resolve_config(recipe="gsm8k"), saved)  # a run on the recipe's model, resumed on another name
    assert resolve_config(config_file=saved, overrides=[f"base_model={OTHER}"]).max_tokens == 200
    assert "other_models" not in yaml.safe_load(saved.read_text())


# -- the one definition and what follows it -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| recipe | model | task and reward | defaults from |"


def readme_rows(readme: str) -> list[list[str]]:
    """The cells of each row of the README's recipe table (the one under :data:`HEADER`)."""
    lines = readme[readme.index(HEADER):].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]


def table_differences(readme: str) -> list[str]:
    """How the README's recipe table differs from the registry: each recipe a row, in the registry's order, with
    its model, description and origin as the registry has them."""
    rows = {row[0]: row for row in readme_rows(readme)}
    want = {f"`{r.name}`": [f"`{r.name}`", recipe_model(r), r.description, r.origin]
            for r in rlvr.app.recipes.RECIPES.values()}
    problems = [f"README row {name} names no recipe" for name in rows if name not in want]
    problems += [f"README lacks the row: | {' | '.join(row)} |" for name, row in want.items() if name not in rows]
    problems += [f"README row {name} should be: | {' | '.join(row)} |" for name, row in want.items()
                 if name in rows and rows[name] != row]
    if not problems and list(rows) != list(want):
        problems.append(f"README rows should be in the order {list(want)}")
    return problems


def plain(markdown: str) -> str:
    """``markdown`` as the help shows it: code spans and links as their text."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown.replace("`", ""))


def train_help() -> str:
    """``rlvr train --help`` as a terminal wide enough for one line per recipe and key shows it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)  # whatever $TERMINAL_WIDTH or $COLUMNS say
        result = CliRunner().invoke(app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def help_differences(text: str) -> list[str]:
    """How ``rlvr train --help``'s recipe list differs from the registry: a bullet per recipe, in its order, with
    its model and description; and the ``recipe`` key's choices."""
    section = text[text.index("Recipes (--recipe NAME"):text.index("Config keys")]
    shown = [line.strip().removeprefix("• ") for line in section.splitlines() if line.strip().startswith("•")]
    want = [f"{r.name} ({'default; ' if r.name == DEFAULT else ''}{recipe_model(r)}): {plain(r.description)}"
            for r in rlvr.app.recipes.RECIPES.values()]
    problems = [f"help lacks: {line}" for line in want if line not in shown]
    problems += [f"help shows a recipe the registry lacks: {line}" for line in shown if line not in want]
    choices = re.search(r"• recipe \(.*One of: (.*)\.", text)
    if choices is None or choices.group(1).split(", ") != list(rlvr.app.recipes.RECIPES):
        problems.append(f"help's recipe choices are not {list(rlvr.app.recipes.RECIPES)}")
    return problems


def test_the_readme_recipe_table_is_the_registry():
    assert table_differences((ROOT / "README.md").read_text(encoding="utf-8")) == []


def test_the_table_check_catches_a_renamed_recipe_a_changed_description_and_a_missing_row():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    gsm8k = get_recipe("gsm8k")
    row = next(line for line in readme.splitlines() if line.startswith("| `gsm8k` |"))
    renamed = readme.replace("| `gsm8k` |", "| `gsm8K` |")
    assert "README row `gsm8K` names no recipe" in table_differences(renamed)
    changed = readme.replace(gsm8k.description, gsm8k.description.replace("JSONL", "JSON"))
    assert [p for p in table_differences(changed) if p.startswith("README row `gsm8k` should be")]
    assert [p for p in table_differences(readme.replace(row + "\n", "")) if p.startswith("README lacks the row")]
    model = readme.replace(row, row.replace("LoRA 32", "LoRA 16"))
    assert [p for p in table_differences(model) if p.startswith("README row `gsm8k` should be")]


def test_rlvr_train_help_lists_the_registry():
    text = train_help()
    assert help_differences(text) == []
    assert "textarena (" in text and "\n" not in get_recipe("textarena").description  # the missing one
    assert RECIPES_FOLDER in text
    assert (ROOT / RECIPES_FOLDER).is_dir() and Path(rlvr.app.recipes.__file__).parent == ROOT / RECIPES_FOLDER


def test_the_help_check_catches_a_removed_recipe_and_a_changed_description():
    text = train_help()
    line = next(line for line in text.splitlines() if line.strip().startswith("• textarena ("))
    assert "help lacks: textarena (" in " ".join(help_differences(text.replace(line + "\n", "")))
    changed = text.replace(line, line.replace("two-player", "three-player"))
    assert any(p.startswith("help shows a recipe the registry lacks: textarena") for p in help_differences(changed))
    choices = text.replace("rpn, textarena.", "rpn.")
    assert any("recipe choices" in p for p in help_differences(choices))


COUNTDOWN = Recipe(
    name="countdown", description="a test recipe: procedural `a + b` on `tiny`", origin="this test",
    presets={"base_model": "tiny", "rank": 4, "steps": 3, "problems_per_step": 2, "max_tokens": 6,
             "task": {"levels": [1], "num_train": 20, "num_test": 8}},
    data=Data.GENERATED, problems=lambda: __import__("rlvr.tasks", fromlist=["x"]).ArithmeticSource)


@pytest.fixture
def countdown():
    """:data:`COUNTDOWN` registered for one test."""
    register(COUNTDOWN)
    yield COUNTDOWN
    del rlvr.app.recipes.RECIPES[COUNTDOWN.name]


def test_a_registered_recipe_is_in_the_help_resolves_builds_and_is_asked_for_in_the_readme(countdown, tmp_path):
    assert "countdown" in rlvr.app.recipes.RECIPES and RECIPES["countdown"]["steps"] == 3
    text = train_help()
    assert help_differences(text) == []
    assert "• countdown (tiny, LoRA 4): a test recipe: procedural a + b on tiny" in text
    assert re.search(r"• steps \(int, default 20; [^)]*\bcountdown 3\)", text)  # beside the default recipe's
    config = resolve_config(overrides=["recipe=countdown"])  # rlvr train recipe=countdown
    assert (config.recipe, config.base_model, config.steps, config.rank) == ("countdown", "tiny", 3, 4)
    assert type(build_source(config)).__name__ == "ArithmeticSource"
    result = CliRunner().invoke(app, ["train", "--check", "--recipe", "countdown", f"out={tmp_path / 'run'}"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["task"]["num_train"] == 20
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table_differences(readme) == ["README lacks the row: | `countdown` | tiny, LoRA 4 | a test recipe: "
                                         "procedural `a + b` on `tiny` | this test |"]


def test_a_recipe_is_one_module_of_the_package(tmp_path, monkeypatch):
    """A module with a ``RECIPE`` dropped beside the others is found; one without is refused by name."""
    package = tmp_path / "more"
    package.mkdir()
    (package / "countup.py").write_text(textwrap.dedent("""
        from rlvr.app.recipes.base import Data, Recipe
        RECIPE = Recipe(name="countup", description="one line", origin="a test", presets={"base_model": "tiny"},
                        data=Data.GENERATED, problems=lambda: None)
    """))
    monkeypatch.setattr(rlvr.app.recipes, "__path__", [*rlvr.app.recipes.__path__, str(package)])
    monkeypatch.delitem(sys.modules, "rlvr.app.recipes.countup", raising=False)
    found = rlvr.app.recipes._discover()
    assert list(found) == sorted([*rlvr.app.recipes.RECIPES, "countup"])
    assert found["countup"].presets == {"base_model": "tiny"}
    (package / "stray.py").write_text("X = 1\n")
    with pytest.raises(ConfigurationError, match=r"rlvr.app.recipes.stray defines no RECIPE = Recipe\(...\)"):
        rlvr.app.recipes._discover()
    sys.modules.pop("rlvr.app.recipes.countup", None)
    sys.modules.pop("rlvr.app.recipes.stray", None)


@pytest.mark.parametrize("change, message", [
    ({"env": lambda config: None}, "exactly one of problems= .* and env="),
    ({"problems": None}, "exactly one of problems="),
    ({"data": Data.NONE}, "data=Data.NONE goes with env="),
    ({"presets": {"steps": 3}}, "presets must name base_model"),
    ({"description": "two\nlines"}, "description must be one line"),
    ({"origin": "a | b"}, "origin must be one line of text without '\\|'"),
    ({"name": "two words"}, "name must be one word"),
])
def test_a_bad_recipe_is_refused_naming_the_field(change, message):
    fields = {"name": "x", "description": "d", "origin": "o", "presets": {"base_model": "tiny"},
              "data": Data.GENERATED, "problems": lambda: None, **change}
    with pytest.raises(ConfigurationError, match=message):
        Recipe(**fields)


def test_a_taken_name_and_an_unknown_one_are_refused():
    with pytest.raises(ConfigurationError, match="recipe 'gsm8k' is registered already"):
        register(get_recipe("gsm8k"))
    with pytest.raises(ConfigurationError, match=r"recipe='gsm8': choose one of .* \(did you mean 'gsm8k'\?\)"):
        get_recipe("gsm8")
    with pytest.raises(ConfigurationError, match=r"did you mean 'textarena'"):
        resolve_config(recipe="textarna")


def test_each_recipes_data_rule_is_what_its_source_does(tmp_path):
    """Generated recipes refuse a data file, data-set recipes need one, env recipes refuse one: the rule each
    recipe states is the one build_source applies."""
    file = tmp_path / "x.jsonl"
    file.write_text("{}\n")
    for name, recipe in rlvr.app.recipes.RECIPES.items():
        if recipe.data is Data.GENERATED:
            with pytest.raises(ConfigurationError, match="generates its problems; data files go with gsm8k, "
                                                         "humaneval, math, mbpp$"):
                build_source(resolve_config(recipe=name, overrides=[f"data={file}"]))
        elif recipe.data is Data.FILE:
            with pytest.raises(ConfigurationError, match=f"recipe {name!r} needs data"):
                build_source(resolve_config(recipe=name))
        elif recipe.data is Data.NONE:
            with pytest.raises(ConfigurationError, match=f"recipe {name!r} plays games"):
                build_source(resolve_config(recipe=name, overrides=[f"data={file}"]))
        else:
            assert recipe.data is Data.PACKAGE
            with pytest.raises(ConfigurationError, match=f"data: {name} takes one file"):
                build_source(resolve_config(recipe=name, base={"data": {"train": str(file)}}))


def test_data_hub_for_a_source_without_a_hub_data_set_is_refused_by_name():
    class Local:  # a ProblemSource class that reads files only
        def __init__(self, data, test_fraction=0.1):
            self.data = data

    recipe = register(Recipe(name="local-only", description="d", origin="o", presets={"base_model": "tiny"},
                             data=Data.FILE, problems=lambda: Local))
    try:
        with pytest.raises(ConfigurationError, match="data=hub: recipe 'local-only' names no hub data set"):
            build_source(resolve_config(recipe="local-only", overrides=["data=hub"]))
    finally:
        del rlvr.app.recipes.RECIPES[recipe.name]
