"""What vLLM's engine core knows and its frontend in another process does not, carried there: what each
rescheduling found cached, and what each step computed per request.

Under ``vllm serve`` (and ``LLM`` with multiprocessing on, vLLM's default) the scheduler runs in an
engine-core process of its own, and what it sends the frontend does not say what a rescheduled request
found in the prefix cache (``rescheduling``). vLLM loads otel_llm's general plugin in that process
too, so there the instrumentor wraps ``Scheduler.schedule`` as it does in process, and each
``schedule()`` result goes to the frontend: a line per rescheduling of a preempted request, and a line per
step with its ``num_scheduled_tokens`` (the tracker's ``batch()``, for stalls; ``compositions``):

- the frontend (``FrontendFigures``, in ``frontend_figures``) listens on a Unix stream socket in the
  abstract namespace named after the process that started the engine cores and its own client index
  (vLLM's ``client_index``, one per API server): its own pid when its engine client launched them
  (``LLM``, ``vllm serve``), its parent's when it was handed their addresses (``vllm serve
  --api-server-count N``, whose API servers and engine cores are children of one launcher);
- the engine core (``EngineCoreFigures``, here) connects to its parent's pid and the request's
  ``client_index`` and writes without blocking (what does not fit, beyond a bound, is lost and counted;
  the frontend notices, see below);
- the frontend reads, without blocking, as each batch of outputs arrives (and when it replays the
  SCHEDULED event of a request it saw preempted and finds no figure yet). The engine core wrote a step's
  lines inside ``schedule()``, before the step ran and so before the outputs that carry its events and
  tokens, and data written to a Unix stream socket is in the reader's queue when the write returns: a
  line is there by then or it was never sent. So the join is exact, with no thread, no wait and nothing
  to hold at finish.

A stream, not datagrams: a Unix datagram socket queues only ``net.unix.max_dgram_qlen`` datagrams (10 by
default), which a frontend a few steps behind its engine core would overrun; a stream queues bytes (its
buffer holds thousands of figures).

What is written is text, a line per rescheduling and a line per step (``figure_lines`` has the format
and the frontend's address).

Once connected, the engine core writes its lines to a ring of shared memory it hands the frontend over
the socket (``step_ring``), not to the socket: a step then costs it no system call. Where the ring
cannot be made, the socket carries them.

Any local process can connect to an abstract address, so what arrives is parsed strictly (a line that
does not parse is dropped), a figure is only ever taken by a request the frontend has open, by its id and
that timestamp, and a step only tells the frontend's trackers what an engine step held.
"""

from __future__ import annotations

import errno
import itertools
import logging
import operator
import os
import socket
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from otel_llm.integrations.vllm.figure_lines import MAX_UNSENT, address, encode, encode_step
from otel_llm.integrations.vllm.step_ring import RingWriter

_log = logging.getLogger(__name__)

# After "nobody listens there" (a frontend without otel_llm, or engine cores on another machine), the
# engine core stops trying that address for this long: one failed syscall per address and interval.
QUIET_S = 10.0
# Ring writes between two checks that the frontend still holds its end of the socket (one recv each).
CHECK_EVERY = 4096
# Whether the engine core writes a step line with the same ids as the line before as ``=`` (_send_step).
SAME_LINES = True
# Step lines held for a frontend none of whose requests is in them, at most (``_hold``): they go out with
# its next write, which must fit the ring (a line of 64 requests is about 3 KB).
MAX_HELD_STEPS = 64


class EngineCoreFigures:
    """The engine core's side: write a ``schedule()`` result's reschedulings and its step to their
    frontends."""

    def __init__(self) -> None:
        self._parent = os.getppid()  # the process that started this engine core
        self._addresses: dict[int, bytes] = {}  # by client index
        self._connections: dict[bytes, socket.socket] = {}
        self._rings: dict[bytes, RingWriter] = {}  # the shared-memory ring of a connection, by address
        self._ring_writes = 0
        self._ring_of: dict[int, RingWriter] = {}  # the same rings, by client index (a step's fast path)
        self._unsent: dict[bytes, bytes] = {}  # what a full stream did not take yet, by address
        # The ids of the step line last written to each client (the one frontend case): a step with the
        # same ids writes ``=`` for them.
        self._last_ids: dict[int, list[str]] = {}
        self._quiet_until: dict[bytes, float] = {}
        # The client indexes of the requests scheduled so far (``learn``): every step goes to each, since a
        # request's stalls are caused by the whole step, whichever API server its other requests came from.
        self.clients: set[int] = set()
        self.sent = 0  # figures written, or held to be written with the next ones (a full stream)
        self.lost = 0  # figures that could not be
        self.steps_sent = 0  # step lines written (or held), summed over frontends
        self.steps_lost = 0
        # Step lines for a client none of whose requests is in the step, by client index: written with
        # its next write (``send``); the newest MAX_HELD_STEPS.
        self._held: dict[int, deque[bytes]] = {}
        self._warned = False

    def learn(self, scheduler: Any, output: Any) -> None:
        """Note the client index of each request ``output`` schedules for the first time."""
        requests = getattr(scheduler, "requests", {})
        for new in getattr(output, "scheduled_new_reqs", ()):
            client = getattr(requests.get(getattr(new, "req_id", None)), "client_index", 0)
            self.clients.add(client if isinstance(client, int) else 0)

    def send(
        self,
        found: list[tuple[str, float, int, int]],
        step: tuple[float, Mapping[str, int], Any, list[str] | None] | None = None,
        requests: Mapping[str, Any] | None = None,
    ) -> None:
        """``found``: (request id, SCHEDULED timestamp, cached tokens, client index) of each rescheduling,
        to its client's frontend; ``step``: ``encode_step``'s arguments, to the frontend of every client
        index seen. At most one write per frontend.

        ``requests``: the scheduler's requests by id (their ``client_index``). With several clients, a
        step none of whose requests is a client's is held for it and written with its next write, the
        one that comes before its next outputs. A frontend reads only as its outputs arrive, and a Unix
        stream's buffer takes some 280 small writes (each costs about 770 bytes of it, whatever it holds):
        an API server whose requests all wait would otherwise fill it, and the figure of its next
        rescheduling would wait behind it, to arrive after the outputs it belongs to."""
        clients = self.clients
        if step is not None and not found and len(clients) == 1 and not self._held:
            self._send_step(next(iter(clients)), step)  # the common step: one frontend, nothing re-admitted
            return
        self._last_ids.clear()  # every line below names its requests
        by_client: dict[int, list[tuple[str, float, int]]] = {}
        for rid, ts, cached, client in found:
            by_client.setdefault(client, []).append((rid, ts, cached))
        line = b""
        if step is not None:
            line = encode_step(*step)
            clients = self.clients
            present = clients
            if len(clients) > 1 and requests:
                present = _clients_in(step[1], requests, len(clients)) or clients
            for client in clients:
                if client in present or client in by_client:
                    by_client.setdefault(client, [])
                else:
                    self._hold(client, line)
        for client, figures in by_client.items():
            with_step = bool(line) and client in self.clients
            data = encode(figures) + line if with_step else encode(figures)
            held = self._held.pop(client, None) if self._held else None
            steps = with_step + (len(held) if held else 0)
            if self._write(client, b"".join(held) + data if held else data):
                self.sent += len(figures)
                self.steps_sent += steps
            else:
                self.lost += len(figures)
                self.steps_lost += steps

    def _send_step(self, client: int, step: tuple[float, Mapping[str, int], Any, list[str] | None]) -> None:
        """One step's line to the one frontend, ``=`` for its ids when they are the last line's. Every
        step of an engine core runs this: a decode batch that did not change, written to the ring, takes
        the first branch alone."""
        ts, scheduled, total, recompute = step
        ids = list(scheduled)
        same = SAME_LINES and ids == self._last_ids.get(client)
        if same and total == len(ids) and not recompute:
            line = f"S {ts!r} {total} - - =\n".encode()
        else:
            line = encode_step(ts, scheduled, total, recompute, ids, same)
        ring = self._ring_of.get(client)
        if ring is not None and (self._ring_writes + 1) % CHECK_EVERY and ring.write(line):
            self._ring_writes += 1
            written = True
        else:
            written = self._write(client, line)
        if written:
            self.steps_sent += 1
            if not same:
                self._last_ids[client] = ids
        else:
            self.steps_lost += 1
            self._last_ids.pop(client, None)  # the frontend did not get it: the next line names its ids

    def _write(self, client: int, data: bytes) -> bool:
        """Write ``data`` (whole lines) to the frontend of ``client`` without blocking; False: lost."""
        to = self._addresses.get(client)
        if to is None:
            to = self._addresses[client] = address(self._parent, client)
        connection = self._connections.get(to) or self._connect(to)
        if connection is None:
            return False
        ring = self._rings.get(to) if self._rings else None
        if ring is not None:
            return self._write_ring(to, connection, ring, data)
        if self._unsent:
            data = self._unsent.pop(to, b"") + data
        try:
            written = connection.send(data, socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            written = 0
        except OSError:  # the frontend went away: connect again next time
            connection.close()
            del self._connections[to]
            return False
        if written == len(data):
            return True
        rest = data[written:]
        if len(rest) <= MAX_UNSENT:
            self._unsent[to] = rest  # written with the next lines (a partial line stays whole)
            return True
        self._unsent[to] = rest[: rest.index(b"\n") + 1] if b"\n" in rest else b""
        self._warn("the frontend reads too slowly")
        return False

    def _write_ring(self, to: bytes, connection: socket.socket, ring: RingWriter, data: bytes) -> bool:
        written = ring.write(data)
        if written:
            self._ring_writes += 1
            if self._ring_writes % CHECK_EVERY or _alive(connection):
                return True
        elif written is False and _alive(connection):  # no room: the frontend reads too slowly
            self._warn("the frontend reads too slowly")
            return False
        # The frontend closed its end (or went away): what was written is lost; connect again next time.
        self._drop(to)
        return False

    def _drop(self, to: bytes) -> None:
        ring = self._rings.pop(to, None)
        if ring is not None:
            ring.close()
            self._ring_of = {c: r for c, r in self._ring_of.items() if r is not ring}
        connection = self._connections.pop(to, None)
        if connection is not None:
            connection.close()
        self._unsent.pop(to, None)

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
        self._last_ids.clear()  # a new connection: its first step line names its requests
        ring = RingWriter.offer(connection)
        if ring is not None:
            self._rings[to] = ring
            self._ring_of = {c: self._rings[a] for c, a in self._addresses.items() if a in self._rings}
        return connection

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True  # the frontend sees each missing figure and warns there too
            _log.warning("otel_llm: could not send the engine core's figures to the frontend: %s", why)

    def _hold(self, client: int, line: bytes) -> None:
        """Keep ``line`` for ``client``'s next write; the oldest go past ``MAX_HELD_STEPS``."""
        held = self._held.get(client)
        if held is None:
            held = self._held[client] = deque(maxlen=MAX_HELD_STEPS)
        held.append(line)


def _alive(connection: socket.socket) -> bool:
    """Whether the frontend still holds its end of ``connection`` (one recv that does not wait)."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


_CLIENT = operator.attrgetter("client_index")


def _clients_in(scheduled: Mapping[str, int], requests: Mapping[str, Any], wanted: int) -> set[int] | None:
    """The client indexes of the requests in a step (None: a request without one, so every client). The
    first few requests usually hold one of each API server; else all are looked up, at C speed."""
    try:
        present = set(map(_CLIENT, map(requests.__getitem__, itertools.islice(scheduled, 4))))
        if len(present) < wanted:
            present.update(map(_CLIENT, map(requests.__getitem__, scheduled)))
    except (KeyError, AttributeError, TypeError):
        return None
    return {c if isinstance(c, int) else 0 for c in present}  # as learn() counts them
