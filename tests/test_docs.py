"""The repository's documents stand on their own: no file cites a design or style document that lives outside the
repository (a clone cannot read it), and every link between the README and ``docs/`` reaches a file and a heading.

The outside documents are those beside a checkout in ``../shared``, the data sets in ``../shared/data`` excepted
(tests and examples read them as data). The seed documents are read as inputs by the tests that run their examples
(``READS_THE_SEEDS``); nothing else names them. Links are checked as GitHub renders them: a ``#fragment`` is a
heading's slug (lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` for repeats).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "pyproject.toml", "rlvr", "run-tests", ".ci", "src", "tests", "docs", "examples", "scripts",
           "bench")
NOT_SCANNED = ("bench/results",)  # what benchmark runs printed and wrote: data, not documents
TEXT = {".py", ".md", ".sh", ".toml", ".txt", ".yaml", ".yml", ".cfg", ".c", ".h", ""}
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|(?:\.\./)?shared/seeds|\.\./shared(?!/data\b)")
CHECKER = "tests/test_docs.py"  # this file spells the patterns it looks for
READS_THE_SEEDS = {"tests/test_seed_documents.py", "tests/integrations/tensafe/test_tensafe.py"}
"""Tests that read the seed documents as their input (their examples, run as written): they may say where."""


def text_files(root: Path) -> list[Path]:
    """Every text file under ``root`` that ``SCANNED`` names, outside ``NOT_SCANNED`` and hidden, cache or build
    folders."""
    found = []
    for name in SCANNED:
        top = root / name
        for path in ([top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []):
            rel = path.relative_to(root).as_posix()
            if (path.is_file() and path.suffix in TEXT and not rel.startswith(NOT_SCANNED)
                    and not any((part.startswith(".") and part != ".ci") or part == "__pycache__"
                                or part.endswith(".egg-info") for part in path.relative_to(root).parts)):
                found.append(path)
    return found


def outside_citations(root: Path) -> list[str]:
    """One line per mention of a document outside the repository: ``path:line: the text``."""
    found = []
    for path in text_files(root):
        rel = path.relative_to(root).as_posix()
        if rel == CHECKER:
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue  # a binary file
        for number, line in enumerate(lines, 1):
            for match in OUTSIDE.finditer(line):
                if match.group().endswith("shared/seeds") and rel in READS_THE_SEEDS:
                    continue
                found.append(f"{rel}:{number}: {line.strip()[:160]}")
    return found


def test_no_file_cites_a_document_outside_the_repository():
    found = outside_citations(ROOT)
    assert not found, ("files cite documents outside the repository; say it here (docs/architecture.md for the "
                       "design) or drop the reference:\n" + "\n".join(found))


def test_the_citation_check_sees_planted_citations(tmp_path):
    design, style = "DESIGN" + ".md", "STYLE" + ".md"
    files = {
        "src/rlvr/loop.py": f'"""The loop of {design}."""\n',
        "tests/test_x.py": f"# see /work/shared/{style}\n",
        "docs/a.md": "Promised in ../shared/" + "seeds/000.txt.\n",
        "README.md": "See ../shared/" + "notes.md and data at ../shared/data/gsm8k/train.jsonl.\n",
        "tests/test_seed_documents.py": "SEEDS = '../shared/" + "seeds'\n",  # a reader of the seeds: allowed
        "bench/results/run.log": f"{design}\n",  # data
        "examples/run.py": "DATA = '../shared/data/mbpp'\n",  # data
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert [line.split(":")[0] for line in outside_citations(tmp_path)] == [
        "README.md", "src/rlvr/loop.py", "tests/test_x.py", "docs/a.md"]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of every heading of a markdown ``text`` (outside code blocks), repeats numbered as GitHub does."""
    seen: Counter[str] = Counter()
    found = set()
    for line in re.sub(r"```.*?```", "", text, flags=re.S).splitlines():
        match = re.match(r"#{1,6} +(.+?) *#*$", line)
        if match:
            base = slug(match.group(1))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def broken_links(path: Path, root: Path) -> list[str]:
    """Each link of the markdown file ``path`` to a file of the repository that is missing, or to a heading that
    the file it names does not have."""
    text = path.read_text(encoding="utf-8")
    found = []
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    definitions = re.findall(r"^ {0,3}\[[^\]]+\]: *(\S+)", prose, flags=re.M)  # reference links: [x]: target
    for target in re.findall(r"\]\(([^)\s]+)\)", prose) + definitions:
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            found.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return found


MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_every_link_reaches_its_file_and_heading(path):
    found = broken_links(path, ROOT)
    assert not found, "broken links:\n" + "\n".join(found)


def test_slugs_are_githubs():
    assert slug("Bfloat16 on AMX: one kernel for the trainer's forward and the sampler") == (
        "bfloat16-on-amx-one-kernel-for-the-trainers-forward-and-the-sampler")
    assert slug("The trainer's memory: the C heap (`engine/cpu/heap.py`)") == (
        "the-trainers-memory-the-c-heap-enginecpuheappy")
    assert slug("One GPU (NVIDIA H200): Llama-3.2-1B and Qwen3-4B") == "one-gpu-nvidia-h200-llama-32-1b-and-qwen3-4b"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## B c\n") == {"a", "a-1", "b-c"}


def test_planted_broken_links_are_seen(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n## Current figures\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/b.md#current-figures) [gone](docs/c.md) [moved](docs/b.md#history) "
                    "[here](#b) [web](https://example.com/x#y) [ref][r]\n# Top\n\n[r]: docs/b.md#b-1\n")
    assert broken_links(page, tmp_path) == ["README.md: docs/c.md (no such file)",
                                            "README.md: docs/b.md#history (no such heading)",
                                            "README.md: #b (no such heading)",
                                            "README.md: docs/b.md#b-1 (no such heading)"]
