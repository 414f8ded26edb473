"""``rlvr eval`` (``rlvr/app/evaluation.py``): it says so when the held-out split has fewer problems than asked."""

import json

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
    assert quiet.exit_code == 0 and "warning" not in quiet.output, quiet.output
