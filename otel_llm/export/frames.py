"""Length-prefixed frames over a pipe: how the engine's process and its export process delimit messages.

A frame is a 4-byte little-endian length and that many bytes (one ``otel_llm.record.wire`` message).
Writes go whole (``os.write`` until every byte is out, on a blocking descriptor); reads collect bytes as
they come and hand out the frames that are complete.
"""

from __future__ import annotations

import os
import struct
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
