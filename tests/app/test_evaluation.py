"""``rlvr eval`` (``rlvr/app/evaluation.py``): it says so when the held-out split has fewer problems than asked, and
refuses one with none before the model loads."""

import json

import pytest
from typer.testing import CliRunner

from rlvr.cli import app

runner = CliRunner()


def test_eval_warns_when_it_has_fewer_problems_than_asked(tmp_path):
    data = tmp_path / "ten.jsonl"  # gsm8k's recipe holds out a tenth: one problem
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(10)))
    args = ["eval", "--recipe", "gsm8k", "--data", str(data), "base_model=tiny", "max_tokens=2",
            "--out", str(tmp_path / "eval.jsonl")]
    result = runner.invoke(app, [*args, "--problems", "2"])
    assert result.exit_code == 0, result.output
    assert "warning: 2 problems asked, but the 'test' split holds 1: evaluating 1" in result.stderr
    assert "problems             1" in result.stdout
    quiet = runner.invoke(app, [*args, "--problems", "1"])
    assert quiet.exit_code == 0 and "problems asked" not in quiet.output, quiet.output  # (the clipped warning stays)


def test_eval_refuses_a_split_with_no_problems_before_the_model_loads(tmp_path, monkeypatch):
    import rlvr.engine.engine

    monkeypatch.setattr(rlvr.engine.engine, "load_base_model", lambda *a, **k: pytest.fail("the model loaded"))
    data = tmp_path / "four.jsonl"  # a tenth of 4, rounded: nothing held out
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(4)))
    result = runner.invoke(app, ["eval", "--recipe", "gsm8k", "--data", str(data), "base_model=tiny"])
    assert result.exit_code == 2
    assert "the 'test' split of recipe 'gsm8k' holds no problems to evaluate" in result.output
