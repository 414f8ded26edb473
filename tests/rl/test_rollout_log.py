"""Rollout logs: JSONL per step that reads back as written, an escaped static HTML page, atomic writes."""

import json
import re

import pytest

from rlvr.errors import ConfigurationError
from rlvr.rl.rollout_log import RolloutLog


def record(problem_id="arith/1", prompt="2+2=", response="4", reward=1.0, advantage=0.5, parts=None, failure=None):
    return {"problem_id": problem_id, "prompt": prompt, "response": response, "reward": reward,
            "advantage": advantage, "parts": parts or {}, "failure": failure}


GROUP = [  # one problem, four answers: right, wrong, penalised, failed to score
    record(response="4", reward=1.0, advantage=0.5, parts={"correct": 1.0, "format": 1.0}),
    record(response="5", reward=0.0, advantage=-0.5, parts={"correct": 0.0, "format": 1.0}),
    record(response="five", reward=-0.1, advantage=None),
    record(response="∞ loop", reward=None, advantage=None, failure="timeout after 10.0 s"),
]


def test_jsonl_round_trips(tmp_path):
    log = RolloutLog(tmp_path)
    path = log.write(1, GROUP)
    assert path == tmp_path / "rollouts" / "step-000001.jsonl"
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] == GROUP
    assert log.read(1) == GROUP and log.steps() == [1]


def test_answers_with_any_line_breaking_character_read_back(tmp_path):
    # U+2028/2029, U+0085, \x1c-\x1e, \x0b and \x0c are line boundaries for str.splitlines() (not for JSONL); a model
    # wrote U+2028 in a GSM8K answer and the step's own file could not be read back.
    nasty = ["\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c", "\r", "\udcff", "\ufffd"]
    records = [record(prompt=f"Q{c}?", response=f"The answer{c}is 4", parts={"correct": 1.0}) for c in nasty]
    log = RolloutLog(tmp_path)
    log.write(0, records)
    assert log.read(0) == records
    assert "The answer" in (tmp_path / "rollouts" / "index.html").read_text(encoding="utf-8")


def test_text_is_escaped(tmp_path):
    nasty = record(problem_id='p"1', prompt="<script>alert(1)</script> & co", response="</td><b>bold</b>",
                   parts={"<i>x</i>": 1.0}, failure="raised <ValueError>")
    RolloutLog(tmp_path).write(0, [nasty])
    page = (tmp_path / "rollouts" / "index.html").read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>" not in page and "<i>" not in page and "<ValueError>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "&lt;/td&gt;&lt;b&gt;bold&lt;/b&gt;" in page and "p&quot;1" in page and "&lt;ValueError&gt;" in page


def test_page_shows_the_last_steps_newest_first_with_links(tmp_path):
    log = RolloutLog(tmp_path, keep_html=3)
    for step in range(5):
        log.write(step, GROUP)
    page = (tmp_path / "rollouts" / "index.html").read_text(encoding="utf-8")
    assert re.findall(r'<section id="step-(\d+)">', page) == ["000004", "000003", "000002"]
    assert '<a href="step-000004.jsonl">' in page and "step-000001.jsonl" not in page
    assert "3 of 5 steps" in page and "2 older" in page
    assert "<script" not in page  # static: no JavaScript


def test_rows_are_coloured_by_reward_sign_and_a_group_shares_its_prompt(tmp_path):
    RolloutLog(tmp_path).write(0, GROUP + [record(problem_id="arith/2", prompt="3+3=")])
    page = (tmp_path / "rollouts" / "index.html").read_text(encoding="utf-8")
    assert re.findall(r'<tr class="(\w+)">', page) == ["pos", "zero", "neg", "failed", "pos"]
    assert page.count('rowspan="4"') == 2 and page.count('rowspan="1"') == 2  # problem id and prompt cells
    assert "correct 1<br>format 1" in page and "failed: timeout after 10.0 s" in page
    assert "+0.500" in page and "-0.500" in page and "—" in page


def test_writes_are_atomic(tmp_path, monkeypatch):
    log = RolloutLog(tmp_path)
    log.write(0, GROUP)
    log.write(0, GROUP[:1])  # a resumed run repeats a step: replaced, not appended
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["index.html", "step-000000.jsonl"]
    assert log.read(0) == GROUP[:1]

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        log.write(0, GROUP)
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["index.html", "step-000000.jsonl"]
    assert log.read(0) == GROUP[:1]  # the old file is intact, no temp file is left


def test_bad_records_and_settings_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match=r"record 1 of step 2 lacks \['advantage'\]"):
        RolloutLog(tmp_path).write(2, [record(), {k: v for k, v in record().items() if k != "advantage"}])
    assert not (tmp_path / "rollouts" / "step-000002.jsonl").exists()
    with pytest.raises(ConfigurationError, match="keep_html=0"):
        RolloutLog(tmp_path, keep_html=0)
