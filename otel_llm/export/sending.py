"""The channel's sender thread: batches of records to the export process, its answers back.

One thread per channel (``otel_llm-export-sender``, a daemon) sleeps in ``poll`` on a self-pipe, which
the channel writes a byte to when something cannot wait for the next tick: the first record, a flush, a
shutdown. Otherwise it wakes every ``SEND_EVERY_S`` seconds, takes up to ``MAX_BATCH`` queued records
and the trackers' figures, and writes them as one ``batch`` message (``otel_llm.record.wire``, framed by
``otel_llm.export.frames``). It starts the export process when there is something to send
(``otel_llm.export.lifecycle``) and books what was sent, done and lost in the channel's ledger
(``otel_llm.export.ledger``).

The export process's answers wake this thread only while a flush awaits one; the acks it sends meanwhile
are read at the next tick, so they cost the engine no wake-up. Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from otel_llm.export.frames import readable
from otel_llm.export.ledger import DeliveryLedger, FlushRequests
from otel_llm.export.lifecycle import ExportProcess, stop_budget
from otel_llm.export.trackers import FeedingTrackers
from otel_llm.record.wire import decode, encode

__all__ = ["MAX_BATCH", "SEND_EVERY_S", "Sender"]

_log = logging.getLogger("otel_llm")

# How long a record waits at most before it is sent: a batch per some tens of engine steps, so the sender
# thread wakes five times a second (each wake-up takes the engine's GIL for a while), not once a step.
SEND_EVERY_S = 0.2
MAX_BATCH = 4096  # records per message


class Sender:
    """The thread that moves one channel's queue to its export process.

    ``queue``: (tracker key, a record's wire bytes), appended by the hooks; ``settings``: what the export
    process's ``configure()`` is given; ``engine_losses``: the engine's own pipeline's losses by signal,
    sent with each batch."""

    def __init__(
        self,
        queue: deque[tuple[int, bytes]],
        trackers: FeedingTrackers,
        ledger: DeliveryLedger,
        flushes: FlushRequests,
        process: ExportProcess,
        settings: Mapping[str, Any],
        engine_losses: Callable[[], dict[str, dict[str, int]]],
    ) -> None:
        self._queue = queue
        self._trackers = trackers
        self._ledger = ledger
        self._flushes = flushes
        self._process = process
        self._settings = dict(settings)
        self._engine_losses = engine_losses
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1  # the self-pipe: a byte written wakes the thread
        self._stop_deadline: float | None = None
        self.stopped_ok: bool | None = None  # the export process's last answer: it stopped in time

    @property
    def running(self) -> bool:
        """The thread is alive (it ends after a shutdown, or on a bug: then it logs why)."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread unless it runs or a shutdown was asked for."""
        with self._lock:
            if self._thread is not None or self._stop_deadline is not None:
                return
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            self._thread = threading.Thread(target=self._run, name="otel_llm-export-sender", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Have the thread look now, not at the next tick (never blocks: a full self-pipe is awake)."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def stop(self, deadline: float) -> threading.Thread | None:
        """Ask the thread to send what is queued and stop the export process by ``deadline``; returns the
        thread to join, None when none runs."""
        thread = self._thread
        with self._lock:
            if thread is None:
                return None
            self._stop_deadline = deadline
        self.wake()
        return thread

    def close_after_fork(self) -> None:
        """In a forked child: the parent's thread does not exist here; close the copies of its pipes."""
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._process.close_after_fork()

    # --- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        process, flushes = self._process, self._flushes
        try:
            next_tick = time.monotonic() + SEND_EVERY_S
            while True:
                awaited = process.answers_fd >= 0 and flushes.awaited
                fds = [self._wake_r, process.answers_fd] if awaited else [self._wake_r]
                ready = readable(fds, max(0.0, next_tick - time.monotonic()))
                if self._wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                stopping = self._stop_deadline is not None
                asked = stopping or flushes.pending
                due = time.monotonic() >= next_tick
                if not (due or asked or ready):
                    continue
                if process.answers_fd >= 0:
                    self._read_answers()
                self._check_process()
                if due or asked:
                    self._pump(everything=asked)
                    next_tick = time.monotonic() + SEND_EVERY_S
                if stopping:
                    self._stop()
                    return
                if flushes.pending and process.child is not None:
                    self._send(encode("flush", flushes.take()), 0)
        except Exception:  # never let the sender die silently: the records would pile up unseen
            _log.warning(
                "otel_llm: the export sender stopped; telemetry is no longer exported", exc_info=True
            )
        finally:
            with self._lock:
                for fd in (self._wake_r, self._wake_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self._wake_r = self._wake_w = -1
                self._thread = None
            flushes.wake_all()  # a caller waiting on a flush sees the thread gone

    def _pump(self, everything: bool) -> None:
        """Send what is queued (all of it when ``everything``), with the trackers' figures."""
        queue = self._queue
        while True:
            if self._process.child is None and not self._start_process():
                return
            n = min(len(queue), MAX_BATCH)
            records = [queue.popleft() for _ in range(n)]  # (key, wire bytes), made as each request finished
            parts = self._trackers.take_batch(everything)
            losses = {"records": self._ledger.losses(), **self._engine_losses()}
            body = (
                self._ledger.sent + 1,
                parts.greet,
                records,
                parts.figures,
                losses,
                parts.gone,
                parts.windows,
            )
            if not self._send(encode("batch", body), n):
                return
            self._trackers.sent(parts)
            if not (everything and queue):
                return

    def _send(self, message: bytes, records: int) -> bool:
        """Write one message holding ``records`` records; on a dead export process count what it lost."""
        try:
            self._process.write(message)
        except OSError as exc:
            self._died(f"its pipe closed: {exc}", records)
            return False
        self._ledger.count_sent(records)
        return True

    def _start_process(self) -> bool:
        """Start the export process when there is something to send (or a flush asks for what the
        trackers report) and no back-off holds it."""
        if self._process.backing_off:
            return False
        flushing = self._flushes.pending or self._stop_deadline is not None
        if not self._queue and not flushing and not self._trackers.active():
            return False
        why = self._process.start()
        if why is not None:
            self._died(why, 0)
            return False
        self._trackers.new_process()
        self._ledger.process_started()
        return self._send(encode("start", {**self._settings, "parent_pid": os.getpid()}), 0)

    def _read_answers(self, draining: bool = False) -> None:
        """Take the export process's answers that wait in its pipe; ``draining``: all of them, from one
        that has died (its last acks count before the loss is)."""
        reader = self._process.reader
        if reader is None:
            return
        alive = reader.fill()
        while draining and alive:  # until the end of the stream, or nothing more to read now
            before = reader.pending
            alive = reader.fill()
            if reader.pending == before:
                break
        for frame in reader.frames():
            kind, body = decode(frame)
            if kind == "ack":
                self._ledger.acknowledged(body[0], body[1])
            elif kind == "flushed":
                flush, in_time, done, delivery = body
                self._ledger.acknowledged(done, delivery)
                self._flushes.answered(flush, in_time)
            elif kind == "stopped":
                in_time, done, delivery = body
                self._ledger.acknowledged(done, delivery)
                self.stopped_ok = bool(in_time)
        if not alive and not draining and self._process.child is not None and self.stopped_ok is None:
            self._died("its pipe closed", 0)

    def _check_process(self) -> None:
        words = self._process.exited()
        if words is not None:
            self._read_answers()  # what it said before it went
            if self._process.child is not None:
                self._died(words, 0)

    def _died(self, why: str, unsent: int) -> None:
        """The export process is gone: what it had not finished (and ``unsent`` records of a message it
        did not take) is counted as lost; it is started again after the back-off."""
        if self._process.reader is not None:  # its last acks may still wait in the pipe: they count first
            with contextlib.suppress(OSError, ValueError):
                self._read_answers(draining=True)
        lost = self._ledger.process_exited(unsent)
        self._process.ended(why, lost)
        self._flushes.wake_all()

    def _stop(self) -> None:
        """Tell the export process to stop within the deadline and wait for its answer until the grace
        after it; past that it is killed, and the requests it had not finished count as unsent."""
        deadline = self._stop_deadline or time.monotonic()
        child = self._process.child
        if child is None:
            self.stopped_ok = not self._queue
        else:
            self._send(encode("stop", stop_budget(deadline - time.monotonic())), 0)
            self.stopped_ok = self._process.stop(child, deadline, self._take_stop_answer)
        self._ledger.unsent_at_shutdown(len(self._queue))
        self._queue.clear()

    def _take_stop_answer(self) -> bool | None:
        self._read_answers()
        return self.stopped_ok
