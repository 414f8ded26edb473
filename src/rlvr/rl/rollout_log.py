"""Rollout logs: what each step asked, what the model answered and how that was scored, as JSONL and one HTML page.

    log = RolloutLog(run_dir)
    log.write(step, [{"problem_id": "gsm8k/train/17", "prompt": "...", "response": "...", "reward": 1.0,
                      "advantage": 0.5, "parts": {"correct": 1.0, "format": 1.0}, "failure": None}, ...])

Each call writes ``RUN_DIR/rollouts/step-000001.jsonl`` (one record a line, in the order given) and regenerates
``RUN_DIR/rollouts/index.html``: one static page, no JavaScript, every text HTML-escaped, newest step first, the last
``keep_html`` steps as tables of prompt / response / reward / advantage with rows coloured by the reward's sign and
each step linking its JSONL file. Both files are written to a temporary file and renamed into place, so a reader or
a crash never sees half of one; a resumed run that repeats a step replaces that step's file.

Not here: token ids or logprobs, search and filtering, pruning old JSONL files (all are kept; the page shows the
last ``keep_html`` steps), per-problem histories across steps.
"""

from __future__ import annotations

import html
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from rlvr.errors import ConfigurationError
from rlvr.fileio import jsonl_line, read_jsonl, write_atomic


class RolloutRecord(TypedDict):
    """One sampled answer and its score, as written to the step's JSONL file."""

    problem_id: str
    """The problem's stable id (``Problem.id``)."""
    prompt: str
    """The prompt as the model saw it (decoded prompt tokens), or the question text."""
    response: str
    """The decoded answer."""
    reward: float | None
    """Its reward; None where scoring failed (see ``failure``)."""
    advantage: float | None
    """Its advantage; None where its group was not trained on (a failed reward in the group)."""
    parts: dict[str, float | None]
    """A composite reward's parts by name (``correct``, ``format``); empty for a plain reward."""
    failure: str | None
    """Why scoring failed (each failed reward call's kind and message); None when it was scored."""


FIELDS = tuple(RolloutRecord.__annotations__)
_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")
_HTML_MAX_CHARS = 4000  # per prompt or response on the page; the JSONL keeps all of it


class RolloutLog:
    """``RUN_DIR/rollouts``: one JSONL file per step and an ``index.html`` of the last ``keep_html`` steps."""

    def __init__(self, run_dir: str | Path, keep_html: int = 20) -> None:
        if keep_html < 1:
            raise ConfigurationError(f"keep_html={keep_html}: the page needs at least 1 step")
        self.folder = Path(run_dir) / "rollouts"
        self.keep_html = keep_html

    def path(self, step: int) -> Path:
        """The JSONL file of ``step``."""
        return self.folder / f"step-{step:06d}.jsonl"

    def write(self, step: int, records: Sequence[Mapping[str, Any]]) -> Path:
        """Write ``step``'s records (``RolloutRecord``s, or dicts with at least their keys) and regenerate
        ``index.html``; returns the JSONL path."""
        if step < 0:
            raise ConfigurationError(f"step={step}: rollout steps start at 0")
        for i, record in enumerate(records):
            missing = [f for f in FIELDS if f not in record]
            if missing:
                raise ConfigurationError(f"rollout record {i} of step {step} lacks {missing}; a record has {FIELDS}")
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path(step), b"".join(jsonl_line({f: record[f] for f in FIELDS}) for record in records))
        self._write_page()
        return self.path(step)

    def steps(self) -> list[int]:
        """The steps written so far, in order."""
        if not self.folder.is_dir():
            return []
        found = (_STEP_FILE.match(p.name) for p in self.folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def drop_from(self, step: int) -> list[int]:
        """Delete the JSONL files of ``step`` and later (a resume re-runs those steps: its files supersede them) and
        regenerate ``index.html``; returns the steps dropped."""
        dropped = [s for s in self.steps() if s >= step]
        for s in dropped:
            self.path(s).unlink()
        if dropped:
            self._write_page()
        return dropped

    def _write_page(self) -> None:
        write_atomic(self.folder / "index.html", self.render(), errors="replace")  # a lone surrogate shows as "?"

    def read(self, step: int) -> list[dict[str, Any]]:
        """``step``'s records as written."""
        return read_jsonl(self.path(step))

    def render(self) -> str:
        """The HTML page of the last ``keep_html`` steps, newest first."""
        steps = self.steps()
        shown = steps[-self.keep_html:][::-1]
        title = f"Rollouts: {self.folder.parent.resolve().name}"
        older = len(steps) - len(shown)
        intro = (f"{len(shown)} of {len(steps)} steps, newest first"
                 + (f"; the {older} older ones are only in this folder's step-NNNNNN.jsonl files" if older else "")
                 + ". Rows: green reward &gt; 0, red &lt; 0, grey 0, amber failed to score.")
        nav = " ".join(f'<a href="#step-{s:06d}">{s}</a>' for s in shown)
        body = "\n".join(_section(s, self.path(s).name, self.read(s)) for s in shown)
        return (f"<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                f"<title>{_esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
                f"<h1>{_esc(title)}</h1>\n<p>{intro}</p>\n<p>Steps: {nav}</p>\n{body}\n</body>\n</html>\n")


# The page


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; width: 100%; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 4px 6px; vertical-align: top; text-align: left; }
th { background: #f0f0f0; }
td.text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, monospace; font-size: 90%; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tr.pos td.score { background: #dff3dc; } tr.neg td.score { background: #f8dcdc; }
tr.zero td.score { background: #eee; } tr.failed td.score { background: #fdefc4; }
.small { font-size: 85%; color: #555; }
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: str) -> str:
    if len(text) <= _HTML_MAX_CHARS:
        return _esc(text)
    return _esc(text[:_HTML_MAX_CHARS]) + f'<span class="small"> … {len(text) - _HTML_MAX_CHARS} more characters</span>'


def _number(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.3f}" if signed else f"{value:.3g}"


def _sign(record: dict[str, Any]) -> str:
    reward = record["reward"]
    if reward is None or record["failure"] or not math.isfinite(reward):
        return "failed"
    return "pos" if reward > 0 else "neg" if reward < 0 else "zero"


def _section(step: int, filename: str, records: list[dict[str, Any]]) -> str:
    """One step: a heading with its summary and JSONL link, then a table; a group's prompt spans its rows."""
    rewards = [r["reward"] for r in records if r["reward"] is not None and math.isfinite(r["reward"])]
    failed = sum(_sign(r) == "failed" for r in records)
    mean = f"mean reward {sum(rewards) / len(rewards):.3g}" if rewards else "no reward scored"
    rows = []
    for (problem_id, prompt), group in itertools.groupby(records, key=lambda r: (r["problem_id"], r["prompt"])):
        group_records = list(group)
        for j, record in enumerate(group_records):
            first = (f'<td rowspan="{len(group_records)}">{_esc(problem_id)}</td>'
                     f'<td class="text" rowspan="{len(group_records)}">{_clip(prompt)}</td>') if j == 0 else ""
            rows.append(f'<tr class="{_sign(record)}">{first}{_cells(record)}</tr>')
    return (f'<section id="step-{step:06d}">\n<h2>Step {step} <span class="small">{len(records)} rollouts, {mean}, '
            f'{failed} failed · <a href="{_esc(filename)}">{_esc(filename)}</a></span></h2>\n<table>\n'
            "<thead><tr><th>problem</th><th>prompt</th><th>response</th><th>reward</th><th>advantage</th></tr></thead>"
            "\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>\n</section>")


def _cells(record: dict[str, Any]) -> str:
    """Response, reward (with its parts and any failure underneath) and advantage."""
    notes = [f"{_esc(name)} {_number(value)}" for name, value in record["parts"].items()]
    if record["failure"]:
        notes.append(f"failed: {_clip(record['failure'])}")
    note = f'<div class="small">{"<br>".join(notes)}</div>' if notes else ""
    return (f'<td class="text">{_clip(record["response"])}</td>'
            f'<td class="num score">{_number(record["reward"])}{note}</td>'
            f'<td class="num">{_number(record["advantage"], signed=True)}</td>')
