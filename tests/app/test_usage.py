"""``rlvr train --help``'s facts come from the code (``app/usage.py``): each key's default is the value a run
resolves to, the other recipes' values beside it are theirs, ``out`` is the run-folder rule, and the losses are the
ones the RL loop can train with."""

import dataclasses
import re
import subprocess
import sys

import pytest
import typer.rich_utils
from typer.testing import CliRunner

from rlvr.app.checks import check_loss
from rlvr.app.recipes import RECIPES
from rlvr.app.run import with_run_folder
from rlvr.app.settings import options, resolve_config
from rlvr.app.usage import default_values, run_values
from rlvr.cli import app
from rlvr.errors import ConfigurationError

NESTED = {key.split(".")[0] for key, *_ in options() if "." in key}
"""The settings that are dataclasses of their own (``warmup``, ``distributed``)."""


def flat(values: dict) -> dict:
    """A config as ``dataclasses.asdict`` gives it, nested settings as dotted keys (``warmup.steps``)."""
    out = {}
    for key, value in values.items():
        out.update({f"{key}.{k}": v for k, v in value.items()} if key in NESTED else {key: value})
    return out


@pytest.fixture(scope="module")
def help_text() -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)  # one line per key, whatever the terminal says
        result = CliRunner().invoke(app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_values_the_help_gives_are_the_ones_a_run_resolves_to(recipe):
    resolved = flat(dataclasses.asdict(resolve_config(recipe=recipe)))
    shown = run_values(RECIPES[recipe])
    assert set(shown) == set(resolved)
    assert {k: v for k, v in shown.items() if k != "out"} == {k: v for k, v in resolved.items() if k != "out"}


def test_the_help_says_what_the_default_run_uses(help_text):
    """The issue's disagreements: eval_problems is the default recipe's 64, out is a new runs/<recipe>-<time>."""
    assert default_values()["eval_problems"] == resolve_config().eval_problems == 64
    assert "• eval_problems (int, default 64; humaneval 32, mbpp 32, textarena 16): " in help_text
    assert "• out (str, default runs/<recipe>-<time>): " in help_text
    assert re.fullmatch(r"runs/arithmetic-\d{8}-\d{6}", with_run_folder(resolve_config()).out)


def test_the_help_lists_the_losses_the_loop_can_train_with(help_text):
    """Those the loss table holds and ``check_loss`` (the engine's table, torch loaded) accepts for the RL loop."""
    from rlvr.engine.train.losses import LOSSES

    accepted, refused = [], []
    for name in sorted(LOSSES):
        try:
            check_loss(name, {"beta": 0.1} if name == "dro" else None)
            accepted.append(name)
        except ConfigurationError as exc:
            assert "the RL loop does not make" in str(exc)
            refused.append(name)
    shown = re.search(r"• loss_fn \(.*One of: (.*) \((.*) need inputs the RL loop does not make\)\.", help_text)
    assert shown is not None, help_text
    assert shown.group(1).split(", ") == accepted and shown.group(2).split(", ") == refused
    assert sorted(accepted + refused) == sorted(LOSSES)  # every row of the table, on one side or the other


def test_the_help_loads_neither_torch_nor_a_task():
    code = ("import sys\nfrom rlvr.cli import app\ntry:\n    app(['train', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint('torch' in sys.modules, 'rlvr.tasks' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "False False", done.stderr
