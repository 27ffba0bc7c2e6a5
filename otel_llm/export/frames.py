"""Length-prefixed frames over a pipe: how the engine's process and its export process delimit messages.

A frame is a 4-byte little-endian length and that many bytes (one ``otel_llm.record.wire`` message).
``write_frame`` writes a frame whole, on a blocking descriptor (the engine's sender thread, which may
wait); ``FrameWriter`` never blocks (the export process); reads collect bytes as they come and hand out
the frames that are complete; ``readable`` waits for a pipe to have something to read.
"""

from __future__ import annotations

import math
import os
import select
import struct
import threading
from collections.abc import Iterator

_HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a length past this is not ours: the stream is corrupt


def write_frame(fd: int, payload: bytes) -> None:
    """Write one frame to ``fd``; raises OSError (BrokenPipeError when the reader is gone)."""
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    while data:
        written = os.write(fd, data)
        data = data[written:]


class FrameReader:
    """The frames arriving on ``fd``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def fill(self, size: int = 1 << 20) -> bool:
        """Read what is there (one read); False at end of stream."""
        try:
            data = os.read(self.fd, size)
        except BlockingIOError:
            return True
        if not data:
            return False
        self._buffer += data
        return True

    @property
    def pending(self) -> int:
        """Bytes read and not yet handed out as frames."""
        return len(self._buffer)

    def frames(self) -> Iterator[bytes]:
        """The complete frames read so far, in order."""
        buffer = self._buffer
        while len(buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer)
            if length > MAX_FRAME:
                raise ValueError(f"a frame of {length} bytes: the stream is corrupt")
            end = _HEADER.size + length
            if len(buffer) < end:
                return
            frame = bytes(buffer[_HEADER.size : end])
            del buffer[:end]
            yield frame


class FrameWriter:
    """Frames to ``fd`` without ever blocking the writer: what the pipe cannot take now waits here and
    goes with the next ``send`` or ``flush``. The export process answers through one, so that it keeps
    reading the engine's messages however slowly the engine reads its answers (two processes each
    blocked writing to the other would never move again). A frame marked ``droppable`` (a report a later
    one supersedes) is left out while older bytes still wait."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._pending = bytearray()
        self._lock = threading.Lock()
        self.closed = False  # the reader went away: what is sent is dropped

    def send(self, payload: bytes, droppable: bool = False) -> None:
        with self._lock:
            if self.closed or (droppable and self._pending):
                return
            self._pending += _HEADER.pack(len(payload)) + payload
            self._flush()

    def flush(self) -> bool:
        """Write what waits, as far as the pipe takes it; True when nothing waits any more."""
        with self._lock:
            self._flush()
            return not self._pending

    @property
    def waiting(self) -> bool:
        return bool(self._pending)

    def _flush(self) -> None:
        while self._pending:
            try:
                written = os.write(self.fd, self._pending)
            except BlockingIOError:
                return
            except BrokenPipeError:  # the reader is gone (the engine died): nobody to answer any more
                self._pending.clear()
                self.closed = True
                return
            del self._pending[:written]


def readable(fds: list[int], timeout_s: float) -> list[int]:
    """Those of ``fds`` (-1: none) that can be read now or within ``timeout_s`` seconds (poll: no limit
    on how high a descriptor may be, unlike select)."""
    poller = select.poll()
    for fd in fds:
        if fd >= 0:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    # Whole milliseconds, rounded up: a timeout of 0.4 ms must wait, not return at once and spin.
    return [fd for fd, _ in poller.poll(max(0, math.ceil(timeout_s * 1000)))]
