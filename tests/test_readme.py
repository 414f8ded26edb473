"""The README's commands are ones rlvr takes: every ``./rlvr`` line of its shell blocks names a command and options
the CLI has, with settings (``key=value``) that resolve to a valid config; every Python block compiles; every link
to a file of the repository and every path of its file map (and of the whole map in ``docs/architecture.md``) exists.

What this cannot see: whether a command's run succeeds (the recipes, the loop and the server have their own tests)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from rlvr.app.settings import resolve_config
from rlvr.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")  # the whole file map
RUN = "runs/arithmetic-20261123-014534"  # the run folder the README's examples name


def rlvr_commands() -> list[str]:
    lines = [line.split("  #")[0].strip() for kind, body in BLOCKS if kind == "bash" for line in body.splitlines()]
    commands = [part.strip() for line in lines for part in line.split("&&") if part.strip()]
    return [c for c in commands if c.startswith("./rlvr ") or re.match(r"^(\w+=\S+ )+\./rlvr ", c)]


def test_the_readme_has_rlvr_commands():
    assert len(rlvr_commands()) >= 10


@pytest.mark.parametrize("command", rlvr_commands())
def test_each_rlvr_command_parses_and_its_settings_resolve(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text("steps: 5\n")
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "1 + 1 =", "completion": " 2"}\n')
    (tmp_path / RUN).mkdir(parents=True)
    args = shlex.split(command.split("./rlvr ", 1)[1])
    group = typer.main.get_command(app)
    name, rest = args[0], args[1:]
    with click.Context(group, info_name="rlvr") as ctx:
        sub = group.get_command(ctx, name)
        assert sub is not None, f"rlvr has no command {name!r}"
        try:
            params = sub.make_context(name, rest, parent=ctx).params
        except (click.exceptions.Exit, typer.Exit):  # --help
            return
    if name in ("train", "eval"):
        data = params.get("data")
        overrides = [*(params.get("overrides") or []), *([f"data={data}"] if data else [])]
        resolve_config(recipe=params.get("recipe"), config_file=params.get("config"), overrides=overrides)


@pytest.mark.parametrize("number", [n for n, (kind, _) in enumerate(BLOCKS) if kind == "python"])
def test_each_python_block_compiles(number):
    compile(BLOCKS[number][1], f"README.md python block {number}", "exec")


def _file_map_paths(text: str) -> list[str]:
    """The paths of the first unlabelled code block that names ``src/rlvr/``: a name per word, a folder's entries
    indented two spaces under it."""
    file_map = next(body for kind, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
                    if kind == "" and "src/rlvr/" in body)
    paths, parents = [], {0: ""}
    for line in file_map.splitlines():
        entry = line.split("#")[0].rstrip()
        if not entry.strip():
            continue
        depth = (len(entry) - len(entry.lstrip())) // 2
        names = entry.split()
        for name in names:
            paths.append(parents.get(depth, "") + name)
        if len(names) == 1 and names[0].endswith("/"):
            parents[depth + 1] = parents.get(depth, "") + names[0]
    return paths


@pytest.mark.parametrize("name, text", [("README.md", README), ("docs/architecture.md", ARCHITECTURE)])
def test_every_linked_file_and_file_map_path_exists(name, text):
    links = re.findall(r"\]\(((?:docs|examples|bench|src|tests)/[^)#\s]+)", text) if name == "README.md" else []
    missing = [p for p in links + _file_map_paths(text) if not (ROOT / p).exists()]
    assert not missing, f"{name} names paths that do not exist: {missing}"


MAX_FIGURES = 8  # headline figures the README keeps; the rest live in docs/benchmarks.md
MAX_LINE = 200  # characters on a line of the figures table


def figures_table(text: str) -> list[str]:
    """The lines of the first table under the ``## Benchmarks`` heading of ``text``."""
    section = text.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0].splitlines()
    start = next(i for i, line in enumerate(section) if line.startswith("|"))
    end = next((i for i in range(start, len(section)) if not section[i].startswith("|")), len(section))
    return section[start:end]


def figure_problems(text: str) -> list[str]:
    """What is wrong with the figures table of ``text``: more than ``MAX_FIGURES`` rows, a line over ``MAX_LINE``
    characters, a row without a command in backticks, or one whose result does not link a section of
    ``docs/benchmarks.md`` (inline, or through a reference definition ``[label]: target``)."""
    table = figures_table(text)
    references = dict(re.findall(r"^\[([^\]]+)\]: *(\S+)", text, flags=re.M))
    rows = table[2:]
    problems = [f"{len(rows)} figures, at most {MAX_FIGURES}: move the rest to docs/benchmarks.md"] * (
        len(rows) > MAX_FIGURES)
    for row in rows:
        what, command, result = (cell.strip() for cell in row.strip().strip("|").split(" | "))
        if len(row) > MAX_LINE:
            problems.append(f"{what}: a line of {len(row)} characters, at most {MAX_LINE}")
        if not re.fullmatch(r"`[^`]+`( .*)?", command):
            problems.append(f"{what}: no command")
        targets = re.findall(r"\]\(([^)]+)\)", result) + [references.get(label, "")
                                                            for label in re.findall(r"\]\[([^\]]+)\]", result)]
        if not any(t.startswith("docs/benchmarks.md#") for t in targets):
            problems.append(f"{what}: no link to its section of docs/benchmarks.md")
    return problems


def test_the_figures_table_keeps_a_few_short_linked_rows():
    assert len(figures_table(README)) > 2
    assert figure_problems(README) == []


def test_planted_figure_problems_are_seen():
    header = "## Benchmarks\n\n| what | command | result |\n|---|---|---|\n"
    row = "| f{} | `bench/x.py` | [1.0x][x] (Xeon) |\n"
    refs = "\n[x]: docs/benchmarks.md#x\n\n## Files\n"
    assert figure_problems("\n" + header + row.format(0) * MAX_FIGURES + refs) == []
    assert figure_problems("\n" + header + row.format(0) * (MAX_FIGURES + 1) + refs) == [
        f"{MAX_FIGURES + 1} figures, at most {MAX_FIGURES}: move the rest to docs/benchmarks.md"]
    long = f"| long | `bench/x.py {'-' * MAX_LINE}` | [1.0x](docs/benchmarks.md#x) |\n"
    bare = "| bare | bench/x.py | 1.0x |\n| elsewhere | `bench/x.py` | [1.0x](docs/performance.md#x) |\n"
    assert figure_problems("\n" + header + long + bare + refs) == [
        f"long: a line of {len(long) - 1} characters, at most {MAX_LINE}", "bare: no command",
        "bare: no link to its section of docs/benchmarks.md", "elsewhere: no link to its section of docs/benchmarks.md"]
