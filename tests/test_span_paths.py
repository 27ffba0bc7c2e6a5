"""Both ways spans leave otel_llm give the processors the same spans, field by field.

On an SDK TracerProvider, a finished request's spans are made as the SDK's own ReadableSpans and handed
to the provider's span processor (``otel_llm.sdk_spans``); a provider with a span processor that has an
``on_start`` of its own gets them through ``tracer.start_span()`` instead, as any other provider does.
Here the same workloads (preemptions in prefill and decode, the preemption and step caps, every detail
level, tail sampling, a disaggregated hand-off, a caller's remote and local parent, errors, a
span_hook, eviction) run against two providers alike in all but that: same sampler, span limits,
resource and a seeded id generator each, so both draw the same ids if the paths draw them in the same
order. Every exported span must agree in name, ids, parent, kind, times, attributes, events, links,
status, resource, scope and dropped counts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.emit.sampling import TailSampling

OFFSET_NS = 1_700_000_000 * 10**9  # one wall-clock offset for every tracker: times compare exactly
STEP = 0.01


class SeededIds(IdGenerator):
    """Ids from a seeded generator: two providers given the same seed draw the same sequence."""

    def __init__(self, seed: int, random_flag: bool) -> None:
        self._random = random.Random(seed)
        self._random_flag = random_flag

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:  # read by SDKs that set W3C's random-trace-id flag
        return self._random_flag


class StartWatcher(SpanProcessor):
    """A user's processor that looks at spans as they start: the tracer's path must serve it."""

    def __init__(self) -> None:
        self.started = 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += 1


SETUPS: dict[str, dict[str, Any]] = {
    "parent-based always-on, default limits": {
        "sampler": ParentBased(ALWAYS_ON),
        "limits": None,
        "flag": True,
    },
    "trace-id ratio, tight limits": {
        "sampler": TraceIdRatioBased(0.6),
        "limits": SpanLimits(
            max_span_attributes=9, max_events=4, max_event_attributes=0, max_span_attribute_length=5
        ),
        "flag": False,
    },
    "parent-based ratio, events capped": {
        "sampler": ParentBased(TraceIdRatioBased(0.7)),
        "limits": SpanLimits(max_events=3, max_span_attributes=40),
        "flag": True,
    },
}


def provider(setup: dict[str, Any], watched: bool) -> tuple[TracerProvider, InMemorySpanExporter, Any]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(
        sampler=setup["sampler"],
        resource=Resource.create({"service.name": "span-paths", "deployment.environment": "test"}),
        id_generator=SeededIds(20, setup["flag"]),
        span_limits=setup["limits"],
    )
    watcher = None
    if watched:
        watcher = StartWatcher()
        tp.add_span_processor(watcher)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter, watcher


def _remote(trace_id: int, span_id: int, sampled: bool) -> dict[str, str]:
    return {
        "traceparent": f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}",
        "tracestate": "vendor=abc,other=1",
    }


def _run(
    t: RequestTracker, rid: str, t0: float, tokens: int, preempt_at: tuple[int, ...] = (), **queued: Any
) -> float:
    """One request from queued to finished; ``preempt_at``: token counts after which it is preempted
    (0: before its first token, in prefill). Returns the finish time."""
    t.queued(rid, ts=t0, **queued)
    ts = t0 + STEP
    t.scheduled([rid], ts=ts, cached_tokens=[3])
    for k in range(tokens):
        if k in preempt_at:
            t.preempted([rid], ts=ts + STEP / 4)
            ts += STEP
            t.scheduled([rid], ts=ts)
        ts += STEP
        t.tokens([rid], ts=ts)
    return ts + STEP / 2


def workload(make: Callable[..., RequestTracker]) -> None:
    """Every shape of trace; ``make(**tracker_kwargs)`` builds a tracker on the provider under test."""
    for detail in ("phases", "request", "steps"):
        t = make(trace_detail=detail)
        base = 100.0
        end = _run(
            t,
            "plain",
            base,
            20,
            arrival_ts=base - 0.004,
            prompt_tokens=7,
            attributes={"tenant": "blue", "tags": ["a", "b"], sc.LLM_STEPS: -1},
        )
        t.finished("plain", ts=end)
        end = _run(t, "prefill-preempted", base, 5, (0,))
        t.finished("prefill-preempted", ts=end, reason="length")
        end = _run(t, "decode-preempted", base, 12, (4, 8))
        t.finished("decode-preempted", ts=end)
        end = _run(t, "capped", base, 40, tuple(range(1, 36)))
        t.finished("capped", ts=end)
        end = _run(t, "failed", base, 3)
        t.finished("failed", ts=end, reason="error", error=ValueError("model diverged"))
        t.queued("never-scheduled", ts=base)
        t.finished("never-scheduled", ts=base + 0.5, reason="abort")
        end = _run(t, "remote-parent", base, 4, carrier=_remote(0xABC, 0xDEF, True))
        t.finished("remote-parent", ts=end)
        end = _run(t, "remote-unsampled", base, 4, carrier=_remote(0x123, 0x456, False))
        t.finished("remote-unsampled", ts=end)
        local = NonRecordingSpan(SpanContext(0x777, 0x888, is_remote=False, trace_flags=TraceFlags(1)))
        token = otel_context.attach(trace.set_span_in_context(local))
        try:
            end = _run(t, "local-parent", base, 4)
        finally:
            otel_context.detach(token)
        t.finished("local-parent", ts=end)
        t.queued("asked-early", ts=base)
        assert t.traceparent("asked-early") is not None
        t.scheduled(["asked-early"], ts=base + STEP)
        t.tokens(["asked-early"], ts=base + 2 * STEP)
        t.finished("asked-early", ts=base + 3 * STEP)

    tail = make(tail_sampling=TailSampling(ratio=0.3, e2e_s=0.3))
    for k in range(12):
        end = _run(tail, f"tail-{k}", 200.0, 2 + 3 * k, (1,) if k % 4 == 0 else ())
        tail.finished(f"tail-{k}", ts=end)

    def hook(span: Any, fin: Any) -> None:
        span.set_attribute("tenant", "green")
        span.add_event("user.note", {"k": 1}, timestamp=OFFSET_NS + 1)

    hooked = make(span_hook=hook)
    end = _run(hooked, "hooked", 300.0, 6, (3,))
    hooked.finished("hooked", ts=end, reason="error", error="timeout")

    prefill = make(role="prefill", tail_sampling=False)
    decode = make(role="decode", tail_sampling=False)
    for k, remote in enumerate((None, _remote(0x99, 0x77, True))):
        rid = f"handed-{k}"
        prefill.queued(rid, ts=400.0, prompt_tokens=9, carrier=remote)
        prefill.scheduled([rid], ts=400.01)
        prefill.tokens([rid], ts=400.05)
        carrier = prefill.handoff_carrier(rid)
        assert carrier is not None
        prefill.kv_sent(rid, ts=400.07, num_bytes=4096)
        decode.queued(rid, ts=400.08, carrier=carrier)
        decode.kv_received(rid, ts=400.09, num_bytes=4096)
        decode.scheduled([rid], ts=400.1)
        for s in range(6):
            decode.tokens([rid], ts=400.11 + s * STEP)
            if s == 2:
                decode.preempted([rid], ts=400.135)
                decode.scheduled([rid], ts=400.14)
        decode.finished(rid, ts=400.2)

    small = make(max_in_flight=2)
    for k in range(3):
        small.queued(f"evictable-{k}", ts=500.0 + k)
    small.finished("evictable-2", ts=510.0)


def fields(span: ReadableSpan) -> dict[str, Any]:
    def ctx(c: SpanContext | None) -> Any:
        if c is None:
            return None
        return (c.trace_id, c.span_id, int(c.trace_flags), tuple(c.trace_state.items()), c.is_remote)

    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "context": ctx(span.context),
        "parent": ctx(span.parent),
        "kind": span.kind,
        "start": span.start_time,
        "end": span.end_time,
        "attributes": list(span.attributes.items()),
        "dropped_attributes": span.dropped_attributes,
        "events": [
            (e.name, e.timestamp, list((e.attributes or {}).items()), getattr(e, "dropped_attributes", 0))
            for e in span.events
        ],
        "dropped_events": span.dropped_events,
        "links": [(ctx(link.context), list((link.attributes or {}).items())) for link in span.links],
        "dropped_links": span.dropped_links,
        "status": (span.status.status_code, span.status.description),
        "resource": (dict(span.resource.attributes), span.resource.schema_url),
        "scope": (
            scope.name,
            scope.version,
            scope.schema_url,
            dict(getattr(scope, "attributes", None) or {}),
        ),
    }


def _exported(setup: dict[str, Any], watched: bool) -> tuple[list[dict[str, Any]], list[RequestTracker], Any]:
    tp, exporter, watcher = provider(setup, watched)
    trackers: list[RequestTracker] = []

    def make(**kwargs: Any) -> RequestTracker:
        kwargs.setdefault("tail_sampling", False)
        tracker = RequestTracker(tracer_provider=tp, meter_provider=None, model="paths-model", **kwargs)
        # One offset for both paths: the tracker's clock and the one its records carry.
        tracker.clock.offset_ns = tracker.info.clock_offset_ns = OFFSET_NS
        trackers.append(tracker)
        return tracker

    workload(make)
    return [fields(s) for s in exporter.get_finished_spans()], trackers, watcher


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_the_direct_path_and_the_tracer_path_export_the_same_spans(name: str) -> None:
    setup = SETUPS[name]
    direct, direct_trackers, _ = _exported(setup, watched=False)
    through_tracer, tracer_trackers, watcher = _exported(setup, watched=True)

    # Each provider took the path it was meant to: spans started through the tracer only where a
    # processor wants on_start; the other provider's spans never went through start_span().
    assert watcher.started == len(through_tracer)
    assert all(
        t._consumer._spans._direct is not None and t._consumer._spans._direct.ready() for t in direct_trackers
    )
    assert not any(
        t._consumer._spans._direct is not None and t._consumer._spans._direct.ready() for t in tracer_trackers
    )

    assert len(direct) > 60
    names = {s["name"] for s in direct}
    every = setup["sampler"] is SETUPS["parent-based always-on, default limits"]["sampler"]
    assert not every or names >= {
        sc.SPAN_REQUEST,
        sc.SPAN_ADMISSION,
        sc.SPAN_QUEUE,
        sc.SPAN_PREFILL,
        sc.SPAN_DECODE,
        sc.SPAN_PREEMPTED,
        sc.SPAN_RECOMPUTE,
        sc.SPAN_ENGINE_STEP,
        sc.SPAN_INSTANCE_PREFILL,
        sc.SPAN_INSTANCE_DECODE,
        sc.SPAN_KV_TRANSFER,
    }
    assert [s["name"] for s in direct] == [s["name"] for s in through_tracer]
    for k, (ours, theirs) in enumerate(zip(direct, through_tracer, strict=True)):
        for field in ours:
            assert ours[field] == theirs[field], (k, ours["name"], field, ours[field], theirs[field])


def test_a_processor_added_later_that_needs_on_start_moves_spans_to_the_tracer(caplog: Any) -> None:
    """The processors are looked at again when one is added: a late on_start processor still sees
    every span start, and a warning says why spans now take the slower path."""

    class LateWatcher(StartWatcher):
        pass

    tp, exporter, _ = provider(SETUPS["parent-based always-on, default limits"], watched=False)
    tracker = RequestTracker(tracer_provider=tp, meter_provider=None, tail_sampling=False)
    tracker.finished("none", ts=_run(tracker, "none", 1.0, 0))  # unknown id: an anomaly, no spans
    tracker.finished("first", ts=_run(tracker, "first", 1.0, 3))
    before = len(exporter.get_finished_spans())
    watcher = LateWatcher()
    with caplog.at_level("WARNING", logger="otel_llm"):
        tp.add_span_processor(watcher)
        tracker.finished("second", ts=_run(tracker, "second", 2.0, 3))
    assert before > 0 and watcher.started == len(exporter.get_finished_spans()) - before > 0
    assert any("on_start" in r.getMessage() and "LateWatcher" in r.getMessage() for r in caplog.records)


class NamingSampler(Sampler):
    """A user's sampler that decides each span by its name and tags it: only the tracer can ask it."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any) -> Any:
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampled.as": name})

    def get_description(self) -> str:
        return "NamingSampler"


def test_a_sampler_of_the_users_own_is_asked_for_every_span(caplog: Any) -> None:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=NamingSampler())
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    with caplog.at_level("WARNING", logger="otel_llm"):
        tracker = RequestTracker(tracer_provider=tp, meter_provider=None, tail_sampling=False)
        tracker.finished("r", ts=_run(tracker, "r", 1.0, 3, (1,)))
    spans = exporter.get_finished_spans()
    assert len(spans) == 6
    assert all(s.attributes["sampled.as"] == s.name for s in spans)
    assert any("NamingSampler" in r.getMessage() for r in caplog.records)


def test_an_sdk_laid_out_otherwise_keeps_the_tracer_path_and_says_so(caplog: Any, monkeypatch: Any) -> None:
    """A fake of a future SDK (no other can run here): reading the tracer's internals fails as it would
    if one had moved. Spans still go out, through start_span(), after one warning."""
    from otel_llm.emit import sdk_spans

    def moved(self: Any, tracer: Any, *args: Any) -> None:
        raise AttributeError("'Tracer' object has no attribute '_span_limits'")

    monkeypatch.setattr(sdk_spans.SdkSpans, "__init__", moved)
    tp, exporter, _ = provider(SETUPS["parent-based always-on, default limits"], watched=False)
    with caplog.at_level("WARNING", logger="otel_llm"):
        tracker = RequestTracker(tracer_provider=tp, meter_provider=None, tail_sampling=False)
        tracker.finished("r", ts=_run(tracker, "r", 1.0, 3))
    assert tracker._consumer._spans._direct is None
    assert any("laid out otherwise" in r.getMessage() for r in caplog.records)
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["llm.decode", "llm.prefill", "llm.queue", "llm.request"]
