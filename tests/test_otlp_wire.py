"""otel_llm's OTLP trace encoder writes what the SDK's encoder writes, field by field.

Both encoders' output is parsed with the official protobuf definitions (opentelemetry-proto) and
compared as messages and as deterministic re-serializations: spans from a real tracker run (preemptions,
stalls, engine step spans and their links, at detail ``steps``), hand-built spans with every field and
attribute type OTLP carries, and a real OTLP/gRPC receiver fed by ``configure()``'s exporter.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as SdkGrpcSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

import otel_llm
from otel_llm import semconv as sc
from otel_llm.export import otlp
from otel_llm.export.otlp_wire import encode_spans
from tests.otlp_receivers import GrpcReceiver

T0 = 5000.0  # an arbitrary monotonic origin


def assert_encoded_alike(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    sdk = sdk_encode_spans(spans)
    assert ours.SerializeToString(deterministic=True) == sdk.SerializeToString(deterministic=True), (
        ours,
        sdk,
    )
    assert ours == sdk
    return ours


def tracker_spans(detail: str) -> list[ReadableSpan]:
    """The spans of a real tracker run: 12 requests in batches, two preempted and recomputed (the
    others stall behind that step), three cut short, every step reported with ``batch()``."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "wire", "deployment.env": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracker = otel_llm.RequestTracker(
        tracer_provider=provider, meter_provider=MeterProvider(), model="m", trace_detail=detail
    )
    ids = [f"r{i}" for i in range(12)]
    t = T0
    for rid in ids:
        tracker.queued(rid, prompt_tokens=40, ts=t)
    tracker.scheduled(ids[:8], ts=t + 0.001)
    tracker.batch({rid: 40 for rid in ids[:8]}, ts=t + 0.001)
    tracker.tokens(ids[:8], ts=t + 0.01)
    running = ids[:8]
    t += 0.01
    for step in range(1, 30):
        t += 0.01
        if step == 5:
            tracker.preempted(["r0", "r1"], ts=t)
            running = [r for r in running if r not in ("r0", "r1")]
        if step == 8:  # two recomputes and a prompt: a step six times as long, a recompute stall
            tracker.scheduled(["r0", "r1", "r8"], ts=t)
            tracker.batch(
                {**{r: 1 for r in running}, "r0": 45, "r1": 45, "r8": 40}, ts=t, recompute=["r0", "r1"]
            )
            running = [*running, "r0", "r1", "r8"]
            t += 0.05
            tracker.tokens(running, ts=t)
            continue
        tracker.batch({r: 1 for r in running}, ts=t)
        tracker.tokens(running, ts=t + 0.008)
        if step % 7 == 0:
            done, running = running[0], running[1:]
            tracker.finished(done, ts=t + 0.009)
    for rid in running:
        tracker.finished(rid, ts=T0 + 10.0)
    for rid in ("r9", "r10", "r11"):  # never scheduled: cut short
        tracker.finished(rid, ts=T0 + 10.0, reason="abort")
    provider.force_flush()
    spans = list(memory.get_finished_spans())
    assert len(spans) >= 12
    return spans


@pytest.mark.parametrize("detail", ["request", "phases", "steps"])
def test_a_tracker_run_encodes_as_the_sdk_encodes_it(detail: str) -> None:
    spans = tracker_spans(detail)
    request = assert_encoded_alike(spans)
    encoded = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(encoded) == len(spans)
    if detail == "steps":
        assert any(s.links for s in encoded), "no span with links: the run did not exercise them"
    causes = {
        kv.value.string_value
        for s in encoded
        for e in s.events
        if e.name == sc.EVENT_STALL
        for kv in e.attributes
        if kv.key == sc.LLM_STALL_CAUSE
    }
    assert {sc.STALL_RECOMPUTE, sc.STALL_PREEMPTION} <= causes, causes  # stall events, every field


def context(
    trace_id: int, span_id: int, remote: bool = False, state: TraceState | None = None
) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, TraceFlags(TraceFlags.SAMPLED), state)


def test_every_span_field_and_attribute_type_encodes_as_the_sdk_encodes_it() -> None:
    resource = Resource({"service.name": "svc", "n": 3}, schema_url="https://opentelemetry.io/schemas/1.30.0")
    scope = InstrumentationScope("lib", "1.2.3", "https://example.test/schema", {"scope.flag": True})
    bare_scope = InstrumentationScope("bare")
    attributes: dict[str, Any] = {
        "str": "naïve ✓ text",
        "empty": "",
        "true": True,
        "false": False,
        "zero": 0,
        "negative": -12345678901,
        "int64 max": 2**63 - 1,
        "int64 min": -(2**63),
        "float": 0.1,
        "negative float": -2.5e300,
        "strings": ["a", "", "ü"],
        "bools": (True, False),
        "ints": [1, -1, 2**40],
        "floats": [0.0, 1.5],
        "no values": [],
        "bytes": b"\x00\xff",
    }
    parent_remote = context(0xABC, 0x1, remote=True)
    spans = [
        ReadableSpan(
            "full",
            context(2**128 - 1, 2**64 - 1, state=TraceState([("vendor", "v1"), ("other", "x")])),
            parent=parent_remote,
            resource=resource,
            attributes=attributes,
            events=[
                Event("ev", {"k": "v", "i": 7}, timestamp=1_700_000_000_000_000_001),
                Event("bare", None, 5),
            ],
            links=[Link(context(7, 8), {"why": "because"}), Link(context(9, 10, remote=True))],
            kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR, "went wrong"),
            start_time=1_700_000_000_000_000_000,
            end_time=1_700_000_000_500_000_000,
            instrumentation_scope=scope,
        ),
        ReadableSpan(
            "child",
            context(1, 2),
            parent=context(1, 3),
            resource=resource,
            kind=SpanKind.CLIENT,
            status=Status(StatusCode.OK),
            start_time=1,
            end_time=2,
            instrumentation_scope=scope,
        ),
        ReadableSpan(
            "",
            context(1, 4),
            resource=Resource(
                {"service.name": "svc", "n": 3}, schema_url="https://opentelemetry.io/schemas/1.30.0"
            ),  # equal resource, other object
            kind=SpanKind.PRODUCER,
            instrumentation_scope=bare_scope,
        ),
        ReadableSpan(
            "no scope",
            context(1, 5),
            resource=Resource({"service.name": "other"}),
            kind=SpanKind.CONSUMER,
            instrumentation_scope=None,
        ),
        dropped_counts_span(resource, scope),
    ]
    request = assert_encoded_alike(spans)
    assert len(request.resource_spans) == 2  # equal resources are one, as the SDK groups them
    assert [len(rs.scope_spans) for rs in request.resource_spans] == [2, 1]
    dropped = request.resource_spans[0].scope_spans[0].spans[-1]
    assert (dropped.dropped_attributes_count, dropped.dropped_events_count, dropped.dropped_links_count) == (
        2,
        1,
        3,
    )


def dropped_counts_span(resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """A span that went over its limits, as the SDK's live span leaves it."""
    provider = TracerProvider(resource=resource)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    from opentelemetry.sdk.trace import SpanLimits

    provider._span_limits = SpanLimits(max_span_attributes=1, max_events=1, max_links=1)
    tracer = provider.get_tracer(scope.name, scope.version, scope.schema_url, scope.attributes)
    links = [Link(context(1, i)) for i in range(20, 24)]
    with tracer.start_as_current_span("dropped", links=links) as span:
        span.set_attributes({"a": 1, "b": 2, "c": 3})
        span.add_event("one")
        span.add_event("two")
    (finished,) = memory.get_finished_spans()
    return finished


def test_a_value_otlp_cannot_carry_is_left_out_as_the_sdk_leaves_it(caplog: pytest.LogCaptureFixture) -> None:
    span = ReadableSpan(
        "odd",
        context(1, 2),
        resource=Resource({}),
        attributes={"kept": 1, "object": object(), "too large": 2**64, "after": "x"},
        instrumentation_scope=InstrumentationScope("s"),
    )
    with caplog.at_level(logging.ERROR):
        request = assert_encoded_alike([span])
    keys = [kv.key for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes]
    assert keys == ["kept", "after"]
    assert any("attribute 'object' not exported" in r.getMessage() for r in caplog.records)


def test_the_grpc_exporter_sends_the_wire_encoders_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # configure() takes its OTLP/gRPC span exporter from here: the SDK's, with only its encoding replaced.
    spans = tracker_spans("steps")
    with GrpcReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        exporter = otlp.otlp_span_exporter(otlp.PROTOCOL_GRPC)
        assert isinstance(exporter, SdkGrpcSpanExporter)
        assert type(exporter)._translate_data is not SdkGrpcSpanExporter._translate_data
        try:
            assert exporter.export(spans) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        (received,) = receiver.collected.received("traces")
    sdk = sdk_encode_spans(spans)
    assert received.request.SerializeToString(deterministic=True) == sdk.SerializeToString(deterministic=True)


def test_the_sdk_encoder_is_one_variable_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_LLM_OTLP_ENCODER", "sdk")
    exporter = otlp.otlp_span_exporter(otlp.PROTOCOL_GRPC)
    try:
        assert type(exporter) is SdkGrpcSpanExporter
    finally:
        exporter.shutdown()


def test_an_encoder_otel_llm_does_not_know_stops_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_LLM_OTLP_ENCODER", "fast")
    with pytest.raises(ValueError, match="OTEL_LLM_OTLP_ENCODER='fast' is not supported"):
        otel_llm.configure(set_global=False, service_name="wire-test")
