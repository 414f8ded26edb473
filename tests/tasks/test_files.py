"""Reading problems from JSONL, JSON, gzip and Parquet files, record lists and hub data sets, with field maps."""

import gzip
import importlib.util
import json

import pytest

from rlvr.errors import ConfigurationError
from rlvr.tasks import FieldMap, FileSource, HubDataset, read_records

ROWS = [{"prompt": f"What is {i} * 2?", "target": i * 2, "hardness": f"tier {i % 2}", "source": "mine"}
        for i in range(6)]
FIELDS = FieldMap(question="prompt", answer="target", difficulty="hardness")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_json_and_gzip(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", ROWS)
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in ROWS))
    assert read_records(jsonl) == read_records(tmp_path / "a.json") == read_records(tmp_path / "a.jsonl.gz") == ROWS


def test_read_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ConfigurationError, match=r"bad.jsonl, line 3: not valid JSON"):
        read_records(bad)
    with pytest.raises(ConfigurationError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ConfigurationError, match="unknown data file type"):
        read_records(tmp_path / "data.csv")


def test_parquet(tmp_path):
    if importlib.util.find_spec("pyarrow") is None:
        with pytest.raises(ConfigurationError, match="pip install pyarrow"):
            read_records(write_jsonl(tmp_path / "x.parquet", ROWS))
        pytest.skip("pyarrow is not installed")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "rows.parquet")
    source = FileSource(str(tmp_path / "rows.parquet"), FIELDS)
    problems = source.problems("train")
    assert [p.answer for p in problems] == ["0", "2", "4", "6", "8", "10"]
    assert source.score(problems[3], "\\boxed{6}") == 1.0


def test_field_map_meta_difficulty_and_ids(tmp_path):
    source = FileSource(str(write_jsonl(tmp_path / "rows.jsonl", ROWS)), FIELDS, name="doubles")
    problem = source.problems("train")[3]
    assert (problem.id, problem.question, problem.answer, problem.difficulty) == ("doubles/3", "What is 3 * 2?",
                                                                                  "6", 1.0)
    assert problem.meta == {"source": "mine"}
    assert source.problems("train", max_difficulty=0)[0].question == "What is 0 * 2?"


def test_split_files_and_held_out_fraction(tmp_path):
    files = {"train": str(write_jsonl(tmp_path / "t.jsonl", ROWS[:4])), "test": str(write_jsonl(tmp_path / "v.jsonl",
                                                                                               ROWS[4:]))}
    by_file = FileSource(files, FIELDS)
    assert by_file.splits() == ("train", "test") and len(by_file.problems("test")) == 2
    assert by_file.problems("test")[0].id == "file/test/0"
    held = FileSource(ROWS, FIELDS, test_fraction=0.5, split_seed=1)
    train, test = held.problems("train"), held.problems("test")
    assert len(train) == len(test) == 3 and not {p.id for p in train} & {p.id for p in test}
    assert [p.id for p in test] == [p.id for p in FileSource(ROWS, FIELDS, test_fraction=0.5, split_seed=1)
                                    .problems("test")]
    assert [p.id for p in test] != [p.id for p in FileSource(ROWS, FIELDS, test_fraction=0.5, split_seed=2)
                                    .problems("test")]
    with pytest.raises(ConfigurationError, match="test_fraction"):
        FileSource(files, FIELDS, test_fraction=0.2)


def test_transform_and_code_fields():
    rows = [{"task": "Define f returning 1.", "checks": ["assert f() == 1"], "answer_text": "x"}]
    source = FileSource(rows, {"question": "task", "answer": None, "tests": "checks"},
                        transform=lambda r: {**r, "task": r["task"].upper()})
    problem = source.problems("train")[0]
    assert problem.question == "DEFINE F RETURNING 1." and problem.tests == ("assert f() == 1",)
    assert source.reward().name == "code_tests" and "```python" in source.prompt_text(problem)
    with pytest.raises(ConfigurationError, match=r"record 0 .*'checks'"):
        FileSource([{"task": "t", "checks": "assert x"}], {"question": "task", "answer": None,
                                                          "tests": "checks"}).problems("train")


def test_missing_field_names_the_record():
    with pytest.raises(ConfigurationError, match=r"record 1 of split 'train' does not fit \(KeyError: 'target'\)"):
        FileSource([ROWS[0], {"prompt": "x"}], FIELDS).problems("train")


def test_hub_dataset_without_or_with_the_datasets_package(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    spec = HubDataset("json", splits={"train": "train"}, load_kwargs={"data_files": {"train": str(path)}})
    source = FileSource(spec, FIELDS)
    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(ConfigurationError, match="pip install datasets"):
            source.problems("train")
        pytest.skip("the datasets package is not installed; the hub code path was checked up to its import")
    assert [p.answer for p in source.problems("train")] == ["0", "2", "4", "6", "8", "10"]
