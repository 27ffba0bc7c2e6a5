"""The frontend's side of the figures a vLLM engine core in another process sends (``engine_core_figures``):
the socket its engine cores write to, and the rings of shared memory they hand it (``step_ring``), read
without blocking as each batch of outputs arrives and when a rescheduling's figure is wanted.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from collections import deque
from typing import Any

from otel_llm.integrations.vllm.compositions import MAX_PENDING_STEPS, Step
from otel_llm.integrations.vllm.figure_lines import MAX_UNSENT, PreviousStep, address, decode
from otel_llm.integrations.vllm.step_ring import RingReader

CHUNK = 65_536  # bytes read at a time
MAX_CONNECTIONS = 64  # engine cores one frontend reads from (data-parallel ranks), at most


class FrontendFigures:
    """The frontend's side: the socket its engine cores write to, read as outputs arrive and when a
    figure is wanted."""

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
        self._rings: dict[socket.socket, RingReader] = {}  # connection -> the ring its engine core sent
        self._previous: dict[socket.socket, PreviousStep] = {}  # connection -> its last step line
        self._poll = select.poll()  # the listener and every reader, for a read's one system call
        self._poll.register(self._listener, select.POLLIN)
        self._by_fd: dict[int, socket.socket] = {self._listener.fileno(): self._listener}
        self.received = 0  # figures read
        # Steps read and not taken yet (``take_steps``), oldest first; bounded for a frontend that reads
        # figures but has no adapter to take its steps.
        self._steps: deque[Step] = deque(maxlen=MAX_PENDING_STEPS)

    def drain(self) -> list[tuple[str, float, int]]:
        """Every figure written to this frontend so far and not read yet; the steps read on the way are
        kept for ``take_steps``.

        One ``poll`` with no timeout says which connections have data and whether an engine core is
        waiting to connect: this runs as each batch of outputs arrives, and a read that finds nothing
        costs that one system call (no accept or recv that fails with an exception). ``poll``, not
        ``select``: an API server's descriptors may be numbered past ``select``'s 1024. Then each
        engine core's ring (``step_ring``), where its lines go once it sent one: a memory read each."""
        listener, readers, rings = self._listener, self._readers, self._rings
        events = self._poll.poll(0)
        if not events:
            if not rings:
                return []
            if len(rings) == 1:  # the usual case: one engine core, nothing on its socket
                return self._read_one_ring()
        by_fd = self._by_fd
        ready = [by_fd[fd] for fd, _ in events if fd in by_fd]
        found: list[tuple[str, float, int]] = []
        steps: list[Step] = []
        closed_ones: list[socket.socket] = []
        if listener in ready:
            while len(readers) < MAX_CONNECTIONS:
                try:
                    connection, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                connection.setblocking(False)
                readers[connection] = b""
                self._previous[connection] = PreviousStep()
                by_fd[connection.fileno()] = connection
                self._poll.register(connection, select.POLLIN)
                ready.append(connection)  # it may have written already
        for connection in ready:
            if connection is listener or connection not in readers:
                continue
            data, closed = readers[connection], False
            while True:
                try:
                    chunk, fds, _, _ = socket.recv_fds(connection, CHUNK, 1)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    closed = True
                    break
                for fd in fds:  # the engine core's ring: its lines come there from now on
                    ring = RingReader.accept(fd)
                    if ring is not None and connection not in rings:
                        rings[connection] = ring
                    elif ring is not None:
                        ring.close()
                if not chunk:
                    closed = True
                    break
                data += chunk
                if len(chunk) < CHUNK:
                    break  # all there was: no second recv to find the queue empty
            whole, _, partial = data.rpartition(b"\n")
            if whole:
                found.extend(decode(whole, steps, self._previous[connection]))
            if closed:
                closed_ones.append(connection)
            else:
                self._readers[connection] = partial[-MAX_UNSENT:]
        for connection, ring in list(rings.items()):  # after the socket: its bytes came first
            taken = ring.take()
            if taken is None:  # not a ring our engine cores write
                ring.close()
                del rings[connection]
            elif taken:
                found.extend(decode(taken.rpartition(b"\n")[0], steps, self._previous[connection]))
        for connection in closed_ones:
            self._forget(connection)
        self.received += len(found)
        if steps:
            # Several engine cores (data-parallel ranks) each write in order; the frontend needs one order.
            self._steps.extend(sorted(steps, key=_step_time) if len(self._readers) > 1 else steps)
        return found

    def _read_one_ring(self) -> list[tuple[str, float, int]]:
        """``drain`` where the only connection is one engine core's, with its ring, and no socket has
        anything: that ring's new lines alone."""
        ((connection, ring),) = self._rings.items()
        taken = ring.take()
        if not taken:
            if taken is None:  # not a ring our engine cores write
                ring.close()
                del self._rings[connection]
            return []
        steps: list[Step] = []
        found = decode(taken.rpartition(b"\n")[0], steps, self._previous[connection])
        self.received += len(found)
        if steps:
            self._steps.extend(steps)
        return found

    def _forget(self, connection: socket.socket) -> None:
        self._by_fd.pop(connection.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):  # never registered, or its descriptor gone
            self._poll.unregister(connection)
        ring = self._rings.pop(connection, None)
        if ring is not None:
            ring.close()
        self._previous.pop(connection, None)
        connection.close()
        del self._readers[connection]

    def take_steps(self) -> list[Step]:
        """The steps read so far (``drain``) and not taken yet, oldest first."""
        steps = self._steps
        if not steps:
            return []
        taken = list(steps)
        steps.clear()
        return taken

    def close(self) -> None:
        for ring in self._rings.values():
            ring.close()  # tells the engine core
        for connection in self._readers:
            connection.close()
        self._readers, self._by_fd, self._poll = {}, {}, select.poll()  # a later drain finds nothing
        self._rings, self._previous = {}, {}
        self._listener.close()


def _step_time(step: Step) -> float:
    return step[0]


def frontend_key(bound: dict[str, Any]) -> tuple[int, int]:
    """(pid, client index) a frontend listens under, from its engine's ``__init__`` arguments: its parent's
    pid when it was given the engine cores' addresses (they were started by that launcher), else its own."""
    client_index = bound.get("client_index", 0)
    if not isinstance(client_index, int):
        client_index = 0
    pid = os.getppid() if bound.get("client_addresses") else os.getpid()
    return pid, client_index
