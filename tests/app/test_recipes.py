"""The recipe table's rules for a base model other than the recipe's own: its token budget."""

import pytest
import yaml

from rlvr.app.recipes import PRESETS as RECIPES
from rlvr.app.settings import resolve_config
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
