"""The files rlvr writes and reads back: atomic writes of a file or a folder, and JSON Lines.

- :func:`write_atomic` writes a file to a temporary file beside it, syncs it and renames it into place, so a reader
  or a crash sees the old file or the new one, never half of one. :func:`atomic_file` is the same for a file that
  something else writes (a compiler, a copy from a stream): it yields the temporary file's path to fill.
- :func:`atomic_folder` does the same for a folder: the caller fills a temporary folder, which replaces the target
  when the block ends without an error (an existing target is moved aside first, so one whole version exists at
  every moment) and is removed when it raises.
- :func:`remove_folder` deletes a folder the same way round: renamed aside first, so no reader sees half of it.
- A full disk, a denied permission or a read-only filesystem is a ``StorageError`` naming the path and the fix
  (:func:`storage_errors`), never a half-written file.
- :func:`append_jsonl` and :func:`read_jsonl` are JSON Lines as rlvr writes them (metrics, rollouts, checkpoints,
  evaluation records): records are split on ``"\\n"`` alone. ``str.splitlines`` would also split on U+2028, U+2029,
  U+0085, ``\\x0b``, ``\\x0c`` and ``\\x1c``-``\\x1e``, which ``json.dumps(..., ensure_ascii=False)`` writes raw and
  model answers contain. A process killed mid-append leaves a last line without its newline: :func:`append_jsonl`
  cuts that torn fragment off before it appends (so the new record starts a line of its own), and
  :func:`read_jsonl` skips it.

Lone surrogates (text decoded with ``surrogateescape``) cannot be encoded as UTF-8; :func:`jsonl_line` writes them as
JSON ``\\uXXXX`` escapes, which read back as the same string.

Not here: data files a user gives (``tasks.files`` reads those), what a checkpoint holds (``engine.checkpoint``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from rlvr.errors import RunFileError, StorageError

__all__ = ["append_jsonl", "atomic_file", "atomic_folder", "jsonl_line", "open_jsonl", "read_jsonl", "remove_folder",
           "storage_errors", "write_atomic"]


def write_atomic(path: str | Path, data: str | bytes, mode: int = 0o644, errors: str = "strict") -> Path:
    """Write ``data`` to ``path`` through a synced temporary file renamed over it; returns ``path``. Text is
    encoded as UTF-8 with ``errors`` (``"replace"`` for pages a person reads, where a lone surrogate may appear)."""
    with atomic_file(path, mode) as temp:
        temp.write_bytes(data.encode("utf-8", errors) if isinstance(data, str) else data)
    return Path(path)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield the path of an empty temporary file beside ``path`` to fill; when the block ends without an error it
    is synced, given ``mode`` and renamed over ``path``, and when it raises it is removed. A full disk, a denied
    permission or a read-only filesystem is a StorageError naming ``path`` and the fix."""
    path = Path(path)
    with storage_errors("write", _named(path)):
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        temp = Path(name)
        try:
            yield temp
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(temp, mode)  # mkstemp makes 0600; run files are for reading
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def atomic_folder(path: str | Path, exist_ok: bool = True, action: str = "write") -> Iterator[Path]:
    """Yield a temporary folder beside ``path`` to fill; on success it becomes ``path``.

    An existing ``path`` is replaced (moved aside, then deleted) when ``exist_ok``; otherwise a folder that appeared
    meanwhile (another process wrote the same thing first) is kept and the new one discarded. A full disk, a denied
    permission or a read-only filesystem, in the block too, is a StorageError: "could not ``action`` ``path``: ...".
    """
    path = Path(path)
    with storage_errors(action, _named(path)):
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
        try:
            yield temp
            for file in temp.rglob("*"):
                if file.is_file():
                    with open(file, "rb") as handle:
                        os.fsync(handle.fileno())
            if path.exists() and exist_ok:
                old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
                os.replace(path, old)
                os.replace(temp, path)
                shutil.rmtree(old, ignore_errors=True)
            elif not path.exists():
                try:
                    os.replace(temp, path)
                except OSError:
                    if not path.exists():
                        raise  # a real failure, not a folder that appeared since the check
        finally:
            shutil.rmtree(temp, ignore_errors=True)  # gone already when it was renamed


def remove_folder(path: str | Path) -> None:
    """Delete ``path`` (a folder) so that no reader sees half of it: it is renamed aside first, then removed."""
    path = Path(path)
    with storage_errors("delete", path):
        aside = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, aside)
        shutil.rmtree(aside)


def _named(path: Path) -> Path:
    """``path`` as an error names it: through the links on its way (a run's checkpoints are reached through one)."""
    return path.resolve() if any(p.is_symlink() for p in path.parents if p != p.parent) else path


@contextlib.contextmanager
def storage_errors(action: str, path: str | Path) -> Iterator[None]:
    """Turn an OSError of the disk (full, read-only, permission denied) raised in the block into a StorageError:
    "could not ``action`` ``path``: <reason>; <fix>". Other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if StorageError.stands_for(exc):
            raise StorageError.of(exc, action, path) from exc
        raise


def jsonl_line(record: Any) -> bytes:
    """``record`` as one JSON Lines line (UTF-8, ending in ``\\n``); any character may appear in its strings."""
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")


def open_jsonl(path: str | Path) -> BinaryIO:
    """``path`` opened to append JSON Lines (created if missing), a torn last line cut off; the caller closes it."""
    handle = open(path, "a+b")  # returned open: the caller closes it
    try:
        _cut_torn_line(handle)
    except BaseException:
        handle.close()
        raise
    return handle


def append_jsonl(path: str | Path, record: Any, durable: bool = False) -> None:
    """Append ``record`` as one line of ``path`` (created if missing), first cutting off a torn last line.

    ``durable`` syncs the file before returning (for records a resume depends on). A full disk leaves at worst a torn
    last line (which readers skip and the next append cuts off) and is a StorageError."""
    with storage_errors("append to", path), open_jsonl(path) as handle:
        handle.write(jsonl_line(record))
        handle.flush()
        if durable:
            os.fsync(handle.fileno())


def read_jsonl(path: str | Path, bad_lines: str = "raise") -> list[Any]:
    """The records of a JSON Lines file rlvr wrote, split on ``"\\n"`` alone; a torn last line (no newline, not
    valid JSON) is skipped. ``bad_lines="skip"`` also skips complete lines that are not JSON (``"raise"``: an error
    naming the file and line)."""
    if bad_lines not in ("raise", "skip"):
        raise ValueError(f"bad_lines={bad_lines!r}; use 'raise' or 'skip'")
    text = Path(path).read_bytes().decode("utf-8", "replace")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines) or bad_lines == "skip":  # the last line has no newline: a torn write
                continue
            raise RunFileError(f"{path}, line {number}: not a JSON record ({error}); the file was changed by "
                                   "something other than rlvr, or written by another program") from None
    return records


def _cut_torn_line(handle: Any) -> None:
    """Truncate an ``a+b`` file that does not end in a newline back to its last newline."""
    end = handle.seek(0, os.SEEK_END)
    if end == 0:
        return
    handle.seek(end - 1)
    if handle.read(1) == b"\n":
        return
    position = end
    while position > 0:  # read back in blocks to the previous newline
        start = max(0, position - 65536)
        handle.seek(start)
        block = handle.read(position - start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            handle.truncate(start + newline + 1)
            return
        position = start
    handle.truncate(0)
