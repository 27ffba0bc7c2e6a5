"""A ring of shared memory from one vLLM engine core to its frontend: the engine core's lines
(``engine_core_figures``) without a system call per step.

A socket write costs the engine core some 2.5-3 µs of CPU, and it wrote once per step. So, once connected,
the engine core makes a ring: an anonymous memory file (``memfd_create``), sealed so that its size can
never change, mapped in both processes. It hands the file to the frontend over the socket (``SCM_RIGHTS``),
then writes its lines into the ring, not the socket: a copy of the bytes and one 8-byte store of the
position written, about 0.5 µs. The frontend reads the ring as it reads the socket, as each batch of
outputs arrives.

The join stays exact. The engine core writes a step's line inside ``schedule()``, before the step runs;
its outputs reach the frontend afterwards, through vLLM's own sockets, whose system calls order memory
on both sides. So a line is in the ring by the time the frontend reads the outputs it belongs to.

Layout: a header of three native 64-bit words, then ``CAPACITY`` bytes of data.

- ``written``: bytes written so far (the engine core's; it stores it after the bytes);
- ``read``: bytes read so far (the frontend's; the engine core never writes past it, so nothing unread
  is ever overwritten: what does not fit is lost, and counted there);
- ``closed``: set by the frontend when it closes, so the engine core connects again.

Each word is read and stored whole, through a memoryview of 64-bit items: one aligned 8-byte load or
store. Not with ``struct.pack_into``: it zeroes its bytes before it writes the value, so the other process
could read a position of 0, and ``"<Q"`` goes byte by byte besides. The frontend then took the ring for a
stranger's and dropped it, and the engine core lost the steps it wrote until it connected again.

Only whole lines are written. A stranger that hands the frontend a file of another size, or without the
seals, is refused: a file whose size could shrink would crash the reader.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket

CAPACITY = 1 << 20  # bytes of lines; a step line of 64 requests is about 3 KB
WRITTEN, READ, CLOSED = 0, 1, 2  # the header's words
DATA = 64  # where the data begins (the header, padded to a cache line)
SIZE = DATA + CAPACITY
ANNOUNCE = b"R\n"  # the socket bytes the file rides on (a line no parser takes)
_SEALS = (
    getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SEAL", 0)
)


class RingWriter:
    """The engine core's end of one ring (``offer`` makes it and hands it over)."""

    __slots__ = ("_map", "_words", "written")

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map = mapped
        self._words = _words(mapped)
        self.written = 0

    @classmethod
    def offer(cls, connection: socket.socket) -> RingWriter | None:
        """Make a ring and send it over ``connection``; None where this system cannot (then the socket
        carries the lines, as before)."""
        if not hasattr(os, "memfd_create") or not hasattr(socket, "send_fds") or not _SEALS:
            return None
        fd = -1
        try:
            fd = os.memfd_create("otel-llm-vllm-steps", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, SIZE)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            mapped = mmap.mmap(fd, SIZE)
            if socket.send_fds(connection, [ANNOUNCE], [fd]) != len(ANNOUNCE):
                mapped.close()
                return None
        except OSError:
            return None
        finally:
            if fd >= 0:
                os.close(fd)  # the mapping keeps the file
        return cls(mapped)

    def write(self, data: bytes) -> bool | None:
        """Append ``data`` (whole lines). True: written; False: no room (lost); None: the frontend closed
        its end."""
        mapped, words = self._map, self._words
        read, closed = words[READ], words[CLOSED]
        if closed:
            return None
        written, size = self.written, len(data)
        if size > CAPACITY - (written - read):
            return False
        at = DATA + written % CAPACITY
        end = at + size
        if end <= SIZE:
            mapped[at:end] = data
        else:  # wraps around
            first = SIZE - at
            mapped[at:SIZE] = data[:first]
            mapped[DATA : DATA + size - first] = data[first:]
        self.written = written = written + size
        words[WRITTEN] = written  # after the bytes: the reader takes nothing unwritten
        return True

    def close(self) -> None:
        _unmap(self._map, self._words)


class RingReader:
    """The frontend's end of one ring, from the file descriptor the engine core sent (``accept``)."""

    __slots__ = ("_map", "_words", "read")

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map = mapped
        self._words = _words(mapped)
        self.read = 0

    @classmethod
    def accept(cls, fd: int) -> RingReader | None:
        """Map the ring of ``fd`` (closed here, mapped or not); None for a file that is not a sealed ring
        of this size."""
        try:
            if os.fstat(fd).st_size != SIZE:
                return None
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            if seals & _SEALS != _SEALS:
                return None
            return cls(mmap.mmap(fd, SIZE))
        except (OSError, ValueError, AttributeError):
            return None
        finally:
            os.close(fd)

    def take(self) -> bytes | None:
        """What was written since the last take (b"" when nothing), the read position handed back; None
        when the positions make no sense (not our engine core's ring: to be dropped)."""
        mapped, words = self._map, self._words
        written = words[WRITTEN]
        read = self.read
        if written == read:
            return b""
        size = written - read
        if size < 0 or size > CAPACITY:
            return None
        at = DATA + read % CAPACITY
        end = at + size
        data = mapped[at:end] if end <= SIZE else mapped[at:SIZE] + mapped[DATA : DATA + end - SIZE]
        self.read = written
        words[READ] = written
        return data

    def close(self) -> None:
        """Say so to the engine core (it connects again), and unmap."""
        with contextlib.suppress(ValueError):  # closed already
            self._words[CLOSED] = 1
        _unmap(self._map, self._words)


def _words(mapped: mmap.mmap) -> memoryview:
    """The header of ``mapped`` as 64-bit words (see the module's docstring for why not ``struct``)."""
    return memoryview(mapped)[:DATA].cast("Q")


def _unmap(mapped: mmap.mmap, words: memoryview) -> None:
    words.release()  # the map cannot close while a view of it is held
    with contextlib.suppress(BufferError, ValueError):
        mapped.close()
