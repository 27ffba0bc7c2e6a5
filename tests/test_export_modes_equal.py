"""One workload, both export modes, the same telemetry on the wire: field by field.

The workload runs twice through ``configure()`` to a real OTLP/gRPC receiver each: built and exported in
the engine's process (``in_process``), and by the export process (``process``). Every exported span must
agree in name, kind, times, attributes, events, status, parent, resource, scope and trace state, and every
metric point in its attributes, counts, sums, buckets, extremes, values and exemplars. Ids drawn where the
spans are built (the children's) differ by nature between two runs; each is named by its place in its
request's tree, and the request span's ids by the request. Both trackers get one wall-clock offset, so
times compare exactly; point timestamps (when a collection ran) are left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from otlp_receivers import GrpcReceiver, attributes

from otel_llm import RequestTracker, TailSampling
from otel_llm import semconv as sc
from otel_llm.setup import configure

OFFSET_NS = 1_750_000_000 * 10**9
# Exported only beside an export process: what the engine's process lost before handing records over.
ONLY_BESIDE_AN_EXPORT_PROCESS = {sc.METRIC_DROPPED_RECORDS}


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        for name in values:
            os.environ.pop(name, None)
        os.environ.update(saved)


def workload(make: Any) -> None:
    """Preemptions in prefill and decode, an error, an abort, a remote and a local parent, caller
    attributes, prefix-cache figures, engine state, detail levels, tail sampling, a disaggregated pair."""
    for detail in ("phases", "steps", "request"):
        t = make(trace_detail=detail)
        base = 100.0
        t.queued("plain", ts=base, arrival_ts=base - 0.004, prompt_tokens=12, attributes={"tenant": "blue"})
        t.queued("preempted", ts=base, prompt_tokens=20)
        t.queued(
            "remote",
            ts=base,
            carrier={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        )
        local = NonRecordingSpan(SpanContext(0x777, 0x888, is_remote=False, trace_flags=TraceFlags(1)))
        token = otel_context.attach(trace.set_span_in_context(local))
        try:
            t.queued("local", ts=base)
        finally:
            otel_context.detach(token)
        t.queued("failed", ts=base)
        t.queued("aborted", ts=base)
        t.traceparent("plain")  # its sampling decided early, on the hook side
        t.scheduled(
            ["plain", "preempted", "remote", "local", "failed"], ts=base + 0.01, cached_tokens=[4, 0, 0, 0, 0]
        )
        ts = base + 0.01
        for step in range(12):
            ts += 0.01
            batch = ["plain", "remote", "local"] + (["preempted"] if step not in (3, 4, 8) else [])
            t.tokens(batch, ts=ts)
            t.engine_state(kv_cache_usage=0.5, running=len(batch), waiting=1, step_tokens=len(batch))
            if step in (2, 7):
                t.preempted(["preempted"], ts=ts + 0.001)
            if step in (4, 8):
                t.scheduled(["preempted"], ts=ts + 0.002, cached_tokens=[8])
            if step == 5:
                t.finished("failed", ts=ts, reason="error", error=RuntimeError("out of memory"))
        for rid in ("plain", "preempted", "remote", "local"):
            t.finished(rid, ts=ts + 0.005)
        t.finished("aborted", ts=ts + 0.006, reason="abort")

    # Rules only (no ratio, which reads the trace ids, drawn afresh in each run): the slow ones kept.
    tail = make(tail_sampling=TailSampling(ratio=0.0, e2e_s=0.06))
    for k in range(10):
        rid = f"tail-{k}"
        tail.queued(rid, ts=200.0 + k)
        tail.scheduled([rid], ts=200.01 + k)
        for s in range(2 + k):
            tail.tokens([rid], ts=200.02 + k + 0.01 * s)
        tail.finished(rid, ts=200.03 + k + 0.01 * k)

    prefill, decode = make(role="prefill", tail_sampling=False), make(role="decode", tail_sampling=False)
    prefill.queued("handed", ts=300.0, prompt_tokens=9)
    prefill.scheduled(["handed"], ts=300.01)
    prefill.tokens(["handed"], ts=300.05)
    carrier = prefill.handoff_carrier("handed")
    prefill.kv_sent("handed", ts=300.07, num_bytes=4096)
    decode.queued("handed", ts=300.08, carrier=carrier)
    decode.kv_received("handed", ts=300.09, num_bytes=4096)
    decode.scheduled(["handed"], ts=300.1)
    for s in range(4):
        decode.tokens(["handed"], ts=300.11 + s * 0.01)
    decode.finished("handed", ts=300.2)


def exported(mode: str) -> tuple[list[Any], list[Any]]:
    """(spans, metrics) the receiver got from the workload in export mode ``mode``."""
    receiver = GrpcReceiver()
    receiver.start()
    try:
        settings = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
            "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=equal-modes",
        }
        with environment(settings):
            telemetry = configure(set_global=False, service_name="equal", export_mode=mode)
        assert telemetry.export_mode == mode

        trackers: list[RequestTracker] = []  # alive until the end, as an engine's are

        def make(**kwargs: Any) -> RequestTracker:
            kwargs.setdefault("model", "equal-model")
            tracker = RequestTracker(
                tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, **kwargs
            )
            tracker.clock.offset_ns = tracker.info.clock_offset_ns = OFFSET_NS
            trackers.append(tracker)
            return tracker

        workload(make)
        assert telemetry.force_flush(timeout_s=30)
        assert telemetry.shutdown(timeout_s=30)
        time.sleep(0.2)
        spans = [
            (rs.resource, ss.scope, span)
            for r in receiver.collected.received("traces")
            for rs in r.request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]
        metrics = receiver.collected.received("metrics")
        return spans, metrics
    finally:
        receiver.stop()


def canonical_spans(spans: list[Any]) -> list[Any]:
    """Every span as a comparable row; ids as their place in the request's tree."""
    by_trace: dict[bytes, list[Any]] = {}
    for resource, scope, span in spans:
        by_trace.setdefault(span.trace_id, []).append((resource, scope, span))
    names: dict[tuple[bytes, bytes], Any] = {}
    for trace_id, members in by_trace.items():
        roots = [s for _, _, s in members if s.name in (sc.SPAN_REQUEST, sc.SPAN_INSTANCE_PREFILL)]
        request = sorted(attributes(roots[0].attributes).get(sc.LLM_REQUEST_ID, "") for _ in roots[:1])
        ordered = sorted(
            members, key=lambda m: (m[2].start_time_unix_nano, m[2].end_time_unix_nano, m[2].name)
        )
        for k, (_, _, span) in enumerate(ordered):
            names[(trace_id, span.span_id)] = (tuple(request), k)
    rows = []
    for resource, scope, span in spans:
        parent = names.get((span.trace_id, span.parent_span_id), span.parent_span_id.hex())
        own = names[(span.trace_id, span.span_id)]
        # The request span's ids are the engine's own: they must be the same, not only in place.
        fixed = span.span_id.hex() if span.name == sc.SPAN_REQUEST else None
        rows.append(
            (
                own,
                fixed is not None,
                span.name,
                span.kind,
                parent,
                span.start_time_unix_nano,
                span.end_time_unix_nano,
                sorted(attributes(span.attributes).items(), key=str),
                [
                    (e.name, e.time_unix_nano, sorted(attributes(e.attributes).items(), key=str))
                    for e in span.events
                ],
                (span.status.code, span.status.message),
                span.trace_state,
                span.flags,
                sorted(attributes(resource.attributes).items(), key=str),
                (scope.name, scope.version),
            )
        )
    return sorted(rows, key=str)


def canonical_points(requests: list[Any], spans: list[Any]) -> dict[Any, Any]:
    """The latest point of every metric and attribute set (cumulative), exemplars by request."""
    request_of = {}
    for _, _, span in spans:
        if span.name == sc.SPAN_REQUEST:
            request_of[span.span_id] = attributes(span.attributes)[sc.LLM_REQUEST_ID]
    latest: dict[Any, Any] = {}
    for r in requests:
        for rm in r.request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name in ONLY_BESIDE_AN_EXPORT_PROCESS:
                        continue
                    kind = metric.WhichOneof("data")
                    for p in getattr(metric, kind).data_points:
                        key = (
                            sm.scope.name,
                            metric.name,
                            metric.unit,
                            kind,
                            sorted(attributes(p.attributes).items(), key=str),
                        )
                        if kind == "histogram":
                            value: Any = (
                                p.count,
                                p.sum,
                                list(p.bucket_counts),
                                list(p.explicit_bounds),
                                p.min if p.HasField("min") else None,
                                p.max if p.HasField("max") else None,
                            )
                        else:
                            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                        exemplars = sorted(
                            (request_of.get(e.span_id, e.span_id.hex()), e.as_double, e.time_unix_nano)
                            for e in getattr(p, "exemplars", [])
                        )
                        latest[str(key)] = (value, exemplars)
    return latest


@pytest.fixture(scope="module")
def both() -> dict[str, tuple[list[Any], list[Any]]]:
    return {mode: exported(mode) for mode in ("in_process", "process")}


def test_the_same_spans_field_by_field(both) -> None:
    here, beside = (canonical_spans(both[m][0]) for m in ("in_process", "process"))
    assert len(here) > 60
    assert beside == here


def test_the_same_metric_points(both) -> None:
    here = canonical_points(both["in_process"][1], both["in_process"][0])
    beside = canonical_points(both["process"][1], both["process"][0])
    assert len(here) > 30
    assert sorted(beside) == sorted(here)
    for key in here:
        assert beside[key] == here[key], key
