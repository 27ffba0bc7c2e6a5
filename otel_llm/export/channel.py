"""The engine side of the export process: finished requests' records, batched and sent to a child process
that builds and exports their spans and metric values (``otel_llm.export.process``).

What a hook pays per finished request is building its record and one ``deque.append`` (``Feed.request``);
a sender thread wakes every 0.2 s (``sending.SEND_EVERY_S``), takes what is queued and the trackers' figures
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

The parts, each its own module: ``trackers`` (the trackers feeding a channel and what each adds to a
batch), ``sending`` (the sender thread, its self-pipe and the messages both ways), ``lifecycle`` (the
export process started, restarted after a back-off, stopped by a deadline) and ``ledger`` (records sent,
done, delivered and lost; the flushes asked for and answered).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

from otel_llm.export.ledger import QUEUE_FULL, DeliveryLedger, FlushRequests
from otel_llm.export.lifecycle import STOP_GRACE_S, ExportProcess
from otel_llm.export.sending import Sender
from otel_llm.export.trackers import FeedingTrackers
from otel_llm.record import Producer, RequestRecord
from otel_llm.record.wire import record_bytes

__all__ = [
    "DEFAULT_QUEUE_SIZE",
    "ENV_EXPORT_MODE",
    "ENV_QUEUE_SIZE",
    "MODES",
    "MODE_IN_PROCESS",
    "MODE_PROCESS",
    "ExportChannel",
    "Feed",
    "export_mode",
    "feed_for",
    "queue_size",
    "register",
    "unregister",
]

ENV_EXPORT_MODE = "OTEL_LLM_EXPORT_MODE"
MODE_PROCESS = "process"
MODE_IN_PROCESS = "in_process"
MODES = (MODE_PROCESS, MODE_IN_PROCESS)
ENV_QUEUE_SIZE = "OTEL_LLM_EXPORT_QUEUE_SIZE"
DEFAULT_QUEUE_SIZE = 16_384


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
    """The queue of one engine process's finished records and everything that carries them to its export
    process: the trackers feeding it (``otel_llm.export.trackers``), the sender thread
    (``otel_llm.export.sending``), the export process's life (``otel_llm.export.lifecycle``) and the
    ledger of what was delivered and lost (``otel_llm.export.ledger``).

    ``settings``: what the export process's ``configure()`` is given (``otel_llm.export.process``);
    ``environ``: the environment it starts with (the engine's, as it was when ``configure()`` ran);
    ``max_queue``: records that may wait, past which a new one is dropped (``queue_full``)."""

    def __init__(
        self, settings: Mapping[str, Any], environ: Mapping[str, str], max_queue: int = DEFAULT_QUEUE_SIZE
    ) -> None:
        self._settings = dict(settings)
        self._environ = dict(environ)
        self._max = max_queue
        self._trackers = FeedingTrackers()
        self._drops: Any = None
        self._fresh()
        _LIVE.add(self)

    def _fresh(self) -> None:
        """The parts of a channel that has not started (and of one in a forked child): an empty queue, an
        empty ledger, no sender thread and no export process."""
        self._queue: deque[tuple[int, bytes]] = deque()  # (tracker key, a record's wire form)
        self._ledger = DeliveryLedger()
        self._flushes = FlushRequests()
        process = ExportProcess(self._environ)
        self._sender = Sender(
            self._queue,
            self._trackers,
            self._ledger,
            self._flushes,
            process,
            self._settings,
            self._engine_drops,
        )
        self._kicked = False  # the first record woke the sender

    def count_engine_drops(self, drops: Any) -> None:
        """``drops``: this process's own pipeline's ``DropCounter`` (what the application exports here),
        whose counts the export process adds to ``otel_llm.export.*.dropped``: one series for both."""
        self._drops = drops

    def _engine_drops(self) -> dict[str, dict[str, int]]:
        drops = self._drops
        if drops is None:
            return {}
        return {signal: drops.by_reason(signal) for signal in ("spans", "metric_points")}

    @property
    def _sent(self) -> int:
        """Records written whole to export processes so far (a diagnostic the fault tests read)."""
        return self._ledger.sent

    # --- the trackers' side ---------------------------------------------------------------------------

    def add(self, producer: Producer, tail: Any) -> int:
        """A tracker that feeds this channel; returns its key in the stream."""
        key = self._trackers.add(producer, tail)
        self._sender.start()
        return key

    def put(self, key: int, record: bytes) -> None:
        """One finished request's record in its wire form (the hook's cost here: a length check and an
        append)."""
        queue = self._queue
        if len(queue) < self._max:
            queue.append((key, record))
        else:
            self._ledger.lose(QUEUE_FULL)
        if not self._kicked:  # the first record: the export process starts now, not at the next tick
            self._kicked = True
            self._sender.start()
            self._sender.wake()

    @property
    def losses(self) -> dict[str, int]:
        """Records lost on this side, by reason: ``queue_full``, ``export_process_exited``,
        ``unsent_at_shutdown``."""
        return self._ledger.losses()

    def delivery(self) -> dict[str, Any]:
        """What the export processes delivered and lost, by signal: ``{"spans": (delivered, {reason: n},
        ended), "metric_points": (...)}``; ``requests``: (records done, losses on this side)."""
        return self._ledger.delivery()

    def flush(self, timeout_s: float) -> bool:
        """Send everything queued, have the export process export it; True when that finished within
        ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        sender = self._sender
        if not sender.running:  # no tracker ever fed this channel
            return not self._queue
        flush = self._flushes.ask()
        sender.wake()
        return self._flushes.wait(flush, deadline, lambda: sender.running)

    def shutdown(self, timeout_s: float) -> bool:
        """Send everything queued, stop the export process (it exports what it holds) within
        ``timeout_s`` seconds; past that it is killed. True when it stopped in time."""
        deadline = time.monotonic() + timeout_s
        thread = self._sender.stop(deadline)
        if thread is None:
            return not self._queue
        thread.join(max(0.0, deadline - time.monotonic()) + STOP_GRACE_S + 0.5)
        return bool(self._sender.stopped_ok)

    def _after_fork(self) -> None:
        """In a forked child: none of the parent's pipes, thread or queued records are this process's."""
        self._sender.close_after_fork()
        self._trackers.after_fork()
        self._fresh()


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
        default = _default_channel(tp, mp)
        if default is not None:
            return Feed(default, tail)
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
