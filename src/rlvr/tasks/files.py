"""Problems from files and data-set hubs: JSONL, JSON, Parquet, in-memory records, Hugging Face data sets.

What it is: :func:`read_records` (``.jsonl``, ``.jsonl.gz``, ``.json``, ``.parquet`` -- Parquet needs
``pyarrow``), :class:`HubDataset` (a Hugging Face data set by name, read through the ``datasets`` package when it
is installed and the hub is reachable; nothing is fetched until a split is asked for), :class:`RecordSource` (the
base of every record-backed source: splits from one file per split, from one file cut by ``test_fraction`` with a
seed, or from the hub) and :class:`FileSource`, any such data with a :class:`FieldMap` saying which field holds
the question, answer, tests, difficulty...

What it is not: the knowledge of particular data sets' formats (``gsm8k``, ``math``, ``code``).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigurationError
from rlvr.rewards import Reward, resolve_reward
from rlvr.tasks.base import Problem, ProblemSource


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records (dicts) in a ``.jsonl``/``.jsonl.gz`` (one JSON object a line), ``.json`` (a list of objects)
    or ``.parquet`` file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"data file {str(path)!r} does not exist; give the path of a .jsonl, .json or "
                                 ".parquet file")
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigurationError(f"reading {path} needs pyarrow: pip install pyarrow") from None
        return pq.read_table(path).to_pylist()
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        if name.endswith((".json", ".json.gz")):
            data = json.load(handle)
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise ConfigurationError(f"{path}: a .json data file must hold a list of objects")
            return data
        if not name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
            raise ConfigurationError(f"{path}: unknown data file type; use .jsonl, .jsonl.gz, .json or .parquet")
        records = []
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"{path}, line {number}: not valid JSON ({exc})") from None
            if not isinstance(record, dict):
                raise ConfigurationError(f"{path}, line {number}: each line must be a JSON object")
            records.append(record)
        return records


@dataclass(frozen=True)
class HubDataset:
    """A Hugging Face data set by name, read with ``datasets.load_dataset`` when a split is first asked for."""

    name: str
    """The data set's hub name (``"openai/gsm8k"``) or a ``datasets`` builder (``"json"``)."""

    config: str | None = None
    """Its configuration (``"main"``), if it has several."""

    splits: Mapping[str, str] = field(default_factory=lambda: {"train": "train", "test": "test"})
    """Our split names mapped to the hub's."""

    load_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra arguments for ``load_dataset`` (``data_files``, ``revision``...)."""

    def records(self, split: str) -> list[dict[str, Any]]:
        """The records of ``split`` (downloads it if the ``datasets`` cache does not have it)."""
        try:
            import datasets
        except ImportError:
            raise ConfigurationError(f"reading the hub data set {self.name!r} needs the datasets package: pip "
                                     "install datasets (or download the data and give the file path)") from None
        try:
            data = datasets.load_dataset(self.name, self.config, split=self.splits[split], **dict(self.load_kwargs))
        except Exception as exc:
            raise ConfigurationError(f"could not load {self.name!r} (config {self.config!r}, split "
                                     f"{self.splits[split]!r}) from the hub: {exc}. Without hub access, download "
                                     "the data and give the file path") from exc
        return [dict(record) for record in data]


Data = str | os.PathLike | Sequence[Mapping[str, Any]] | Mapping[str, Any] | HubDataset
"""A file path, a list of records, ``{split: path or records}``, or a :class:`HubDataset`."""


def number_in(value: Any) -> float | None:
    """``value`` as a number: itself if numeric, else the first number in its text (``"Level 3"`` -> 3.0)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = re.search(r"-?\d+(?:\.\d+)?", str(value)) if value is not None else None
    return float(match.group()) if match else None


class RecordSource(ProblemSource):
    """A source backed by records; subclasses say how one record becomes a :class:`Problem` (:meth:`to_problem`).

    Args:
        data: a path, a list of records, ``{split: path or records}`` or a :class:`HubDataset`.
        test_fraction: with a single path or list, hold out this fraction as ``test`` (chosen with
            ``split_seed``; the rest is ``train``). Zero: the data is all ``train``.
        split_seed: seeds the held-out choice; the same seed and data give the same splits.
        Other keyword arguments: see :class:`ProblemSource`.
    """

    def __init__(self, data: Data, *, test_fraction: float = 0.0, split_seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= test_fraction < 1.0:
            raise ConfigurationError(f"{type(self).__name__}(test_fraction={test_fraction!r}): must be in [0, 1)")
        self.data, self.test_fraction, self.split_seed = data, test_fraction, split_seed
        self._pool: list[dict[str, Any]] | None = None
        if isinstance(data, Mapping) and test_fraction:
            raise ConfigurationError(f"{type(self).__name__}: test_fraction applies to a single file or list; the "
                                     "data already names its splits")
        if isinstance(data, HubDataset):
            self._splits = tuple(data.splits)
        elif isinstance(data, Mapping):
            if not data or not all(isinstance(k, str) for k in data):
                raise ConfigurationError(f"{type(self).__name__}(data=...): a mapping must be {{split name: path or "
                                         "records}}")
            self._splits = tuple(data)
        elif isinstance(data, (str, os.PathLike, Sequence)):
            self._splits = ("train", "test") if test_fraction else ("train",)
        else:
            raise ConfigurationError(f"{type(self).__name__}(data={data!r:.80}): give a path, a list of records, "
                                     "{split: path} or a HubDataset")

    def splits(self) -> tuple[str, ...]:
        return self._splits

    @staticmethod
    def _read(data: Any) -> list[dict[str, Any]]:
        if isinstance(data, (str, os.PathLike)):
            return read_records(data)
        return [dict(r) for r in data]

    def records(self, split: str) -> list[tuple[int, dict[str, Any]]]:
        """``(index in its file, record)`` pairs of ``split``."""
        if isinstance(self.data, HubDataset):
            return list(enumerate(self.data.records(split)))
        if isinstance(self.data, Mapping):
            return list(enumerate(self._read(self.data[split])))
        if self._pool is None:
            self._pool = self._read(self.data)
        indices = list(range(len(self._pool)))
        held = set()
        if self.test_fraction:
            random.Random(f"split:{self.split_seed}").shuffle(indices)
            held = set(indices[: round(len(indices) * self.test_fraction)])
        chosen = sorted(held) if split == "test" else sorted(set(range(len(self._pool))) - held)
        return [(i, self._pool[i]) for i in chosen]

    def load(self, split: str) -> list[Problem]:
        problems = []
        for index, record in self.records(split):
            try:
                problems.append(self.to_problem(record, index, split))
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigurationError(f"{type(self).__name__}: record {index} of split {split!r} does not fit "
                                         f"({type(exc).__name__}: {exc}); its fields are {sorted(record)}") from exc
        return problems

    def problem_id(self, record: Mapping[str, Any], index: int, split: str, key: str | None = None) -> str:
        """``{name}/{record[key]}`` when the record has that id field, else ``{name}/{split}/{index}`` (or
        ``{name}/{index}`` when splits were cut from one file, so an id does not change with the split)."""
        if key and record.get(key) is not None:
            return f"{self.name}/{record[key]}"
        single = not isinstance(self.data, (Mapping, HubDataset))
        return f"{self.name}/{index}" if single else f"{self.name}/{split}/{index}"

    @abstractmethod
    def to_problem(self, record: Mapping[str, Any], index: int, split: str) -> Problem:
        """One record as a :class:`Problem`; raise KeyError/ValueError for a record that does not fit."""


@dataclass(frozen=True)
class FieldMap:
    """Which record field holds each part of a problem (None: the data has no such field)."""

    question: str = "question"
    """The problem text."""

    answer: str | None = "answer"
    """The reference final answer (for answer rewards)."""

    tests: str | None = None
    """A list of test statements (for code rewards)."""

    solution: str | None = None
    """A worked solution or reference program."""

    difficulty: str | None = None
    """A number, or text containing one (``"Level 3"``)."""

    id: str | None = None
    """A unique id."""


class FileSource(RecordSource):
    """Any JSONL/JSON/Parquet file, record list or hub data set, mapped to problems by ``fields``.

    Fields not named in the map go to ``problem.meta`` (so ``test_setup_code`` reaches ``code_tests``).
    ``transform`` rewrites each record first (e.g. to pull an answer out of a longer field). The default reward
    is ``code_tests`` when the map names tests, else ``format_correct`` (``\\boxed{}`` format, ``math_correct``).
    """

    name = "file"

    def __init__(self, data: Data, fields: FieldMap | Mapping[str, str | None] = FieldMap(), *,
                 transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None, name: str = "file",
                 **kwargs: Any) -> None:
        self.fields = fields if isinstance(fields, FieldMap) else FieldMap(**fields)
        self.transform, self.name = transform, name
        if self.fields.tests and kwargs.get("instruction") is None:
            kwargs["instruction"] = "Write your solution in a ```python code block."
        elif kwargs.get("instruction") is None:
            kwargs["instruction"] = "Put your final answer in \\boxed{}."
        super().__init__(data, **kwargs)

    def default_reward(self) -> Reward:
        return resolve_reward("code_tests") if self.fields.tests else super().default_reward()

    def to_problem(self, record: Mapping[str, Any], index: int, split: str) -> Problem:
        record = self.transform(dict(record)) if self.transform else record
        f = self.fields
        tests = record[f.tests] if f.tests else ()
        if isinstance(tests, str):
            raise ValueError(f"field {f.tests!r} must hold a list of test strings, not one string")
        answer = record[f.answer] if f.answer else None
        mapped = {v for v in (f.question, f.answer, f.tests, f.solution, f.difficulty, f.id) if v}
        return Problem(id=self.problem_id(record, index, split, f.id), question=str(record[f.question]),
                       answer=None if answer is None else str(answer), tests=tuple(str(t) for t in tests),
                       solution=record.get(f.solution) if f.solution else None,
                       difficulty=number_in(record.get(f.difficulty)) if f.difficulty else None,
                       meta={k: v for k, v in record.items() if k not in mapped})
