"""Batch scoring in killable workers: hangs and crashes are counted, logged and reported, never scored 0."""

import logging
import math
import os
import time

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rewards import RewardItem, RewardRunner, format_correct, resolve_reward, score_batch
from rlvr.sandbox import Sandbox


def judge(prompt, response, meta=None):
    """A reward with every way to misbehave, chosen by the response."""
    if response == "sleep":
        time.sleep(3600)
    if response == "raise":
        raise ValueError("cannot judge this")
    if response == "none":
        return None
    if response == "nan":
        return math.nan
    if response == "exit":
        os._exit(3)
    if response == "stubborn":  # swallows everything it can; only SIGKILL ends it
        while True:
            try:
                time.sleep(3600)
            except BaseException:
                pass
    return float(len(response))


def test_a_hanging_and_a_raising_reward_are_reported_while_the_others_are_scored(caplog):
    items = [("p", r) for r in ["a", "sleep", "bb", "raise", "ccc"]]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        scores = score_batch(judge, items, timeout=1.0, num_workers=2)
    assert time.monotonic() - started < 6
    assert scores.scores == [1.0, None, 2.0, None, 3.0]
    assert (scores.errors, scores.timeouts, scores.failed) == (1, 1, 2)
    metrics = scores.metrics()
    assert metrics["reward/errors:sum"] == 1.0 and metrics["reward/timeouts:sum"] == 1.0
    assert metrics["reward/scored:sum"] == 3.0 and metrics["reward/mean"] == 2.0  # mean of 1, 2, 3: not of 0s
    by_kind = {f.kind: f for f in scores.failures}
    assert by_kind["timeout"].response == "sleep" and by_kind["timeout"].index == 1
    assert by_kind["error"].response == "raise" and "ValueError: cannot judge this" in by_kind["error"].message
    assert "'sleep'" in caplog.text and "'raise'" in caplog.text and "timed out" in caplog.text
    values = scores.values()
    assert math.isnan(values[1]) and values[0] == 1.0


@pytest.mark.parametrize("response", ["none", "nan", "exit"])
def test_bad_values_and_dead_workers_are_errors(response):
    scores = score_batch(judge, [("p", response), ("p", "ok")], timeout=5.0, num_workers=1)
    assert scores.scores == [None, 2.0]  # the worker is replaced and the next item still scored
    assert scores.errors == 1 and scores.timeouts == 0


def test_a_reward_that_swallows_exceptions_is_still_killed():
    started = time.monotonic()
    scores = score_batch(judge, [("p", "stubborn"), ("p", "x")], timeout=0.5, num_workers=1)
    assert scores.scores == [None, 1.0] and scores.timeouts == 1
    assert time.monotonic() - started < 5


def test_closures_and_lambdas_reach_the_workers_without_pickling():
    bonus = {"value": 10.0}  # a closure over local state, and a lambda: neither pickles by reference

    def closure(prompt, response, meta=None):
        return bonus["value"] + len(response)

    assert score_batch(closure, [("p", "ab")]).scores == [12.0]
    assert score_batch(lambda p, r, m=None: m["k"] * 2, [("p", "r", {"k": 4})]).scores == [8.0]


def test_workers_are_separate_processes_and_stay_warm():
    with RewardRunner(lambda p, r, m=None: os.getpid(), num_workers=1, timeout=5) as runner:
        first = runner.score([("p", "a")]).scores[0]
        second = runner.score([("p", "b")]).scores[0]
    assert first == second != os.getpid()


def test_isolate_false_runs_in_process_and_still_counts_failures():
    scores = score_batch(lambda p, r, m=None: os.getpid() if r == "pid" else judge(p, r, m),
                         [("p", "pid"), ("p", "raise")], isolate=False)
    assert scores.scores == [float(os.getpid()), None] and scores.errors == 1


def test_unpicklable_meta_is_an_error_for_that_item_only():
    scores = score_batch(lambda p, r, m=None: 1.0, [("p", "a", {"f": lambda: 0}), ("p", "b", {})], num_workers=1)
    assert scores.scores == [None, 1.0] and "picklable" in scores.failures[0].message


def test_composite_parts_are_scored_and_reported_separately():
    reward = format_correct()
    items = [("q", r"\boxed{72}", {"answer": "72"}), ("q", "72", {"answer": "72"}),
             ("q", r"\boxed{7}", {"answer": "72"}), ("q", r"\boxed{1}", {})]  # the last has no reference
    scores = score_batch(reward, items, timeout=10.0)
    assert scores.scores[:3] == pytest.approx([1.0, 0.9, 0.0]) and scores.scores[3] is None
    assert scores.parts["format"] == [1.0, 0.0, 1.0, 1.0]
    assert scores.parts["correct"] == [1.0, 1.0, 0.0, None]
    assert scores.failures[0].reward == "math_correct" and "meta['answer']" in scores.failures[0].message
    metrics = scores.metrics()
    assert metrics["reward/format/mean"] == 0.75 and metrics["reward/correct/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/errors:sum"] == 1.0


def test_inline_code_reward_runs_the_batch_in_the_sandbox():
    with Sandbox(num_workers=2, timeout=1.0) as sandbox:
        reward = resolve_reward("code_tests", sandbox=sandbox)
        meta = {"tests": ["assert f() == 1"]}
        items = [("p", "def f():\n    return 1", meta), ("p", "while True: pass", meta),
                 ("p", "def f():\n    return 2", meta), ("p", "def f(): return 1", {"tests": []})]
        scores = score_batch(reward, items)
    assert scores.scores == [1.0, -0.5, -0.5, None]  # a looping program is the policy's failure: -0.5
    assert scores.errors == 1 and "meta['tests']" in scores.failures[0].message


def test_item_forms_and_argument_checks():
    fn = lambda p, r, m=None: len(p) + len(r)  # noqa: E731
    items = [RewardItem("ab", "c"), {"prompt": "a", "response": "bc"}, ("a", "b", None)]
    assert score_batch(fn, items).scores == [3.0, 3.0, 2.0]
    assert score_batch(fn, []).scores == []
    with pytest.raises(ConfigurationError, match="reward item"):
        score_batch(fn, ["just a string"])
    with pytest.raises(ConfigurationError, match="timeout"):
        RewardRunner(fn, timeout=0)
    with pytest.raises(ConfigurationError, match="num_workers"):
        RewardRunner(fn, num_workers=0)


def test_a_raised_timeout_error_counts_as_a_timeout_and_logs_are_capped(caplog):
    def slow(prompt, response, meta=None):
        if response == "t":
            raise TimeoutError("grader gave up")
        raise ValueError("bad")

    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        scores = score_batch(slow, [("p", "t")] + [("p", "e")] * 11, isolate=False)
    assert (scores.timeouts, scores.errors) == (1, 11)
    assert "and 2 more reward failures in this batch (11 errors, 1 timeouts" in caplog.text


def test_math_verify_runs_in_the_workers():
    pytest.importorskip("math_verify")
    items = [("q", r"\boxed{\sqrt{2}/2}", {"answer": r"\frac{\sqrt{2}}{2}"}),
             ("q", r"\boxed{\sqrt{3}}", {"answer": r"\frac{\sqrt{2}}{2}"})]
    assert score_batch("math_correct", items, num_workers=1).scores == [1.0, 0.0]
