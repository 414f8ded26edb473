"""rlvr.fileio: JSON Lines that any character a model writes survives, torn lines repaired, atomic files and folders,
disk errors told in one line."""

import errno
import json
import os

import pytest

from rlvr.errors import RunFileError, StorageError
from rlvr.fileio import append_jsonl, atomic_file, atomic_folder, jsonl_line, read_jsonl, remove_folder, write_atomic

# Every character str.splitlines() splits on besides "\n", the carriage return, a lone surrogate (text decoded with
# surrogateescape), a replacement character (a broken UTF-8 tail decoded with errors="replace") and a NUL.
NASTY = ["\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c", "\r", "\r\n", "\udcff", "\ufffd", "\x00"]


def test_every_line_breaking_character_round_trips(tmp_path):
    records = [{"response": f"before{c}after", c: c} for c in NASTY]
    path = tmp_path / "a.jsonl"
    for record in records:
        append_jsonl(path, record)
    assert read_jsonl(path) == records
    write_atomic(tmp_path / "b.jsonl", b"".join(jsonl_line(r) for r in records))
    assert read_jsonl(tmp_path / "b.jsonl") == records
    assert path.read_bytes().count(b"\n") == len(records)  # one line per record, whatever the text holds


def test_append_cuts_off_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"step": 0})
    with open(path, "a") as handle:
        handle.write('{"step": 1, "loss')  # a process killed mid-write
    assert read_jsonl(path) == [{"step": 0}]  # the torn line is skipped on reading
    append_jsonl(path, {"step": 1})
    assert read_jsonl(path) == [{"step": 0}, {"step": 1}]
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'


def test_a_torn_line_longer_than_a_read_block_is_cut_off(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n' + '{"b": "' + "x" * 200_000)
    append_jsonl(path, {"c": 2})
    assert read_jsonl(path) == [{"a": 1}, {"c": 2}]
    only_torn = tmp_path / "t.jsonl"
    only_torn.write_text('{"b": "' + "x" * 100_000)
    append_jsonl(only_torn, {"c": 2})
    assert only_torn.read_text() == '{"c": 2}\n'


def test_a_bad_complete_line_is_named_unless_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(RunFileError, match=r"m\.jsonl, line 2"):
        read_jsonl(path)
    assert read_jsonl(path, bad_lines="skip") == [{"a": 1}, {"b": 2}]


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    path = write_atomic(tmp_path / "s.json", json.dumps({"v": 1}))
    assert json.loads(path.read_text()) == {"v": 1} and path.stat().st_mode & 0o777 == 0o644

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, json.dumps({"v": 2}))
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary file left behind


def test_atomic_folder_replaces_an_old_folder_and_keeps_it_on_failure(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_folder(target) as folder:
        (folder / "w.txt").write_text("one")
    with pytest.raises(RuntimeError):
        with atomic_folder(target) as folder:
            (folder / "w.txt").write_text("half")
            raise RuntimeError("killed")
    assert (target / "w.txt").read_text() == "one"
    with atomic_folder(target) as folder:
        (folder / "w.txt").write_text("two")
    assert (target / "w.txt").read_text() == "two"
    with atomic_folder(target, exist_ok=False) as folder:  # another process wrote it first: theirs stays
        (folder / "w.txt").write_text("three")
    assert (target / "w.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_file_takes_what_a_program_writes_and_removes_it_on_failure(tmp_path):
    target = tmp_path / "lib.so"
    with atomic_file(target, mode=0o755) as temp:
        assert temp.parent == tmp_path and temp.read_bytes() == b"" and not target.exists()
        temp.unlink()  # a linker deletes its output file and creates a new one
        temp.write_bytes(b"one")
    assert target.read_bytes() == b"one" and target.stat().st_mode & 0o777 == 0o755
    with pytest.raises(RuntimeError):
        with atomic_file(target) as temp:
            temp.write_bytes(b"half")
            raise RuntimeError("the compiler failed")
    assert target.read_bytes() == b"one"
    assert [p.name for p in tmp_path.iterdir()] == ["lib.so"]  # no temporary file left behind


def test_atomic_folder_keeps_a_folder_another_process_renamed_in_after_the_check(tmp_path, monkeypatch):
    target = tmp_path / "tiny"
    rename = os.replace

    def theirs_lands_first(src, dst):  # the other process's rename comes between our check and our rename
        if str(dst) == str(target) and not target.exists():
            target.mkdir()
            (target / "w.txt").write_text("theirs")
        rename(src, dst)

    monkeypatch.setattr("os.replace", theirs_lands_first)
    with atomic_folder(target, exist_ok=False) as folder:
        (folder / "w.txt").write_text("ours")
    assert (target / "w.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


@pytest.mark.parametrize(("code", "fix"), [
    (errno.ENOSPC, "the disk is full: free space on it, or give the run a folder on another disk (out=..."),
    (errno.EACCES, "permission denied: make the folder writable by this user, or choose another one (out=...)"),
    (errno.EROFS, "the filesystem is read-only: choose a writable folder (out=..."),
])
def test_a_disk_error_is_one_storage_error_naming_the_path_and_the_fix_and_leaves_the_old_file(tmp_path, code, fix):
    path = tmp_path / "status.json"
    write_atomic(path, "old")
    with pytest.raises(StorageError) as raised, atomic_file(path) as temp:
        temp.write_text("half")
        raise OSError(code, os.strerror(code), str(temp))  # as the write would
    message = str(raised.value)
    assert message.startswith(f"could not write {path}: {os.strerror(code)} ({errno.errorcode[code]}); {fix}")
    assert "\n" not in message and raised.value.errno == code and isinstance(raised.value, OSError)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError), atomic_folder(tmp_path / "ckpt"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "x")
    with pytest.raises(ValueError), atomic_file(tmp_path / "f"):
        raise ValueError("not a disk error")


def test_remove_folder_leaves_no_half_of_it(tmp_path):
    folder = tmp_path / "step-000001"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "optimizer.pt").write_bytes(b"x")
    remove_folder(folder)
    assert list(tmp_path.iterdir()) == []
