"""Trace identity: traceparent() from queued on, W3C parents, local parents, malformed carriers."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from otel_llm import RequestTracker
from otel_llm import semconv as sc

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"


def run_one(tracker, rid, **queued):
    tracker.queued(rid, **queued)
    header = tracker.traceparent(rid)
    tracker.scheduled([rid])
    tracker.tokens([rid])
    tracker.finished(rid)
    return header


def test_traceparent_is_the_root_span_of_the_exported_trace(harness):
    header = run_one(harness.tracker, "r1")
    version, trace_hex, span_hex, flags = header.split("-")
    root = harness.trace("r1", 0).root
    assert version == "00" and flags == "01"
    assert int(trace_hex, 16) == root.context.trace_id
    assert int(span_hex, 16) == root.context.span_id
    assert harness.tracker.traceparent("r1") is None  # finished: no longer known


def test_w3c_carrier_makes_the_request_a_child_of_the_caller(harness):
    carrier = {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01", "tracestate": "vendor=x"}
    header = run_one(harness.tracker, "r", carrier=carrier)
    root = harness.trace("r", 0).root
    assert root.context.trace_id == int(PARENT_TRACE, 16)
    assert root.parent.span_id == int(PARENT_SPAN, 16) and root.parent.is_remote
    assert root.kind.name == "SERVER"
    assert root.context.trace_state.get("vendor") == "x"
    assert header.split("-")[1] == PARENT_TRACE


def test_header_names_in_odd_case_and_bytes_values(harness):
    carrier = [(b"TraceParent", f"00-{PARENT_TRACE}-{PARENT_SPAN}-01".encode())]
    run_one(harness.tracker, "r", carrier=carrier)
    assert harness.trace("r", 0).root.context.trace_id == int(PARENT_TRACE, 16)


def test_malformed_carriers_start_a_fresh_trace(harness):
    bad = [
        {"traceparent": "garbage"},
        {"traceparent": f"00-{'0' * 32}-{PARENT_SPAN}-01"},  # all-zero trace id is invalid
        {"traceparent": 12345},
        {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01", "tracestate": "x" * 100_000},
        {1: 2, None: object()},
        "not a mapping",
        42,
    ]
    for i, carrier in enumerate(bad):
        run_one(harness.tracker, f"r{i}", carrier=carrier)
    roots = harness.roots()
    assert len(roots) == len(bad)
    for root in roots:
        assert root.context.is_valid
        rid = int(root.attributes[sc.LLM_REQUEST_ID][1:])
        if rid == 3:  # a valid traceparent with an oversized tracestate keeps the parent
            assert root.context.trace_id == int(PARENT_TRACE, 16)
        else:
            assert root.parent is None and root.context.trace_id != int(PARENT_TRACE, 16)


def test_local_parent_gives_an_internal_child(harness):
    tracer = harness.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("http.request") as outer:
        harness.tracker.queued("r")
    harness.tracker.finished("r")
    root = harness.trace("r", 0).root
    assert root.parent.span_id == outer.get_span_context().span_id
    assert root.kind.name == "INTERNAL"


def test_unsampled_requests_report_flag_00_and_export_nothing():
    provider = TracerProvider(sampler=ALWAYS_OFF)
    tracker = RequestTracker(tracer_provider=provider)
    tracker.queued("r")
    assert tracker.traceparent("r").endswith("-00")
    tracker.finished("r")  # builds nothing, raises nothing


def test_noop_providers_still_give_a_traceparent():
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.trace import NoOpTracerProvider

    tracker = RequestTracker(tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
    header = run_one(tracker, "r")
    assert header.startswith("00-") and len(header) == 55
