"""Shared pieces of the fault tests: a telemetry pipeline built by ``configure()`` from the environment,
a count of the spans the SDK produced, an engine-like request driver, and receivers on a chosen port.

"Produced" spans are counted by a real span processor on the same tracer provider (export mode
``in_process``) or, in export mode ``process``, as the export process's own count of the spans its
pipeline was given (``Telemetry.drops.spans_ended``, as it last reported), so every test can check the
conservation rule: spans received by the collector + spans counted as dropped == produced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from otlp_receivers import Collected

from otel_llm import RequestTracker
from otel_llm.export.counting import SPANS
from otel_llm.export.telemetry import Telemetry
from otel_llm.setup import configure

# "It returned": far above anything a non-blocking call needs, far below a hang on a stuck exporter.
JOIN_DEADLINE_S = 30.0
WAIT_S = 20.0  # how long to poll for exports / drop counts before failing


class ProducedSpans(SpanProcessor):
    """Counts every sampled span the tracer provider ended: what the pipeline was given. With ``keep_ids``
    it also keeps their (trace id, span id), for tests that match them against what arrived."""

    def __init__(self, keep_ids: bool = True) -> None:
        self._lock = threading.Lock()
        self._keep_ids = keep_ids
        self._count = 0
        self.ids: set[tuple[int, int]] = set()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            with self._lock:
                self._count += 1
                if self._keep_ids:
                    self.ids.add((span.context.trace_id, span.context.span_id))

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class SpansEnded:
    """In export mode ``process``: the spans the export process's pipeline was given, as it reported."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    @property
    def count(self) -> int:
        return int(self._telemetry.drops.spans_ended)


def build(
    started: list[Any], keep_ids: bool = True, **tracker_kwargs: Any
) -> tuple[Telemetry, RequestTracker, Any]:
    """``configure()`` from the environment, a produced-span counter and a tracker on its providers."""
    telemetry = configure(set_global=False, shutdown_timeout_s=1.0)
    started.append(telemetry)
    produced: Any = SpansEnded(telemetry)
    if telemetry.export_mode == "in_process":
        produced = ProducedSpans(keep_ids)
        telemetry.tracer_provider.add_span_processor(produced)
    tracker_kwargs.setdefault("model", "fault-model")
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, **tracker_kwargs
    )
    return telemetry, tracker, produced


def serve(tracker: RequestTracker, request_ids: Iterable[Any], batch: int = 16) -> None:
    """Run requests through the engine lifecycle in batches: queued, scheduled, two tokens steps, finished."""
    ids = list(request_ids)
    for i in range(0, len(ids), batch):
        group = ids[i : i + batch]
        for rid in group:
            tracker.queued(rid, prompt_tokens=4)
        tracker.scheduled(group)
        tracker.tokens(group)
        tracker.tokens(group)
        for rid in group:
            tracker.finished(rid, reason="stop")


def on_thread(work: Callable[[], Any], deadline_s: float = JOIN_DEADLINE_S) -> float:
    """Run ``work`` on its own thread; fail if it has not returned by the deadline. Returns its duration
    in seconds (measured on the worker thread, for ratios only)."""
    spent: list[float] = []
    errors: list[BaseException] = []

    def run() -> None:
        start = time.perf_counter()
        try:
            work()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        spent.append(time.perf_counter() - start)

    thread = threading.Thread(target=run, name="engine-loop", daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert not thread.is_alive(), "the hook calls did not return: they waited for the exporter"
    assert not errors, errors
    return spent[0]


def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def balanced(received: int, dropped: int, produced: int) -> bool:
    """Every produced span was received or counted as dropped.

    The SDK's batch processor checks "queue full" and then appends without a lock, so a span the export
    thread made room for in between is reported as dropped although it is not: drop counts may err high
    by a few under contention, never low. ``dropped`` may exceed the true loss by at most 1% (and 2).
    """
    accounted = received + dropped
    return produced <= accounted <= produced + max(2, produced // 100)


def received_span_ids(collected: Collected) -> list[tuple[int, int]]:
    return [
        (int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big")) for _, s in collected.spans()
    ]


def dropped_spans(telemetry: Telemetry) -> int:
    return telemetry.drops.total(SPANS)
