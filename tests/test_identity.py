"""Trace identity: traceparent() from queued on, W3C parents, local parents, malformed carriers."""

from __future__ import annotations

import pytest
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_llm import RequestTracker
from otel_llm import semconv as sc

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"


def sdk_header(span_context) -> str:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, set_span_in_context(NonRecordingSpan(span_context)))
    return carrier["traceparent"]


def run_one(tracker, rid, **queued):
    tracker.queued(rid, **queued)
    header = tracker.traceparent(rid)
    tracker.scheduled([rid])
    tracker.tokens([rid])
    tracker.finished(rid)
    return header


def test_traceparent_is_the_root_span_of_the_exported_trace(harness):
    header = run_one(harness.tracker, "r1")
    _, trace_hex, span_hex, _ = header.split("-")
    root = harness.trace("r1", 0).root
    assert header == sdk_header(root.context)  # what the SDK's own propagator writes for that span
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


def test_unsampled_requests_report_the_sampled_flag_off_and_export_nothing():
    provider = TracerProvider(sampler=ALWAYS_OFF)
    tracker = RequestTracker(tracer_provider=provider)
    tracker.queued("r")
    assert int(tracker.traceparent("r").rsplit("-", 1)[1], 16) & 0x01 == 0
    tracker.finished("r")  # builds nothing, raises nothing


def test_noop_providers_still_give_a_traceparent():
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.trace import NoOpTracerProvider

    tracker = RequestTracker(tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
    header = run_one(tracker, "r")
    assert header.startswith("00-") and len(header) == 55


# --- identity from the tracer provider: id generator, sampler, flags --------------------------------------

SAMPLERS = {
    "always_on": sampling.ALWAYS_ON,
    "always_off": sampling.ALWAYS_OFF,
    "ratio": sampling.TraceIdRatioBased(0.5),
    "parent_on": sampling.ParentBased(sampling.ALWAYS_ON),
    "parent_off": sampling.ParentBased(sampling.ALWAYS_OFF),
    "parent_ratio": sampling.ParentBased(sampling.TraceIdRatioBased(0.5)),
}
PARENTS = {
    "no parent": None,
    "sampled remote parent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01",
    "unsampled remote parent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-00",
}


class FixedIds(IdGenerator):
    """Hands out the ids it is told to: lets the SDK itself start a span with a given trace id."""

    def __init__(self) -> None:
        self.trace_id, self.span_id = 1, 1

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id

    def is_trace_id_random(self) -> bool:  # as the tracker's provider's RandomIdGenerator says
        return True


def sdk_flags(sampler, carrier, trace_id: int) -> str:
    """The traceparent flags the SDK gives a span it starts itself, with this sampler, parent and id."""
    ids = FixedIds()
    ids.trace_id = trace_id
    provider = TracerProvider(sampler=sampler, id_generator=ids)
    parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    span = provider.get_tracer("control").start_span(sc.SPAN_REQUEST, context=parent)
    return sdk_header(span.get_span_context()).rsplit("-", 1)[1]


@pytest.mark.parametrize("parent", list(PARENTS))
@pytest.mark.parametrize("sampler_name", list(SAMPLERS))
def test_traceparent_flags_equal_the_sdk_propagators_for_every_sampler(sampler_name, parent):
    sampler, header = SAMPLERS[sampler_name], PARENTS[parent]
    spans = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracker = RequestTracker(tracer_provider=provider, meter_provider=NoOpMeterProvider())
    seen_flags = set()
    for i in range(24):  # ratio samplers decide by trace id: enough requests for both decisions
        rid = f"r{i}"
        given = run_one(tracker, rid, carrier={"traceparent": header} if header else None)
        exported = [s for s in spans.get_finished_spans() if s.attributes.get(sc.LLM_REQUEST_ID) == rid]
        roots = [s for s in exported if s.name == sc.SPAN_REQUEST]
        if roots:
            assert given == sdk_header(roots[0].context)
        else:  # not exported: the SDK would have given its span these flags
            trace_id = int(given.split("-")[1], 16)
            assert given.rsplit("-", 1)[1] == sdk_flags(
                sampler, {"traceparent": header} if header else None, trace_id
            )
        seen_flags.add(given.rsplit("-", 1)[1])
    if sampler_name.startswith("ratio") and parent == "no parent":
        assert len(seen_flags) == 2  # both decisions were checked


def test_ids_come_from_the_tracer_providers_id_generator():
    class Counting(IdGenerator):
        def __init__(self) -> None:
            self.n = 0

        def generate_trace_id(self) -> int:
            self.n += 1
            return 0xABC000 + self.n

        def generate_span_id(self) -> int:
            self.n += 1
            return 0xDEF000 + self.n

        def is_trace_id_random(self) -> bool:
            return False

    spans = InMemorySpanExporter()
    provider = TracerProvider(id_generator=Counting())
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracker = RequestTracker(tracer_provider=provider, meter_provider=NoOpMeterProvider())
    header = run_one(tracker, "r")
    (root,) = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    assert root.context.trace_id == 0xABC001 and root.context.span_id == 0xDEF002
    assert header == sdk_header(root.context)
    assert header.endswith("-01")  # sampled, and no random-trace-id flag: the generator says so
    children = [s for s in spans.get_finished_spans() if s.name != sc.SPAN_REQUEST]
    assert children and all(0xDEF000 < s.context.span_id < 0xDEF100 for s in children)


class CountingSampler(sampling.Sampler):
    """ALWAYS_ON that remembers every call it got for the request span."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def should_sample(
        self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None
    ):
        if name == sc.SPAN_REQUEST:
            self.calls.append(dict(attributes or {}))
        return sampling.ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links)

    def get_description(self) -> str:
        return "CountingSampler"


@pytest.mark.parametrize("asks_traceparent", [True, False])
def test_the_sampler_is_consulted_once_per_request_with_its_attributes(asks_traceparent):
    sampler = CountingSampler()
    spans = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracker = RequestTracker(tracer_provider=provider, meter_provider=NoOpMeterProvider(), model="m")
    tracker.queued("r", prompt_tokens=7, attributes={"tenant": "t1"})
    if asks_traceparent:
        tracker.traceparent("r")
        tracker.traceparent("r")
    tracker.scheduled(["r"])
    tracker.tokens(["r"])
    tracker.finished("r")
    (call,) = sampler.calls
    assert call[sc.LLM_REQUEST_ID] == "r" and call[sc.GEN_AI_REQUEST_MODEL] == "m" and call["tenant"] == "t1"
    assert call[sc.GEN_AI_USAGE_INPUT_TOKENS] == 7
    (root,) = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    # The span still gets every attribute, those known only at the end included.
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 1 and sc.LLM_LATENCY_E2E in root.attributes
