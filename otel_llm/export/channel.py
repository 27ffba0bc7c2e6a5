"""The engine side of the export process: finished requests' records, batched and sent to a child process
that builds and exports their spans and metric values (``otel_llm.export.process``).

What a hook pays per finished request is building its record and one ``deque.append`` (``Feed.request``);
a sender thread wakes every ``SEND_EVERY_S`` seconds, takes what is queued and the trackers' figures
(counters, gauges, the per-step samples of inter-token latency and tokens per step), encodes them in the
record's wire form (``otel_llm.record.wire``) and writes them to the export process's pipe. Nothing
here blocks a hook or raises into it:

- a full queue (``OTEL_LLM_EXPORT_QUEUE_SIZE`` records, default 16384) drops the new record and counts it
  (reason ``queue_full``);
- the export process is started (a new interpreter, ``sys.executable -m otel_llm.export.process``, never a
  fork) when there is something to send; if it dies, the records it had not finished are counted as lost
  (reason ``export_process_exited``, exactly those sent and not acknowledged), one warning says so, and it
  is started again after a back-off (0.5 s, doubling to 30 s); records queued meanwhile wait for it;
- both counts are exported by the export process as ``otel_llm.export.records.dropped``;
- a forked child of the engine gets a channel of its own (its own export process when it sends).

``flush`` and ``shutdown`` are bounded by the caller's timeout. When the engine's process dies, the
export process sees its pipe close, exports what it holds and exits.

Which trackers use it: ``configure()`` in the export mode ``process`` registers its providers here
(``register``); a tracker on those providers, or on the global ones that ``configure()`` set, without a
span hook, gets a ``Feed`` (``feed_for``). With ``OTEL_LLM_EXPORT_MODE=process`` and global providers
set by something else (``opentelemetry-instrument``), trackers on them get a channel built from the same
``OTEL_*`` variables.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import math
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

from otel_llm.export.frames import FrameReader, write_frame
from otel_llm.logs import warn_once
from otel_llm.record import Producer, RequestRecord
from otel_llm.record.wire import decode, encode, figures_tuple, info_tuple, record_bytes

_log = logging.getLogger("otel_llm")

ENV_EXPORT_MODE = "OTEL_LLM_EXPORT_MODE"
MODE_PROCESS = "process"
MODE_IN_PROCESS = "in_process"
MODES = (MODE_PROCESS, MODE_IN_PROCESS)
ENV_QUEUE_SIZE = "OTEL_LLM_EXPORT_QUEUE_SIZE"
DEFAULT_QUEUE_SIZE = 16_384
# How long a record waits at most before it is sent: a batch per some tens of engine steps, so the sender
# thread wakes five times a second (each wake-up takes the engine's GIL for a while), not once a step.
SEND_EVERY_S = 0.2
MAX_BATCH = 4096  # records per message
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
QUEUE_FULL = "queue_full"
PROCESS_EXITED = "export_process_exited"
UNSENT_AT_SHUTDOWN = "unsent_at_shutdown"  # not through the export process when shutdown's time ran out
# How long past the shutdown's deadline the export process may take to stop its exporters and say what it
# delivered (its own shutdown's grace is 1 s), before it is killed. The caller is not held that long:
# Telemetry.shutdown returns within its own grace, and this wait goes on in the sender thread.
_STOP_GRACE_S = 3.0


def export_mode(value: str | None = None) -> str | None:
    """``value``, else ``OTEL_LLM_EXPORT_MODE``; None when neither says. ValueError naming the bad one."""
    source = "export_mode"
    if value is None:
        value = os.environ.get(ENV_EXPORT_MODE, "").strip().lower() or None
        source = ENV_EXPORT_MODE
        if value is None:
            return None
    if value not in MODES:
        raise ValueError(f"{source}={value!r}: pass {MODE_PROCESS!r} or {MODE_IN_PROCESS!r}")
    return value


def queue_size() -> int:
    """``OTEL_LLM_EXPORT_QUEUE_SIZE``, else 16384; ValueError naming it when it is not a positive int."""
    raw = os.environ.get(ENV_QUEUE_SIZE, "").strip()
    if not raw:
        return DEFAULT_QUEUE_SIZE
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_QUEUE_SIZE}={raw!r}: pass a positive number of records, e.g. 16384")
    return value


class Feed:
    """One tracker's records, into a channel (the ``otel_llm.record.RecordConsumer`` of that tracker)."""

    def __init__(self, channel: ExportChannel, tail: Any) -> None:
        self._channel = channel
        self._tail = tail  # otel_llm.emit.sampling.TailSampling, or None
        self._sampler: Any = None
        self._key = -1

    def bind(self, producer: Producer) -> None:
        self._key = self._channel.add(producer, self._tail)
        if self._tail is not None:
            from otel_llm.emit.sampling import TailSampler

            self._sampler = TailSampler(self._tail)

    def request(self, record: RequestRecord) -> None:
        self._channel.put(self._key, record_bytes(record))

    def would_keep(self, record: RequestRecord) -> bool:
        if self._sampler is None:
            return True
        from otel_llm.emit.intervals import Intervals

        return self._sampler.would_keep(record, Intervals(record))

    def flush(self, timeout_millis: int) -> bool:
        return self._channel.flush(timeout_millis / 1000)

    def after_fork(self) -> None:
        """Nothing: the channel resets itself in a forked child."""


class ExportChannel:
    """The pipe to one export process and the records waiting for it.

    ``settings``: what the export process's ``configure()`` is given (``otel_llm.export.process``);
    ``environ``: the environment it starts with (the engine's, as it was when ``configure()`` ran)."""

    def __init__(
        self, settings: Mapping[str, Any], environ: Mapping[str, str], max_queue: int = DEFAULT_QUEUE_SIZE
    ) -> None:
        self._settings = dict(settings)
        self._environ = dict(environ)
        self._max = max_queue
        self._queue: deque[tuple[int, bytes]] = deque()  # (tracker key, a record's wire form)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # key -> (the tracker, weakly: one that is gone stops reporting, as in process; tail settings;
        # its TrackerInfo's wire form, kept so that its last records still go out after it is gone)
        self._producers: dict[int, tuple[weakref.ref[Any], Any, tuple[Any, ...]]] = {}
        self._keys = 0
        self._losses = {QUEUE_FULL: 0, PROCESS_EXITED: 0, UNSENT_AT_SHUTDOWN: 0}
        self._reset()
        _LIVE.add(self)

    def count_engine_drops(self, drops: Any) -> None:
        """``drops``: this process's own pipeline's ``DropCounter`` (what the application exports here),
        whose counts the export process adds to ``otel_llm.export.*.dropped``: one series for both."""
        self._drops = drops

    def _engine_drops(self) -> dict[str, dict[str, int]]:
        drops = getattr(self, "_drops", None)
        if drops is None:
            return {}
        return {signal: drops.by_reason(signal) for signal in ("spans", "metric_points")}

    def _reset(self) -> None:
        """State of a channel that has not started (and of one in a forked child)."""
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._to_child = self._from_child = -1
        self._reader: FrameReader | None = None
        self._wake_r, self._wake_w = -1, -1
        self._greeted: set[int] = set()  # trackers the current export process knows
        self._sent = 0  # records written to export processes, numbered from 1
        self._done = 0  # the last record an export process finished
        self._delivered_past: dict[str, Any] = {}  # totals of export processes that ended
        self._delivery: dict[str, Any] = {}  # the current one's
        self._restart_at = 0.0
        self._backoff = RESTART_FIRST_S
        self._warned = False
        self._flush_wanted = self._flush_sent = self._flushed = 0
        self._flush_ok = True
        self._stop_deadline: float | None = None
        self._stopped_ok: bool | None = None
        self._started_at = 0.0
        self._kicked = False  # the first record woke the sender

    # --- the trackers' side ---------------------------------------------------------------------------

    def add(self, producer: Producer, tail: Any) -> int:
        """A tracker that feeds this channel; returns its key in the stream."""
        with self._lock:
            self._keys += 1
            key = self._keys
            self._producers[key] = (weakref.ref(producer), tail, info_tuple(producer.info))
        self._ensure_thread()
        return key

    def put(self, key: int, record: bytes) -> None:
        """One finished request's record in its wire form (the hook's cost here: a length check and an
        append)."""
        queue = self._queue
        if len(queue) < self._max:
            queue.append((key, record))
        else:
            with self._lock:
                self._losses[QUEUE_FULL] += 1
        if not self._kicked:  # the first record: the export process starts now, not at the next tick
            self._kicked = True
            self._ensure_thread()
            self._wake()

    @property
    def losses(self) -> dict[str, int]:
        """Records lost on this side, by reason: ``queue_full``, ``export_process_exited``."""
        with self._lock:
            return dict(self._losses)

    def delivery(self) -> dict[str, Any]:
        """What the export processes delivered and lost, by signal: ``{"spans": (delivered, {reason: n},
        ended), "metric_points": (...)}``; ``requests``: (records done, losses on this side)."""
        with self._lock:
            out: dict[str, Any] = {}
            for signal in ("spans", "metric_points"):
                delivered, lost, ended = 0, {}, 0
                for part in (self._delivered_past.get(signal), self._delivery.get(signal)):
                    if part is None:
                        continue
                    delivered += part[0]
                    ended += part[2]
                    for reason, n in part[1].items():
                        lost[reason] = lost.get(reason, 0) + n
                out[signal] = (delivered, lost, ended)
            out["requests"] = (self._done, dict(self._losses))
            out["exporter_lines"] = self._delivered_past.get("exporter_lines", 0) + self._delivery.get(
                "exporter_lines", 0
            )
            return out

    def flush(self, timeout_s: float) -> bool:
        """Send everything queued, have the export process export it; True when that finished in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._thread is None:  # no tracker ever fed this channel
                return not self._queue
            self._flush_wanted += 1
            wanted = self._flush_wanted
        self._wake()
        with self._cond:
            while self._flushed < wanted:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._cond.wait(left)
            return self._flush_ok

    def shutdown(self, timeout_s: float) -> bool:
        """Send everything queued, stop the export process (it exports what it holds) within
        ``timeout_s`` seconds; past that it is killed. True when it stopped in time."""
        deadline = time.monotonic() + timeout_s
        thread = self._thread
        with self._cond:
            if thread is None:
                return not self._queue
            self._stop_deadline = deadline
        self._wake()
        thread.join(max(0.0, deadline - time.monotonic()) + _STOP_GRACE_S + 0.5)
        return bool(self._stopped_ok)

    # --- the sender thread ---------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop_deadline is not None:
                return
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            self._thread = threading.Thread(target=self._run, name="otel_llm-export-sender", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        try:
            next_pump = time.monotonic() + SEND_EVERY_S
            while True:
                # The export process's answers wake this thread only while one is awaited (a flush): the
                # acks it sends meanwhile are read at the next pump, so they cost the engine no wake-up.
                awaited = self._from_child >= 0 and self._flushed < self._flush_sent
                fds = [self._wake_r, self._from_child] if awaited else [self._wake_r]
                ready = _readable(fds, max(0.0, next_pump - time.monotonic()))
                if self._wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                stopping = self._stop_deadline is not None
                asked = stopping or self._flush_wanted > self._flush_sent
                due = time.monotonic() >= next_pump
                if not (due or asked or ready):
                    continue
                if self._from_child >= 0:
                    self._read_replies()
                self._check_child()
                if due or asked:
                    self._pump(everything=asked)
                    next_pump = time.monotonic() + SEND_EVERY_S
                if stopping:
                    self._stop()
                    return
                if self._flush_wanted > self._flush_sent and self._child is not None:
                    self._flush_sent = self._flush_wanted
                    self._send(encode("flush", self._flush_sent), 0)
        except Exception:  # never let the sender die silently: the records would pile up unseen
            _log.warning(
                "otel_llm: the export sender stopped; telemetry is no longer exported", exc_info=True
            )
        finally:
            with self._cond:
                for fd in (self._wake_r, self._wake_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self._wake_r = self._wake_w = -1
                self._thread = None
                self._cond.notify_all()

    def _pump(self, everything: bool) -> None:
        """Send what is queued (all of it when ``everything``), with the trackers' figures."""
        while True:
            if self._child is None and not self._start_child():
                return
            queue = self._queue
            n = min(len(queue), MAX_BATCH)
            batch = [queue.popleft() for _ in range(n)]
            producers, gone = self._live()
            with self._lock:
                losses = {"records": dict(self._losses), **self._engine_drops()}
            greeted = self._greeted
            # The tracker's description as it is now (its copy from binding time once it is gone).
            greet = [
                (k, info if p is None else info_tuple(p.info), _tail_tuple(t))
                for k, p, t, info in producers
                if k not in greeted
            ]
            figures = [(k, figures_tuple(p.figures(drain=True))) for k, p, _, _ in producers if p is not None]
            # The engine's own step spans (detail "steps"), taken here, off the engine's thread; all of
            # them at a flush.
            windows = [(k, w) for k, p, _, _ in producers if p is not None for w in _windows(p, everything)]
            records = batch  # (key, the record's wire bytes), made as each request finished
            body = (self._sent + 1, greet, records, figures, losses, gone, windows)
            if not self._send(encode("batch", body), n):
                return
            greeted.update(k for k, _, _ in greet)
            greeted.difference_update(gone)
            if not (everything and queue):
                return

    def _send(self, message: bytes, records: int) -> bool:
        """Write one message; on a dead export process count what it lost. ``records``: in this one."""
        try:
            write_frame(self._to_child, message)
        except OSError as exc:
            self._died(f"its pipe closed: {exc}", records)
            return False
        self._sent += records
        return True

    def _start_child(self) -> bool:
        """Start the export process when there is something to send (or a flush asks for what the
        trackers report) and no back-off holds it."""
        if self._restart_at > time.monotonic():
            return False
        flushing = self._flush_wanted > self._flush_sent or self._stop_deadline is not None
        if not self._queue and not flushing and not self._active():
            return False
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "otel_llm.export.process", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                env=self._environ,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            self._died(f"it could not be started: {exc}", 0)
            return False
        os.close(to_child_r)
        os.close(from_child_w)
        flags = fcntl.fcntl(from_child_r, fcntl.F_GETFL)
        fcntl.fcntl(from_child_r, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._child, self._to_child, self._from_child = child, to_child_w, from_child_r
        self._reader = FrameReader(from_child_r)
        self._greeted = set()
        self._done = self._sent  # every earlier record was done or counted lost
        self._started_at = time.monotonic()
        settings = {**self._settings, "parent_pid": os.getpid()}
        return self._send(encode("start", settings), 0)

    def _live(self) -> tuple[list[tuple[int, Any, Any, Any]], list[int]]:
        """(key, tracker or None, tail settings, TrackerInfo's wire form) of the trackers this batch
        concerns, and the keys of those gone since the previous one (their emitters in the export process
        are let go once their last records are in)."""
        with self._lock:
            entries = list(self._producers.items())
            out, gone = [], []
            for key, (ref, tail, info) in entries:
                producer = ref()
                if producer is None:
                    gone.append(key)
                    del self._producers[key]
                out.append((key, producer, tail, info))
        return out, gone

    def _active(self) -> bool:
        """Whether a tracker has something to report before any record: requests in flight, per-step
        samples, or anything the engine reported of itself."""
        with self._lock:
            producers = [ref() for ref, _, _ in self._producers.values()]
        return any(_reports(p.figures()) for p in producers if p is not None)

    def _read_replies(self, draining: bool = False) -> None:
        """Take the export process's answers that wait in its pipe; ``draining``: all of them, from one
        that has died (its last acks count before the loss is)."""
        reader = self._reader
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
                self._note_done(body[0], body[1])
            elif kind == "flushed":
                flush_id, ok, done, delivery = body
                self._note_done(done, delivery)
                with self._cond:
                    self._flushed, self._flush_ok = max(self._flushed, flush_id), bool(ok)
                    self._cond.notify_all()
            elif kind == "stopped":
                ok, done, delivery = body
                self._note_done(done, delivery)
                self._stopped_ok = bool(ok)
        if not alive and not draining and self._child is not None and self._stopped_ok is None:
            self._died("its pipe closed", 0)

    def _note_done(self, done: int, delivery: dict[str, Any]) -> None:
        with self._lock:
            self._done = max(self._done, done)
            self._delivery = delivery

    def _check_child(self) -> None:
        child = self._child
        if child is not None and child.poll() is not None:
            self._read_replies()  # what it said before it went
            if self._child is not None:
                self._died(_exit_words(child.returncode), 0)
        if self._child is not None and time.monotonic() - self._started_at > 60:
            self._backoff = RESTART_FIRST_S  # it has lived a while: the next restart is quick again

    def _died(self, why: str, unsent: int) -> None:
        """The export process is gone: what it had not finished (and ``unsent`` records of a message it
        did not take) is counted as lost; it is started again after the back-off."""
        if self._reader is not None:  # its last acks may still wait in the pipe: they count first
            with contextlib.suppress(OSError, ValueError):
                self._read_replies(draining=True)
        child, self._child = self._child, None
        if child is not None:  # how it ended says more than the broken pipe that showed it
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(0.2)
            if child.returncode is not None:
                why = _exit_words(child.returncode)
        with self._lock:
            lost = self._sent - self._done + unsent
            self._losses[PROCESS_EXITED] += lost
            self._done = self._sent
            for signal, part in self._delivery.items():
                if signal == "exporter_lines":
                    self._delivered_past[signal] = self._delivered_past.get(signal, 0) + part
                    continue
                past = self._delivered_past.get(signal, (0, {}, 0))
                lost_by = dict(past[1])
                for reason, n in part[1].items():
                    lost_by[reason] = lost_by.get(reason, 0) + n
                self._delivered_past[signal] = (past[0] + part[0], lost_by, past[2] + part[2])
            self._delivery = {}
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_child = self._from_child = -1
        self._reader = None
        if child is not None and child.poll() is None:
            with contextlib.suppress(OSError):
                child.kill()
        self._restart_at = time.monotonic() + self._backoff
        if not self._warned:
            self._warned = True
            _log.warning(
                "otel_llm: the export process stopped (%s); %d finished requests' telemetry in flight was "
                "lost (counted in otel_llm.export.records.dropped); starting it again in %.1f s",
                why,
                lost,
                self._backoff,
            )
        self._backoff = min(self._backoff * 2, RESTART_MAX_S)
        with self._cond:
            self._cond.notify_all()

    def _stop(self) -> None:
        """Tell the export process to stop within the deadline and wait for its answer until the grace
        after it; past that it is killed, and the requests it had not finished count as unsent."""
        deadline = self._stop_deadline or time.monotonic()
        child = self._child
        if child is None:
            with self._lock:
                self._losses[UNSENT_AT_SHUTDOWN] += len(self._queue)
            self._stopped_ok = not self._queue
            self._queue.clear()
            return
        # The export process's own shutdown takes its budget and up to a second's grace to stop its
        # exporters: it gets less than what is left here, so its answer still comes in time.
        left = max(0.0, deadline - time.monotonic())
        self._send(encode("stop", max(left - 1.0, left / 2)), 0)
        until = deadline + _STOP_GRACE_S
        while self._stopped_ok is None and self._child is not None:
            left = until - time.monotonic()
            if left <= 0:
                break
            if _readable([self._from_child], min(left, 0.1)):
                self._read_replies()
            elif child.poll() is not None:
                self._read_replies()
                break
        in_time = self._stopped_ok is not None and time.monotonic() <= deadline
        if self._stopped_ok is None:
            child.kill()
        child.wait()
        self._stopped_ok = bool(self._stopped_ok) and in_time
        with self._lock:
            self._losses[UNSENT_AT_SHUTDOWN] += self._sent - self._done + len(self._queue)
            self._done = self._sent
            self._queue.clear()
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._child = None
        self._to_child = self._from_child = -1

    def _after_fork(self) -> None:
        """In a forked child: none of the parent's pipes, thread or queued records are this process's."""
        for fd in (self._to_child, self._from_child, self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue = deque()
        self._losses = {QUEUE_FULL: 0, PROCESS_EXITED: 0, UNSENT_AT_SHUTDOWN: 0}
        self._reset()


def _windows(producer: Any, final: bool) -> list[Any]:
    """``producer.step_windows(final)``, or none after one warning: a failure there must not stop the
    sender, which carries every record."""
    try:
        return producer.step_windows(final)
    except Exception:
        warn_once(
            "channel-step-windows", "otel_llm: the engine's step spans could not be taken", exc_info=True
        )
        return []


def _readable(fds: list[int], timeout_s: float) -> list[int]:
    """Those of ``fds`` (-1: none) that can be read now or within ``timeout_s`` seconds (poll: no limit
    on how high a descriptor may be, unlike select)."""
    poller = select.poll()
    for fd in fds:
        if fd >= 0:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    # Whole milliseconds, rounded up: a timeout of 0.4 ms must wait, not return at once and spin.
    return [fd for fd, _ in poller.poll(max(0, math.ceil(timeout_s * 1000)))]


def _reports(f: Any) -> bool:
    """Whether a tracker's figures hold anything a metric would show."""
    return bool(
        sum(f.states)
        or f.anomalies
        or f.abandoned
        or f.itl
        or f.step_tokens
        or f.prompt_tokens
        or f.kv_cache_usage is not None
        or f.running is not None
        or f.waiting is not None
        or any(v is not None for v in f.counters.values())
    )


def _tail_tuple(tail: Any) -> Any:
    return None if tail is None else (tail.ratio, tail.ttft_s, tail.e2e_s)


def _exit_words(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        return f"killed by signal {-code}"
    return f"it exited with status {code}"


_LIVE: weakref.WeakSet[ExportChannel] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for channel in list(_LIVE):
        channel._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- which trackers use which channel -------------------------------------------------------------------

_registry_lock = threading.Lock()
_registered: list[tuple[Any, Any, ExportChannel]] = []  # (tracer provider, meter provider, channel)
_default: ExportChannel | None = None


def register(tracer_provider: Any, meter_provider: Any, channel: ExportChannel) -> None:
    """``configure()`` in export mode ``process``: trackers on these providers feed ``channel``."""
    with _registry_lock:
        _registered.append((tracer_provider, meter_provider, channel))


def unregister(channel: ExportChannel) -> None:
    with _registry_lock:
        _registered[:] = [entry for entry in _registered if entry[2] is not channel]


def feed_for(tracer_provider: Any, meter_provider: Any, tail: Any) -> Feed | None:
    """The feed for a new tracker on these providers (None: the global ones), or None when its records
    stay in this process (see the module docstring)."""
    from opentelemetry import metrics, trace

    tp = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    mp = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _registry_lock:
        for tracer_p, meter_p, channel in _registered:
            if tracer_p is tp and meter_p is mp:
                return Feed(channel, tail)
    if tracer_provider is None and meter_provider is None and export_mode() == MODE_PROCESS:
        channel = _default_channel(tp, mp)
        if channel is not None:
            return Feed(channel, tail)
    return None


def _default_channel(tracer_provider: Any, meter_provider: Any) -> ExportChannel | None:
    """A channel configured from the ``OTEL_*`` variables alone, for trackers on global providers that
    ``configure()`` did not make (``opentelemetry-instrument``); shut down when the process exits."""
    global _default
    if type(tracer_provider).__name__.startswith("Proxy") or type(meter_provider).__name__.startswith(
        "_Proxy"
    ):
        return None  # no real provider set yet: its exporters are not known
    with _registry_lock:
        if _default is None:
            _default = ExportChannel({"service_name": None}, os.environ, queue_size())
            atexit.register(_default.shutdown, 5.0)
        return _default
