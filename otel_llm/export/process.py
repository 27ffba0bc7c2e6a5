"""The export process: records in from an engine's process, spans and metric values out over OTLP.

Started by ``otel_llm.export.channel`` as ``python -m otel_llm.export.process READ_FD WRITE_FD`` (a new
interpreter, never a fork of the engine), one per engine process. It builds its pipeline with
``otel_llm.configure(export_mode="in_process")`` from the settings the engine's ``configure()`` was given
and the environment the engine had then, and runs the emit side (``otel_llm.emit.pipeline.Emitter``, one
per tracker of the engine) on what arrives: the same code that runs in the engine's process in the other
mode, so the spans and metric points are the same.

Messages (``otel_llm.record.wire``; each framed by ``otel_llm.export.frames``):

- ``start`` {settings}: first, once: ``service_name``, ``output_dir``, ``resource_attributes``,
  ``shutdown_timeout_s``, ``parent_pid``;
- ``batch`` (first_seq, trackers, records, figures, losses, gone, windows): ``trackers`` new to this
  process as (key, TrackerInfo fields, tail-sampling settings or None); ``records`` as (key, a
  record's bytes), numbered from ``first_seq`` on; ``figures`` as (key, Figures fields), the per-step
  samples in them fed to that tracker's recorders; ``losses``: the engine's own count of records lost,
  by reason, and its own pipeline's losses by signal; ``gone``: the keys of trackers the engine no
  longer has; ``windows`` as (key, ``otel_llm.record.StepWindow``), the engine's own step spans at
  detail ``steps``;
- ``flush`` id: export everything, answer ``flushed`` (id, in time, done, delivery);
- ``stop`` timeout: shut the pipeline down within it, answer ``stopped`` (in time, done, delivery), exit.

It answers ``ack`` (done, delivery) as records are done: ``done`` is the number of the last record all of
whose spans have left the span pipeline (exported, or lost and counted), so the engine counts exactly the
records in flight as lost if this process dies. ``delivery`` is the pipeline's counts
(``otel_llm.export.counting.DropCounter``): delivered and lost spans and metric points.

When the engine's process goes away (its end of the pipe closes, or this process is re-parented), it
exports what it holds within the shutdown timeout and exits.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from typing import Any

from otel_llm.emit.pipeline import Emitter
from otel_llm.emit.sampling import TailSampling
from otel_llm.export.frames import FrameReader, FrameWriter
from otel_llm.record import Figures, StepRecorder, StepWindow, TrackerInfo
from otel_llm.record.wire import decode, encode, figures_from, info_from, record_from

_log = logging.getLogger("otel_llm")

UNSENT_AT_SHUTDOWN = "unsent_at_shutdown"  # as otel_llm.export.telemetry names it
ACK_EVERY_S = 0.1  # how often changed counts are told, besides after every batch and as spans leave
STOPPED_REPLY_S = 2.0  # how long the last answer may wait for the engine to read it
PARENT_CHECK_S = 0.5


class RemoteProducer:
    """A tracker of the engine's process as its emitter here sees it (``otel_llm.record.Producer``):
    its description, its latest figures, and the per-step samples replayed into the recorders."""

    def __init__(self, info: TrackerInfo) -> None:
        self.info = info
        self._lock = threading.Lock()
        self._figures = Figures((0, 0, 0), {}, 0, None, None, None, {}, None, [], [])
        self._itl: StepRecorder | None = None
        self._step_tokens: StepRecorder | None = None
        self._noted: dict[str, int] = {}  # anomalies this process met, beside the engine's

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def figures(self, drain: bool = False) -> Figures:
        latest = self._figures
        if not self._noted:
            return latest
        anomalies = dict(latest.anomalies)
        for kind, n in self._noted.items():
            anomalies[kind] = anomalies.get(kind, 0) + n
        return Figures(
            latest.states,
            anomalies,
            latest.abandoned,
            latest.kv_cache_usage,
            latest.running,
            latest.waiting,
            latest.counters,
            latest.prompt_tokens,
            [],
            [],
        )

    def use_recorders(self, itl: StepRecorder | None, step_tokens: StepRecorder | None) -> None:
        self._itl, self._step_tokens = itl, step_tokens

    def step_windows(self, final: bool = False) -> list[StepWindow]:
        """None here: the engine's windows arrive in its batches (``ExportProcess.batch``)."""
        return []

    def note(self, kind: str, request_id: Any) -> None:
        with self._lock:
            self._noted[kind] = self._noted.get(kind, 0) + 1
        _log.debug("otel_llm export process: %s (request %r)", kind, request_id)

    def update(self, figures: Figures) -> None:
        """Figures from the engine: the latest values kept, the samples since the previous ones added."""
        with self._lock:
            itl, step = self._itl, self._step_tokens
            if itl is not None:
                for gap, n in figures.itl:
                    itl.add(gap, n)
            if step is not None:
                for tokens in figures.step_tokens:
                    step.add(tokens, 1)
            self._figures = figures


class ExportProcess:
    """This process's pipeline and the emitters of the engine's trackers."""

    def __init__(self, settings: dict[str, Any]) -> None:

        self.settings = settings
        from otel_llm.setup import build_export_pipeline

        # The engine's own pipeline's losses join this one's in otel_llm.export.*.dropped.
        self.telemetry = build_export_pipeline(settings, lambda: self.engine_drops)
        self.drops = self.telemetry.drops
        self.producers: dict[int, RemoteProducer] = {}
        self.emitters: dict[int, Emitter] = {}
        self.losses: dict[str, int] = {}  # records the engine's process lost, by reason
        self.engine_drops: dict[str, dict[str, int]] = {}  # its own pipeline's losses, by signal
        # (record number, spans ended once it was emitted), oldest first, for the records not yet done.
        self._pending: deque[tuple[int, int]] = deque()
        self.done = 0  # the number of the last record done (records are numbered from 1)
        self.received = 0  # the number of the last record received
        self._told: tuple[int, str] = (-1, "")  # the last (done, counts) told to the engine
        self._ack_lock = threading.Lock()  # acks come from this loop and from the exporter's thread
        self.replies: FrameWriter | None = None

    def batch(self, body: Any) -> None:
        first_seq, trackers, records, figures, losses, gone, windows = body
        for key, info_fields, tail in trackers:
            self._tracker(key, info_from(info_fields), tail)
        for key, fields in figures:
            producer = self.producers.get(key)
            if producer is not None:
                producer.update(figures_from(fields))
        drops, pending = self.drops, self._pending
        seq = first_seq
        self.received = first_seq + len(records) - 1
        for key, data in records:
            emitter = self.emitters.get(key)
            if emitter is not None:
                emitter.request(record_from(data))
            pending.append((seq, drops.spans_ended))
            seq += 1
        for key, window in windows:  # the engine's own step spans (detail "steps")
            emitter = self.emitters.get(key)
            if emitter is not None:
                emitter.steps(window)
        for key in gone:  # trackers the engine let go: their emitters stop reporting, as in process
            self.emitters.pop(key, None)
            self.producers.pop(key, None)
        self.losses = dict(losses.get("records", {}))
        self.engine_drops = {
            signal: losses[signal] for signal in ("spans", "metric_points") if signal in losses
        }

    def _tracker(self, key: int, info: TrackerInfo, tail: Any) -> None:
        if key in self.emitters:
            return
        settings = None if tail is None else TailSampling(*tail)
        telemetry = self.telemetry
        emitter = Emitter(telemetry.tracer_provider, telemetry.meter_provider, settings)
        producer = self.producers[key] = RemoteProducer(info)
        emitter.bind(producer)
        self.emitters[key] = emitter
        if len(self.emitters) == 1:
            _register_losses(telemetry.meter_provider, self)

    def settle(self) -> int:
        """Records done so far: every span of theirs has left the span pipeline."""
        drops, pending = self.drops, self._pending
        left = drops.delivered("spans") + drops.total("spans")
        while pending and pending[0][1] <= left:
            self.done = pending.popleft()[0]
        return self.done

    def delivery(self, stopped: bool = False) -> dict[str, Any]:
        """What the pipeline delivered and lost, by signal; once ``stopped``, the spans neither exported
        nor counted lost (still queued when the shutdown's time ran out) count as ``unsent_at_shutdown``:
        this process ends, and nothing will count them later."""
        drops = self.drops
        spans = drops.by_reason("spans")
        delivered, ended = drops.delivered("spans"), drops.spans_ended
        if stopped:
            unsent = ended - delivered - sum(spans.values())
            if unsent > 0:
                spans[UNSENT_AT_SHUTDOWN] = unsent
        points = drops.by_reason("metric_points")
        if stopped and drops.exporting("metric_points"):  # an export the shutdown cut off
            points[UNSENT_AT_SHUTDOWN] = drops.exporting("metric_points")
        return {
            "spans": (delivered, spans, ended),
            "metric_points": (drops.delivered("metric_points"), points, 0),
            "exporter_lines": self.telemetry.exporter_lines(),
        }

    def ack_if_changed(self, counts: bool = False) -> None:
        """Tell the engine how far this process got, when that changed (with ``counts``: also when only
        the pipeline's counts did). Called by the span pipeline as soon as spans left it, so that the
        engine's count of what a killed export process lost is what it had not finished; after each
        batch and on a timer with the counts. Never waits on the engine: an ack the pipe cannot take
        now is superseded by a later one."""
        replies = self.replies
        if replies is None:
            return
        with self._ack_lock:
            done = self.settle()
            delivery = self.delivery()
            told = (done, repr(delivery)) if counts else (done, self._told[1])
            if told != self._told:
                self._told = (done, repr(delivery))
                replies.send(encode("ack", (done, delivery)), droppable=True)

    def reply(self, kind: str, body: Any) -> None:
        """An answer the engine waits for (never dropped)."""
        if self.replies is not None:
            self.replies.send(encode(kind, body))

    def flush(self, timeout_s: float) -> bool:
        for emitter in self.emitters.values():
            emitter.resolve()
        return self.telemetry.force_flush(timeout_s)

    def stop(self, timeout_s: float, quiet: bool = True) -> bool:
        """Shut the pipeline down within ``timeout_s``; ``quiet``: the engine's process, which set the
        budget, says whether this was late (``Telemetry.shutdown_quietly``)."""
        if quiet:
            return self.telemetry.shutdown_quietly(timeout_s)
        return self.telemetry.shutdown(timeout_s)


def _register_losses(meter_provider: Any, process: ExportProcess) -> None:
    """``otel_llm.export.records.dropped``: records the engine's process lost before they got here."""
    from opentelemetry.metrics import CallbackOptions, Observation

    from otel_llm import semconv as sc
    from otel_llm._version import __version__

    def observe(options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {sc.EXPORT_DROP_REASON: reason}) for reason, n in process.losses.items()]

    meter_provider.get_meter("otel_llm", __version__).create_observable_counter(
        sc.METRIC_DROPPED_RECORDS,
        callbacks=[observe],
        unit="{request}",
        description="Finished requests whose telemetry the engine's process lost before export, by reason",
    )


def serve(read_fd: int, write_fd: int) -> int:
    """Run until the engine stops this process or goes away; the exit status."""
    reader = FrameReader(read_fd)
    replies = FrameWriter(write_fd)
    poller = select.poll()
    poller.register(read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    process: ExportProcess | None = None
    parent = os.getppid()
    last_ack = last_parent_check = time.monotonic()
    while True:
        ended = False
        if poller.poll(int(ACK_EVERY_S * 1000)):
            ended = not reader.fill()
        for frame in reader.frames():
            kind, body = decode(frame)
            if kind == "start":
                process = ExportProcess(body)
                process.replies = replies
                process.drops.on_spans_left = process.ack_if_changed
                parent = body.get("parent_pid", parent)
            elif process is None:
                continue
            elif kind == "batch":
                process.batch(body)
                process.ack_if_changed(counts=True)
            elif kind == "flush":
                ok = process.flush(process.telemetry.shutdown_timeout_s)
                process.reply("flushed", (body, ok, process.settle(), process.delivery()))
            elif kind == "stop":
                ok = process.stop(float(body))
                # Stopped: every record's spans are delivered, lost, or counted as unsent now.
                process.reply("stopped", (ok, process.received, process.delivery(stopped=True)))
                _drain(replies, STOPPED_REPLY_S)
                return 0
        replies.flush()
        now = time.monotonic()
        if process is not None and now - last_ack >= ACK_EVERY_S:
            last_ack = now
            process.ack_if_changed(counts=True)
        if not ended and now - last_parent_check >= PARENT_CHECK_S:
            last_parent_check = now
            ended = os.getppid() != parent
        if ended:  # the engine's process is gone: export what this process holds, then go
            if process is not None:  # nobody else will say it was late: this process does
                process.stop(process.telemetry.shutdown_timeout_s, quiet=False)
            return 0


def _drain(replies: FrameWriter, timeout_s: float) -> None:
    """Wait (at most ``timeout_s`` seconds) until the engine has taken every answer still waiting."""
    deadline = time.monotonic() + timeout_s
    while not replies.flush() and not replies.closed and time.monotonic() < deadline:
        poller = select.poll()
        poller.register(replies.fd, select.POLLOUT | select.POLLERR)
        poller.poll(50)


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C in a terminal, or a service manager stopping the engine's whole process group (systemd's
    # default, a container's stop), reaches this process too: the engine's process stops it in its own
    # shutdown (or, gone, closes its pipe), so that what it holds is exported first.
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(
            "usage: python -m otel_llm.export.process READ_FD WRITE_FD (started by otel_llm)", file=sys.stderr
        )
        return 2
    read_fd, write_fd = int(args[0]), int(args[1])
    try:
        return serve(read_fd, write_fd)
    except BrokenPipeError:  # the engine closed its end while this process answered
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
