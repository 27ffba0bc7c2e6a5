"""What vLLM's engine core found cached at each rescheduling, carried to a frontend in another process.

Under ``vllm serve`` (and ``LLM`` with multiprocessing on, vLLM's default) the scheduler runs in an
engine-core process of its own, and what it sends the frontend does not say what a rescheduled request
found in the prefix cache (``rescheduling``). vLLM loads otel_llm's general plugin in that process
too, so there the instrumentor wraps ``Scheduler.schedule`` as it does in process, and each
``schedule()`` result that re-admits preempted requests goes to the frontend, a line per rescheduling:

- the frontend (``FrontendFigures``) listens on a Unix stream socket in the abstract namespace named
  after the process that started the engine cores and its own client index (vLLM's ``client_index``,
  one per API server): its own pid when its engine client launched them (``LLM``, ``vllm serve``), its
  parent's when it was handed their addresses (``vllm serve --api-server-count N``, whose API servers and
  engine cores are children of one launcher);
- the engine core (``EngineCoreFigures``) connects to its parent's pid and the request's
  ``client_index`` and writes without blocking (what does not fit, beyond a bound, is lost and counted;
  the frontend notices, see below);
- the frontend reads, without blocking, when it replays the SCHEDULED event of a request it saw
  preempted and finds no figure yet. The engine core wrote the figure inside ``schedule()``, before the
  step ran and so before the output that carries that event, and data written to a Unix stream socket is
  in the reader's queue when the write returns: the figure is there by then or it was never sent. So the
  join is exact, with no thread, no wait and nothing to hold at finish.

A stream, not datagrams: a Unix datagram socket queues only ``net.unix.max_dgram_qlen`` datagrams (10 by
default), which a frontend a few steps behind its engine core would overrun; a stream queues bytes (its
buffer holds thousands of figures).

What is written is text, one line per rescheduling: ``<SCHEDULED timestamp!r> <cached tokens> <request
id>`` (the timestamp is the engine core's ``time.monotonic()`` value vLLM also puts on the event, so the
two match exactly). Any local process can connect to an abstract address, so what arrives is parsed
strictly (a line that does not parse is dropped) and a figure is only ever taken by a request the
frontend has open, by its id and that timestamp.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

_log = logging.getLogger(__name__)

NAME = "otel-llm-vllm-figures-{pid}-{client}"
CHUNK = 65_536  # bytes read at a time
MAX_UNSENT = 65_536  # bytes an engine core keeps for a stream that is full (about a thousand figures)
MAX_CONNECTIONS = 64  # engine cores one frontend reads from (data-parallel ranks), at most
# After "nobody listens there" (a frontend without otel_llm, or engine cores on another machine), the
# engine core stops trying that address for this long: one failed syscall per address and interval.
QUIET_S = 10.0


def address(pid: int, client_index: int) -> bytes:
    """The abstract-namespace address of the frontend with this client index under this pid."""
    return b"\0" + NAME.format(pid=pid, client=client_index).encode()


def encode(figures: Iterable[tuple[str, float, int]]) -> bytes:
    """A line per (request id, SCHEDULED timestamp, cached tokens)."""
    return "".join(f"{ts!r} {cached} {rid}\n" for rid, ts, cached in figures if "\n" not in rid).encode()


def decode(lines: bytes) -> list[tuple[str, float, int]]:
    """The (request id, timestamp, cached tokens) of whole lines; lines that do not parse are dropped."""
    found = []
    for line in lines.decode("utf-8", "replace").split("\n"):
        parts = line.split(" ", 2)
        if len(parts) != 3 or not parts[2]:
            continue
        try:
            ts, cached = float(parts[0]), int(parts[1])
        except ValueError:
            continue
        if cached >= 0 and ts == ts:  # not NaN
            found.append((parts[2], ts, cached))
    return found


class EngineCoreFigures:
    """The engine core's side: write a ``schedule()`` result's reschedulings to their frontends."""

    def __init__(self) -> None:
        self._parent = os.getppid()  # the process that started this engine core
        self._addresses: dict[int, bytes] = {}  # by client index
        self._connections: dict[bytes, socket.socket] = {}
        self._unsent: dict[bytes, bytes] = {}  # what a full stream did not take yet, by address
        self._quiet_until: dict[bytes, float] = {}
        self.sent = 0  # figures written, or held to be written with the next ones (a full stream)
        self.lost = 0  # figures that could not be
        self._warned = False

    def send(self, found: list[tuple[str, float, int, int]]) -> None:
        """``found``: (request id, SCHEDULED timestamp, cached tokens, client index) of each rescheduling."""
        by_client: dict[int, list[tuple[str, float, int]]] = {}
        for rid, ts, cached, client in found:
            by_client.setdefault(client, []).append((rid, ts, cached))
        for client, figures in by_client.items():
            to = self._addresses.get(client)
            if to is None:
                to = self._addresses[client] = address(self._parent, client)
            connection = self._connections.get(to) or self._connect(to)
            if connection is None:
                self.lost += len(figures)
                continue
            data = encode(figures)
            if self._unsent:
                data = self._unsent.pop(to, b"") + data
            try:
                written = connection.send(data, socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError:  # the frontend went away: connect again next time
                connection.close()
                del self._connections[to]
                self.lost += len(figures)
                continue
            if written == len(data):
                self.sent += len(figures)
                continue
            rest = data[written:]
            if len(rest) <= MAX_UNSENT:
                self._unsent[to] = rest  # written with the next figures (a partial line stays whole)
                self.sent += len(figures)
            else:
                self._unsent[to] = rest[: rest.index(b"\n") + 1] if b"\n" in rest else b""
                self.lost += len(figures)
                self._warn("the frontend reads too slowly")

    def _connect(self, to: bytes) -> socket.socket | None:
        if self._quiet_until and self._quiet_until.get(to, 0.0) > time.monotonic():
            return None
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.setblocking(False)
        try:
            connection.connect(to)
        except OSError as exc:
            connection.close()
            self._quiet_until[to] = time.monotonic() + QUIET_S
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                _log.debug("otel_llm: no frontend listens for engine-core figures at %r", to)
            else:
                self._warn(str(exc))
            return None
        self._connections[to] = connection
        return connection

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True  # the frontend sees each missing figure and warns there too
            _log.warning("otel_llm: could not send reschedulings' cached tokens to the frontend: %s", why)


class FrontendFigures:
    """The frontend's side: the socket its engine cores write to, read when a figure is wanted."""

    def __init__(self, pid: int, client_index: int) -> None:
        self.address = address(pid, client_index)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.address)
            self._listener.listen(16)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._readers: dict[socket.socket, bytes] = {}  # connection -> its partial last line
        self.received = 0  # figures read

    def drain(self) -> list[tuple[str, float, int]]:
        """Every figure written to this frontend so far and not read yet."""
        while len(self._readers) < MAX_CONNECTIONS:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            connection.setblocking(False)
            self._readers[connection] = b""
        found: list[tuple[str, float, int]] = []
        for connection in list(self._readers):
            data, closed = self._readers[connection], False
            while True:
                try:
                    chunk = connection.recv(CHUNK)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                data += chunk
            whole, _, partial = data.rpartition(b"\n")
            if whole:
                found.extend(decode(whole))
            if closed:
                connection.close()
                del self._readers[connection]
            else:
                self._readers[connection] = partial[-MAX_UNSENT:]
        self.received += len(found)
        return found

    def close(self) -> None:
        for connection in self._readers:
            connection.close()
        self._readers = {}
        self._listener.close()


def frontend_key(bound: dict[str, Any]) -> tuple[int, int]:
    """(pid, client index) a frontend listens under, from its engine's ``__init__`` arguments: its parent's
    pid when it was given the engine cores' addresses (they were started by that launcher), else its own."""
    client_index = bound.get("client_index", 0)
    if not isinstance(client_index, int):
        client_index = 0
    pid = os.getppid() if bound.get("client_addresses") else os.getpid()
    return pid, client_index
