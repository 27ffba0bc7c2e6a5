"""Overload: far more finished requests per second than the exporter can send.

A slow collector (half a second per export) and a small span queue (OTEL_BSP_MAX_QUEUE_SIZE=64): the
queue stays bounded (memory measured with tracemalloc, queue depth exported as a self-metric), the SDK's
rule holds (a full queue discards its oldest span to keep the newest), every loss is counted, and the
engine thread's hook calls never wait on an export: with a collector that holds every export unanswered,
they all return.
"""

from __future__ import annotations

import tracemalloc

import pytest
from fault_tools import balanced, build, dropped_spans, on_thread, received_span_ids, serve, wait_for
from otlp_receivers import GrpcReceiver, Mode, attributes

from otel_llm import semconv as sc
from otel_llm.export.counting import ATTR_REASON, REASON_QUEUE_FULL, SPANS

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


QUEUE = 64
BATCH = 16
SPANS_PER_REQUEST = 4  # llm.request, llm.queue, llm.prefill, llm.decode (docs/lifecycle.md)


def overloaded(env, started, mode=Mode.SLOW):
    receiver = GrpcReceiver(mode=mode, delay_s=0.5)
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    env.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(QUEUE))
    env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", str(BATCH))
    # Span ids are not kept: the memory measured must be the pipeline's, not the test's bookkeeping.
    return receiver, *build(started, keep_ids=False)


def test_overload_bounded_queue_oldest_dropped_and_counted(env, started) -> None:
    receiver, telemetry, tracker, produced = overloaded(env, started)

    tracemalloc.start()
    try:
        on_thread(lambda: serve(tracker, [f"warm-{i}" for i in range(300)]))  # fills the queue
        after_warmup = tracemalloc.get_traced_memory()[0]
        on_thread(lambda: serve(tracker, [f"load-{i}" for i in range(1200)]))
        after_load = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    if telemetry.export_mode == "in_process":  # the span queue is this process's memory only then
        # An unbounded queue would hold 4x the warm-up's spans more; a bounded one holds about the same.
        assert after_load - after_warmup < after_warmup, (after_warmup, after_load)
    assert wait_for(lambda: produced.count >= 1500 * SPANS_PER_REQUEST)
    dropped_so_far = telemetry.drops.by_reason(SPANS)[REASON_QUEUE_FULL]
    assert dropped_so_far > produced.count / 2

    # Self-metrics through the same (slow) collector: the queue depth never above its bound.
    on_thread(lambda: telemetry.force_flush(timeout_s=10))
    assert wait_for(lambda: bool(receiver.collected.metrics(sc.METRIC_QUEUE_DEPTH)))
    (_, depth), *_ = receiver.collected.metrics(sc.METRIC_QUEUE_DEPTH)
    assert 0 <= depth.sum.data_points[0].as_int <= QUEUE
    _, dropped = receiver.collected.metrics(sc.METRIC_DROPPED_SPANS)[-1]
    queue_full = [
        p for p in dropped.sum.data_points if attributes(p.attributes)[ATTR_REASON] == REASON_QUEUE_FULL
    ]
    assert queue_full[0].as_int >= dropped_so_far

    # Everything still queued is exported; the books balance exactly.
    on_thread(lambda: telemetry.force_flush(timeout_s=20))
    assert wait_for(
        lambda: balanced(len(received_span_ids(receiver.collected)), dropped_spans(telemetry), produced.count)
    )
    assert telemetry.drops.by_reason(SPANS)[REASON_QUEUE_FULL] == dropped_spans(telemetry)

    # Drop rule: the newest spans survive. The last requests' spans (fewer than the queue holds) all
    # arrived, while requests from the middle of the burst were lost.
    arrived = {
        attributes(s.attributes)[sc.LLM_REQUEST_ID]
        for _, s in receiver.collected.spans()
        if s.name == sc.SPAN_REQUEST
    }
    newest = {f"load-{i}" for i in range(1200 - QUEUE // SPANS_PER_REQUEST, 1200)}
    assert newest <= arrived
    assert not {f"load-{i}" for i in range(400, 800)} <= arrived


def test_overload_hook_calls_never_wait_on_a_stuck_export(env, started) -> None:
    # Export timeout far beyond the test: an export the collector holds stays in flight all along, so
    # a hook that waited on one (a synchronous export, a blocking put into a full queue) would never
    # return, and on_thread fails at its deadline. No timing is compared.
    env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "600")
    receiver, _, tracker, _ = overloaded(env, started, mode=Mode.BLACK_HOLE)
    on_thread(lambda: serve(tracker, [f"w{i}" for i in range(100)]))  # 400 spans: batches go out
    assert wait_for(lambda: receiver.held >= 1), "no export reached the collector"
    held_before = receiver.held

    on_thread(lambda: serve(tracker, range(1500)))

    # Every export the collector took is still unanswered: the 1500 requests' hook calls all returned
    # while the exporter was stuck inside an export.
    assert receiver.collected.received() == []
    assert receiver.held >= held_before
