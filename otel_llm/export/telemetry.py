"""The handle ``configure()`` returns: the providers, plus flush and shutdown that always come back.

The SDK's own flush and shutdown can wait for a long time when the collector is unreachable: a batch span
processor's flush ignores its timeout, and the OTLP exporters retry with backoff for up to their export
timeout. An engine that is stopping must not hang on telemetry, so this handle runs the SDK calls on
daemon worker threads and waits for them only until a deadline. Past the deadline it tells the exporters
to stop (which ends their retries and closes their connections) and returns; whatever had not been
exported by then is lost, and a warning says so.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from otel_llm.export.counting import DropCounter

_logger = logging.getLogger(__name__)

# How long the exporters get, after the deadline, to notice they were told to stop.
_ABORT_GRACE_S = 1.0
# Where the SDK's OTLP exporters log, and what they say about being stopped. Once a handle gave up on its
# exporters and stopped them, these lines (a retry aborted, a call or batch refused after shutdown, a
# last batch given up) repeat the loss the handle already reported; other records pass.
_EXPORTER_LOGGERS = "opentelemetry.exporter.otlp"
_AFTER_STOP = (
    "Shutdown in progress",
    "Exporter already shutdown",
    "Failed to export %s batch due to timeout, max retries or shutdown",
)
__all__ = ["DeliveryReport", "Telemetry"]

REASON_UNSENT = "unsent_at_shutdown"  # spans still queued when the pipeline stopped
_GIVE_UP_S = 0.2  # the shutdown's budget when no collector listened at the start and none listens now


def _seconds(value: float) -> str:
    """``5 s``, ``0.5 s``, ``2.25 s``: a budget as the user wrote it, not rounded to a tenth."""
    return f"{value:g} s"


def _still_refused() -> bool:
    """Whether every OTLP endpoint of this environment refuses a connection now (0.2 s at most each)."""
    from otel_llm.export import otlp

    urls = otlp.endpoint_urls()
    return bool(urls) and all(otlp.unreachable(url, 0.2) is not None for url in urls)


class _AfterAbort(logging.Filter):
    """Drops the OTLP exporters' records about being stopped, from the threads of stopped pipelines.

    Those are the threads alive when a handle gave up on its exporters (the SDK's export workers, our
    shutdown threads) and our own threads that stop exporters. A pipeline made later has threads of its
    own, so its failures are still logged.
    """

    def __init__(self) -> None:
        super().__init__()
        self.threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(_AFTER_STOP)):
            return True
        if (record.threadName or "").startswith("otel_llm-abort"):
            return False
        # By thread object, not id: a thread started later may be given the id of one that has ended.
        return not any(t.ident == record.thread and t.is_alive() for t in list(self.threads))


_after_abort = _AfterAbort()


def _silence_exporters() -> None:
    main, current = threading.main_thread(), threading.current_thread()
    for thread in threading.enumerate():
        if thread is not main and thread is not current:
            _after_abort.threads.add(thread)
    for name in list(logging.root.manager.loggerDict):
        if name == _EXPORTER_LOGGERS or name.startswith(_EXPORTER_LOGGERS + "."):
            logger = logging.getLogger(name)
            if _after_abort not in logger.filters:
                logger.addFilter(_after_abort)


def _run_until(
    tasks: Sequence[tuple[str, Callable[[], Any]]], deadline: float
) -> list[tuple[str, threading.Thread]]:
    """Run each task on its own daemon thread; return ``(name, thread)`` of those still running at
    ``deadline``.

    ``deadline`` is a ``time.monotonic()`` value in seconds.
    """
    threads = []
    for name, task in tasks:
        thread = threading.Thread(target=_guarded, args=(name, task), name=f"otel_llm-{name}", daemon=True)
        thread.start()
        threads.append((name, thread))
    _join(threads, deadline)
    return [(name, thread) for name, thread in threads if thread.is_alive()]


def _join(threads: Sequence[tuple[str, threading.Thread]], deadline: float) -> None:
    for _, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _guarded(name: str, task: Callable[[], Any]) -> None:
    try:
        task()
    except Exception:  # a telemetry failure at flush or shutdown must not surface in the engine
        _logger.exception("otel_llm: %s failed", name)


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """``Telemetry.delivery()`` of both signals and whether ``shutdown()`` finished in time, taken after
    the shutdown. Plain data: a worker process that exports on its own sends it to the process that
    tells the user (``otel-llm serve --disaggregated``, ``otel-llm demo --disaggregated``)."""

    # by "spans", "metric_points" and "requests"
    counts: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)
    in_time: bool = True  # shutdown() finished within its timeout
    exporter_lines: int = 0  # the exporters' warnings and errors counted, not written

    def delivery(self, signal: str) -> tuple[int, dict[str, int]]:
        """As ``Telemetry.delivery()``: ``(delivered, {reason: lost})``."""
        return self.counts.get(signal, (0, {}))


class CombinedDrops:
    """What this process's pipeline and the export process's lost, read as one ``DropCounter``: the export
    process's part as it last reported it (``otel_llm.export.channel.ExportChannel.delivery``)."""

    def __init__(self, local: DropCounter, channel: Any) -> None:
        self._local = local
        self._remote = channel.delivery()

    def delivered(self, signal: str) -> int:
        there = self._remote.get(signal)
        return self._local.delivered(signal) + (there[0] if there else 0)

    def by_reason(self, signal: str) -> dict[str, int]:
        counts = self._local.by_reason(signal)
        there = self._remote.get(signal)
        for reason, n in (there[1] if there else {}).items():
            counts[reason] = counts.get(reason, 0) + n
        return counts

    def total(self, signal: str) -> int:
        return sum(self.by_reason(signal).values())

    @property
    def spans_ended(self) -> int:
        there = self._remote.get("spans")
        return self._local.spans_ended + (there[2] if there else 0)


class Telemetry:
    """Tracer and meter providers built by ``otel_llm.configure()``, with bounded flush and shutdown.

    Attributes:
        tracer_provider: pass it to ``RequestTracker(tracer_provider=...)`` (or rely on the global one).
        meter_provider: pass it to ``RequestTracker(meter_provider=...)``.
        output_dir: the directory of the OTLP-JSON files, or None when no signal goes to files.
        shutdown_timeout_s: the default bound, in seconds, of ``force_flush`` and ``shutdown``.
        drops: what the export pipeline lost so far, by signal and reason (also exported as the
            ``otel_llm.export.*.dropped`` self-metrics), e.g. ``drops.by_reason("spans")``; in export mode
            ``process``, this process's pipeline and the export process's together (the latter as it
            last reported, about every 0.1 s).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
        *,
        exporters: Sequence[Any] = (),
        output_dir: Any = None,
        shutdown_timeout_s: float = 5.0,
        drops: DropCounter | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.output_dir = output_dir
        self.shutdown_timeout_s = shutdown_timeout_s
        self._drops = drops if drops is not None else DropCounter()
        self._exporters = list(exporters)
        self._lock = threading.Lock()
        self._shutdown_result: bool | None = None
        self.channel: Any = None  # otel_llm.export.channel.ExportChannel, in export mode "process"
        self._lines: Any = None  # otel_llm.export.quiet.ExporterLines, with exporter_logs="count"
        self._unreachable_at_start = False
        atexit.register(self._shutdown_at_exit)

    def count_exporter_lines(self) -> None:
        """From now on the exporters' warnings and errors are counted, not written
        (``configure(exporter_logs="count")``)."""
        from otel_llm.export import quiet

        if self._lines is None:
            self._lines = quiet.ExporterLines()
        quiet.install(self._lines)

    def exporter_lines(self) -> int:
        """How many warnings and errors the OTLP exporters logged that were counted, not written (here and
        in the export process, as it last reported); 0 unless ``exporter_logs="count"``."""
        here = self._lines.count if self._lines is not None else 0
        there = self.channel.delivery().get("exporter_lines", 0) if self.channel is not None else 0
        return here + there

    def endpoint_unreachable(self) -> None:
        """Nothing accepted a connection at the OTLP endpoints when the run started (a command's check):
        if nothing does at shutdown either, the last export is not waited for (nothing could take it)."""
        self._unreachable_at_start = True

    def attach_channel(self, channel: Any) -> None:
        """Export mode ``process``: otel_llm's telemetry goes through ``channel``'s export process, which
        ``force_flush`` and ``shutdown`` flush and stop within the same bound, and ``delivery`` counts."""
        self.channel = channel

    @property
    def local_drops(self) -> DropCounter:
        """What this process's own pipeline lost (without the export process's)."""
        return self._drops

    @property
    def drops(self) -> Any:
        """See the class docstring: a ``DropCounter``, or a view adding the export process's counts."""
        return self._drops if self.channel is None else CombinedDrops(self._drops, self.channel)

    @property
    def export_mode(self) -> str:
        """``process`` (otel_llm's spans and metrics leave through an export process) or ``in_process``."""
        return "in_process" if self.channel is None else "process"

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown_result is not None

    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Export everything buffered; wait at most ``timeout_s`` seconds (default ``shutdown_timeout_s``).

        Returns True when both providers finished flushing in time (an export the collector rejected
        still finished; the exporter logs that loss). Never raises.
        """
        if self.is_shutdown:
            return False
        budget = self.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        self._close_step_windows()
        calls = self._provider_calls("force_flush", budget)
        failed: list[str] = []
        if self.channel is not None:
            call = functools.partial(self._channel_call, "flush", budget, failed)
            calls.append(("export process flush", call))
        late = _run_until(calls, deadline) + [(name, None) for name in failed]
        if late:
            _logger.warning(
                "otel_llm: %s did not finish within %s", ", ".join(n for n, _ in late), _seconds(budget)
            )
        return not late

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Flush and stop both providers, returning within about ``timeout_s`` seconds (+1 s grace).

        ``timeout_s`` defaults to ``shutdown_timeout_s`` (``configure(shutdown_timeout_s=...)`` or the
        ``OTEL_LLM_SHUTDOWN_TIMEOUT`` environment variable, default 5 s). Returns True when both providers
        finished in time, False when it gave up on them (one warning says so, naming that budget).
        Idempotent: later calls return the first call's result at once. Never raises.
        """
        return self._shutdown(timeout_s, warn=True)

    def shutdown_quietly(self, timeout_s: float) -> bool:
        """``shutdown()`` without its warning: for the export process, whose ``timeout_s`` is the part of
        the engine's budget left to it, and whose lateness the engine's process reports in the user's
        terms (as ``export process shutdown``)."""
        return self._shutdown(timeout_s, warn=False)

    def _shutdown(self, timeout_s: float | None, warn: bool) -> bool:
        with self._lock:
            if self._shutdown_result is not None:
                return self._shutdown_result
            budget = self.shutdown_timeout_s if timeout_s is None else timeout_s
            asked = budget  # the budget the user set, which the warning names
            if self._unreachable_at_start and _still_refused():
                # Nothing listened at the start and nothing listens now: a retry cannot deliver, so the
                # last export is given up on at once (and counted) instead of for the whole budget.
                budget = min(budget, _GIVE_UP_S)
            deadline = time.monotonic() + budget
            self._close_step_windows()
            calls = self._provider_calls("shutdown", budget)
            failed: list[str] = []
            if self.channel is not None:
                call = functools.partial(self._channel_call, "shutdown", budget, failed)
                calls.append(("export process shutdown", call))
            late = _run_until(calls, deadline) + [(name, None) for name in failed]
            if late and warn:
                names = ", ".join(n for n, _ in late)
                if budget < asked:
                    _logger.warning(
                        "otel_llm: no collector listened at the start or at shutdown, so %s gave up at "
                        "once instead of waiting out the %s shutdown timeout; unexported telemetry is "
                        "dropped",
                        names,
                        _seconds(asked),
                    )
                else:
                    _logger.warning(
                        "otel_llm: %s did not finish within the %s shutdown timeout (collector unreachable "
                        "or slow?); unexported telemetry is dropped",
                        names,
                        _seconds(asked),
                    )
            if late:
                # Reported here and in delivery(): what the exporters log from now on adds nothing.
                _silence_exporters()
                grace_ends = time.monotonic() + _ABORT_GRACE_S
                self._abort_exporters(grace_ends)
                # Told to stop, the exports in flight return now; waiting for them (within the same
                # grace) lets delivery() count their batches as lost rather than miss them.
                _join([(name, thread) for name, thread in late if thread is not None], grace_ends)
            self._shutdown_result = not late
            atexit.unregister(self._shutdown_at_exit)
            return self._shutdown_result

    def delivery(self, signal: str) -> tuple[int, dict[str, int]]:
        """``(delivered, {reason: lost})`` for ``"spans"``, ``"metric_points"`` or ``"requests"``, reasons
        with a loss only.

        Delivered counts what exports accepted (the collector, or the files), here and in the export
        process. Losses are those of ``drops`` and the export process's; after ``shutdown()``, spans also
        count as ``unsent_at_shutdown`` when they were still queued as the pipeline stopped (ended, but
        neither exported nor counted lost otherwise). ``requests`` (export mode ``process``): finished
        requests the export process completed, and those lost before it (``queue_full``,
        ``export_process_exited``).
        """
        if signal == "requests":
            if self.channel is None:
                return 0, {}
            done, losses = self.channel.delivery()["requests"]
            return done, {reason: n for reason, n in losses.items() if n}
        drops = self.drops
        delivered = drops.delivered(signal)
        lost = {reason: n for reason, n in drops.by_reason(signal).items() if n}
        ended = drops.spans_ended
        if signal == "spans" and self.is_shutdown:
            unsent = ended - delivered - sum(lost.values())
            if unsent > 0:
                lost[REASON_UNSENT] = unsent
        return delivered, lost

    def delivery_report(self) -> DeliveryReport:
        """Shut down (a no-op when already done), then what was delivered and lost, as plain data."""
        in_time = self.shutdown()
        counts = {s: self.delivery(s) for s in ("spans", "metric_points", "requests")}
        return DeliveryReport(counts, in_time, self.exporter_lines())

    def _channel_call(self, method: str, budget_s: float, failed: list[str]) -> None:
        """The export process's flush or shutdown; its name in ``failed`` when it did not finish in time."""
        if not getattr(self.channel, method)(budget_s):
            failed.append(f"export process {method}")

    def _close_step_windows(self) -> None:
        """In process: the open windows of the engine's own step spans (detail ``steps``) of the trackers
        on this provider end now, so they leave with this flush (the export channel does it beside an
        export process)."""
        if self.channel is None:
            from otel_llm.emit.pipeline import close_step_windows

            close_step_windows(self.tracer_provider)

    def _provider_calls(self, method: str, budget_s: float) -> list[tuple[str, Callable[[], Any]]]:
        """``(name, call)`` for each provider that has ``method``; no-op providers have neither."""
        timeout_millis = max(0.0, budget_s) * 1000
        calls: list[tuple[str, Callable[[], Any]]] = []
        for signal, provider in (("trace", self.tracer_provider), ("metrics", self.meter_provider)):
            call = getattr(provider, method, None)
            if call is None:
                continue
            # TracerProvider.shutdown takes no timeout; the deadline in _run_until bounds it instead.
            if not (signal == "trace" and method == "shutdown"):
                call = functools.partial(call, timeout_millis=timeout_millis)
            calls.append((f"{signal} {method}", call))
        return calls

    def _abort_exporters(self, deadline: float) -> None:
        """Tell each exporter to stop retrying and close its connection, waiting for it until ``deadline``."""
        tasks = [(f"abort {type(e).__name__}", e.shutdown) for e in self._exporters]
        _run_until(tasks, deadline)

    def _shutdown_at_exit(self) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"Telemetry(tracer_provider={type(self.tracer_provider).__name__}, "
            f"meter_provider={type(self.meter_provider).__name__}, output_dir={self.output_dir!r})"
        )
