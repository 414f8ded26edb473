"""Framing between the trainer process and its fork servers: length-prefixed JSON over a pair of pipes.

What it is: the wire format, standard library only (the fork server loads this file by path). A frame is a
4-byte big-endian length followed by that many bytes of UTF-8 JSON holding one object. The trainer writes
``{"op": "run", ...}`` and ``{"op": "exit"}`` frames to a server's stdin; the server answers on its stdout
with one ``{"op": "ready", ...}`` frame after start-up and one ``{"op": "result", ...}`` frame per job.

What it is not: a channel jobs can reach. Jobs never hold these pipes (the server closes them in each forked
job), and a job's own per-test reports travel over a separate pipe with per-job secrets (see ``harness``).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

_HEADER = struct.Struct(">I")
#: Largest frame either side accepts: a job's code and tests, or a result with its output tails.
MAX_FRAME_BYTES = 64 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    """Serialise one message as a frame."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"message of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, message: dict[str, Any]) -> None:
    """Write one frame to a blocking file descriptor, all of it."""
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    """Read one frame from a blocking file descriptor; ``None`` at end of file."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte limit; the stream is corrupt")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return json.loads(body.decode("utf-8", "surrogatepass"))


class FrameReader:
    """Incremental decoder for a non-blocking pipe: :meth:`feed` bytes, get the complete messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Append ``data`` and return every message completed by it, in order."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            messages.append(json.loads(bytes(self._buffer[_HEADER.size:end]).decode("utf-8", "surrogatepass")))
            del self._buffer[:end]
        return messages
