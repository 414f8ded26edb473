"""The code_tests reward through the sandbox: code extraction, the 1.0 / 0.5 x fraction / -0.5 values, setup code,
and MBPP's reference programs passing their own tests."""

import json
import re
from pathlib import Path

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rewards import CodeTests, RewardError, extract_code, resolve_reward, score_batch
from rlvr.sandbox import Sandbox

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"]


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(num_workers=2, timeout=5.0) as box:
        yield box


@pytest.mark.parametrize(("response", "expected"), [
    ("Here:\n```python\ndef f():\n    return 1\n```\nand usage ```\nf()\n```", "def f():\n    return 1"),
    ("```\nx = 1\n```", "x = 1"),
    ("```bash\nls\n```\n```py\ny = 2\n```", "y = 2"),
    ("```python\ndef g():\n    return 2", "def g():\n    return 2"),   # truncated: no closing fence
    ("def h():\n    return 3\n", "def h():\n    return 3"),             # no fence: the whole response
])
def test_extract_code(response, expected):
    assert extract_code(response) == expected


@pytest.mark.parametrize(("program", "expected"), [
    ("def add(a, b):\n    return a + b", 1.0),                      # all pass
    ("def add(a, b):\n    return 3", 0.5 * 1 / 3),                  # only add(1, 2) == 3 passes
    ("def add(a, b):\n    return a * b", 0.5 * 1 / 3),              # only add(0, 0) == 0 passes
    ("def add(a, b):\n    return 7", -0.5),                         # none pass
    ("def add(a, b) return a + b", -0.5),                           # does not compile
    ("raise SystemExit(0)", -0.5),                                  # exits before the tests
])
def test_code_tests_values(sandbox, program, expected):
    reward = resolve_reward("code_tests", sandbox=sandbox)
    assert reward("p", f"```python\n{program}\n```", {"tests": TESTS}) == pytest.approx(expected)


def test_code_tests_timeout_is_a_failure_not_a_hang(sandbox):
    reward = resolve_reward("code_tests", sandbox=sandbox, timeout=1.0)
    assert reward("p", "while True:\n    pass", {"test_list": TESTS}) == -0.5


def test_code_tests_custom_values(sandbox):
    reward = CodeTests(pass_reward=2.0, partial_scale=1.0, fail_reward=0.0, sandbox=sandbox)
    meta = {"tests": TESTS}
    assert reward("p", "def add(a, b):\n    return a + b", meta) == 2.0
    assert reward("p", "def add(a, b):\n    return 3", meta) == pytest.approx(1 / 3)
    assert reward("p", "def add(a, b):\n    return 7", meta) == 0.0


def test_setup_code_runs_before_and_test_setup_code_after_the_program(sandbox):
    reward = resolve_reward("code_tests", sandbox=sandbox)
    # setup_code (trusted, before): the program may use what it imports.
    before = {"tests": ["assert area(2) == 4"], "setup_code": "import math"}
    assert reward("p", "def area(r):\n    return math.floor(r * r)", before) == 1.0
    # MBPP's test_setup_code (after the program, before each test): it may use the program's classes.
    after = {"test_list": ["assert size(t) == 2"], "test_setup_code": "t = Node(Node(None))"}
    program = "class Node:\n    def __init__(self, nxt):\n        self.nxt = nxt\ndef size(n):\n" \
              "    return 0 if n is None else 1 + size(n.nxt)"
    assert reward("p", program, after) == 1.0


def test_a_job_the_sandbox_cannot_run_raises(sandbox):
    reward = resolve_reward("code_tests", sandbox=sandbox)
    with pytest.raises(RewardError, match="setup_code raised"):
        reward("p", "x = 1", {"tests": ["assert x == 1"], "setup_code": "raise ValueError('broken fixture')"})


def test_missing_tests_and_bad_arguments():
    reward = resolve_reward("code_tests")
    with pytest.raises(ConfigurationError, match=r"meta\['tests'\]"):
        reward("p", "x = 1", {"answer": "1"})
    with pytest.raises(ConfigurationError, match="list of test strings"):
        reward("p", "x = 1", {"tests": "assert x == 1"})
    with pytest.raises(ConfigurationError, match="sandbox"):
        CodeTests(sandbox="local")
    with pytest.raises(ConfigurationError, match="fail_reward"):
        CodeTests(fail_reward="low")


def mbpp_rows() -> list[dict]:
    paths = [DATA / "mbpp" / "train.jsonl", DATA / "mbpp" / "validation.jsonl"]
    if not all(p.is_file() for p in paths):
        pytest.skip(f"MBPP data not found under {DATA / 'mbpp'} (the shared data folder sits at ../shared/data)")
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_mbpp_reference_programs_pass_and_wrong_functions_fail(sandbox):
    rows = mbpp_rows()
    assert len(rows) == 374 + 90
    reward = resolve_reward("code_tests", sandbox=sandbox)
    items = [("", f"```python\n{row['code']}\n```", row) for row in rows]  # the row is MBPP meta as it comes
    scores = score_batch(reward, items)
    assert scores.errors == 0 and scores.timeouts == 0, scores.failures[:3]
    passed = sum(s == 1.0 for s in scores.scores)
    assert passed >= 0.99 * len(rows), f"{passed}/{len(rows)} MBPP reference programs passed their tests"
    # The same programs with the tested function replaced by one that returns None.
    wrong_items = []
    for row in rows:
        name = re.match(r"assert\s*\(?\s*(?:not\s+)?\(?\s*(?:math\.isclose\()?\s*(\w+)\s*\(", row["test_list"][0])
        assert name, row["test_list"][0]
        wrong = f"{row['code']}\n\ndef {name.group(1)}(*args, **kwargs):\n    return None\n"
        wrong_items.append(("", wrong, row))
    wrong_scores = score_batch(reward, wrong_items)
    failed = sum(s is not None and s < 1.0 for s in wrong_scores.scores)
    assert failed >= 0.99 * len(rows), f"only {failed}/{len(rows)} wrong functions failed their tests"


def test_a_sandbox_is_not_used_from_a_forked_worker(sandbox):
    reward = resolve_reward("code_tests", sandbox=sandbox)
    wrapped = score_batch(lambda p, r, m=None: reward(p, r, m), [("p", "x = 1", {"tests": ["assert x == 1"]})])
    assert wrapped.scores == [None] and "forked child" in wrapped.failures[0].message
    assert score_batch(reward, [("p", "x = 1", {"tests": ["assert x == 1"]})]).scores == [1.0]  # inline: fine


def test_values_match_the_mbpp_seed_compute_reward(sandbox):
    """Seed 001's compute_reward(all_passed, num_passed, total_tests), run as written, agrees with code_tests."""
    seeds = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"
    texts = [p.read_text() for p in sorted(seeds.glob("*.txt"))] if seeds.is_dir() else []
    blocks = [b for t in texts for b in re.findall(r"```python\n(.*?)```", t, re.S) if "def compute_reward(" in b]
    if not blocks:
        pytest.skip(f"no seed document under {seeds} defines compute_reward")
    scope: dict = {}
    exec(blocks[0], scope)
    reward = resolve_reward("code_tests", sandbox=sandbox)
    programs = ["def add(a, b):\n    return a + b", "def add(a, b):\n    return 3", "def add(a, b):\n    return 7",
                "syntax error here"]
    results = sandbox.run_many([{"code": p, "tests": TESTS} for p in programs])
    for result in results:
        expected = scope["compute_reward"](result.passed, result.num_passed, result.num_tests)
        assert reward.value(result) == pytest.approx(expected)
    assert [reward.value(r) for r in results] == pytest.approx([1.0, 0.5 / 3, -0.5, -0.5])
