"""The vLLM adapter's engine state: ``SchedulerStats`` in, one ``engine_state()`` per step out.

vLLM is not needed here: the adapter reads vLLM's outputs and stats by attribute name, so plain objects
with vLLM 0.33's field names stand in for them (the vLLM tiers in tests/vllm feed the real ones and
compare with vLLM's own numbers). The tracker, its metrics and the SDK reader are real.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
from metric_capture import MetricCapture
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.integrations.vllm.adapter import VLLMAdapter
from otel_llm.integrations.vllm.engine_state import state_of


def stats(**fields: Any) -> SimpleNamespace:
    """A stand-in for vLLM's SchedulerStats of one step (its defaults, then ``fields``)."""
    base: dict[str, Any] = {
        "num_running_reqs": 0,
        "num_waiting_reqs": 0,
        "num_skipped_waiting_reqs": 0,
        "kv_cache_usage": 0.0,
        "prefix_cache_stats": SimpleNamespace(reset=False, requests=0, queries=0, hits=0),
        "spec_decoding_stats": None,
    }
    base.update(fields)
    return SimpleNamespace(**base)


def prefix(queries: int, hits: int, reset: bool = False) -> SimpleNamespace:
    return SimpleNamespace(reset=reset, requests=1, queries=queries, hits=hits)


def event(name: str, ts: float) -> SimpleNamespace:
    return SimpleNamespace(type=SimpleNamespace(name=name), timestamp=ts)


def output(rid: str, tokens: int, events: list[Any] | None = None, prefill: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid, new_token_ids=[7] * tokens, events=events, prefill_stats=prefill, finish_reason=None
    )


def first_output(rid: str, prompt: int, cached: int) -> SimpleNamespace:
    """A request's first output: QUEUED and SCHEDULED events, its prefill figures, one token."""
    now = time.monotonic()
    prefill = SimpleNamespace(
        num_prompt_tokens=prompt, num_cached_tokens=cached, num_computed_tokens=prompt - cached
    )
    return output(rid, 1, [event("QUEUED", now - 0.02), event("SCHEDULED", now - 0.01)], prefill)


@pytest.fixture
def capture() -> MetricCapture:
    return MetricCapture()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracker(capture: MetricCapture, spans: InMemorySpanExporter) -> RequestTracker:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return RequestTracker(tracer_provider=provider, meter_provider=capture.meter_provider)


def added(adapter: VLLMAdapter, *rids: str, prompt: int = 100) -> None:
    for rid in rids:
        adapter.request_added(
            SimpleNamespace(request_id=rid, arrival_time=time.time(), prompt_token_ids=[1] * prompt)
        )


def value(capture: MetricCapture, name: str, **attrs: Any) -> float | None:
    found = [p for p in capture.points(name) if all(p.attributes.get(k) == v for k, v in attrs.items())]
    return found[0].value if found else None


def test_one_step_reports_vllms_numbers(tracker: RequestTracker, capture: MetricCapture) -> None:
    adapter = VLLMAdapter(lambda model, operation: tracker)
    added(adapter, "a", "b")
    # Step 1: both requests' first outputs; "b" found 64 of its 100 prompt tokens cached.
    adapter.outputs([first_output("a", 100, 0), first_output("b", 100, 64)], time.monotonic(), {"a", "b"})
    adapter.engine_stats(
        stats(
            num_running_reqs=2,
            num_waiting_reqs=3,
            num_skipped_waiting_reqs=1,
            kv_cache_usage=0.25,
            prefix_cache_stats=prefix(200, 64),
        )
    )
    assert value(capture, sc.METRIC_KV_CACHE_USAGE) == 0.25
    assert value(capture, sc.METRIC_SCHEDULER_REQUESTS, **{sc.LLM_REQUEST_STATE: "running"}) == 2
    assert value(capture, sc.METRIC_SCHEDULER_REQUESTS, **{sc.LLM_REQUEST_STATE: "waiting"}) == 4
    assert value(capture, sc.METRIC_PREFIX_CACHE_QUERIES) == 200
    assert value(capture, sc.METRIC_PREFIX_CACHE_HITS) == 64
    (step,) = capture.points(sc.METRIC_STEP_TOKENS)
    assert (step.count, step.sum) == (1, (1 + 100) + (1 + 36))  # new tokens + prompt tokens computed


def test_cached_tokens_reach_the_request_span(tracker: RequestTracker, spans: InMemorySpanExporter) -> None:
    adapter = VLLMAdapter(lambda model, operation: tracker)
    added(adapter, "b")
    adapter.outputs([first_output("b", 100, 64)], time.monotonic(), {"b"})
    tracker.finished("b", reason="stop")
    (root,) = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    assert root.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 64


def test_counters_add_up_across_steps_and_a_reset_flag_does_not_undo_them(
    tracker: RequestTracker, capture: MetricCapture
) -> None:
    adapter = VLLMAdapter(lambda model, operation: tracker)
    added(adapter, "a")
    adapter.engine_stats(stats(prefix_cache_stats=prefix(100, 0)))
    # Someone called reset_prefix_cache: the lookups of this step still happened, they count.
    adapter.engine_stats(stats(prefix_cache_stats=prefix(50, 10, reset=True)))
    adapter.engine_stats(
        stats(spec_decoding_stats=SimpleNamespace(num_drafts=3, num_draft_tokens=6, num_accepted_tokens=4))
    )
    assert value(capture, sc.METRIC_PREFIX_CACHE_QUERIES) == 150
    assert value(capture, sc.METRIC_PREFIX_CACHE_HITS) == 10
    assert value(capture, sc.METRIC_SPEC_DRAFT_TOKENS) == 6
    assert value(capture, sc.METRIC_SPEC_ACCEPTED_TOKENS) == 4


def test_a_step_split_into_batches_is_one_report(tracker: RequestTracker, capture: MetricCapture) -> None:
    """AsyncLLM processes a large step's outputs in chunks, then hands over the step's stats once."""
    adapter = VLLMAdapter(lambda model, operation: tracker)
    added(adapter, "a", "b")
    ts = time.monotonic()
    adapter.outputs([first_output("a", 10, 0)], ts, {"a", "b"})
    adapter.outputs([first_output("b", 10, 0)], ts, {"a", "b"})
    adapter.engine_stats(stats())
    adapter.engine_stats(stats())  # a step without outputs: no tokens-per-step sample, as in vLLM
    (step,) = capture.points(sc.METRIC_STEP_TOKENS)
    assert (step.count, step.sum) == (1, 22)


def test_outputs_of_requests_vllm_dropped_are_not_counted(
    tracker: RequestTracker, capture: MetricCapture
) -> None:
    adapter = VLLMAdapter(lambda model, operation: tracker)
    added(adapter, "a")
    adapter.outputs([first_output("a", 10, 0), output("gone", 5)], time.monotonic(), {"a"})
    adapter.engine_stats(None)  # the engine core sent no stats this step: tokens per step only
    (step,) = capture.points(sc.METRIC_STEP_TOKENS)
    assert step.sum == 11
    assert capture.points(sc.METRIC_KV_CACHE_USAGE) == []


def test_odd_values_are_left_out_and_never_raise(tracker: RequestTracker, capture: MetricCapture) -> None:
    adapter = VLLMAdapter(lambda model, operation: tracker)
    added(adapter, "a")
    odd = stats(
        num_running_reqs=-1,
        num_waiting_reqs=True,
        kv_cache_usage=float("nan"),
        prefix_cache_stats=prefix(10, 11),  # more hits than queries
        spec_decoding_stats=SimpleNamespace(num_draft_tokens="6", num_accepted_tokens=1),
    )
    assert state_of(odd) == {}
    adapter.engine_stats(odd)
    adapter.engine_stats(stats(kv_cache_usage=1.5, num_running_reqs=2))
    assert value(capture, sc.METRIC_KV_CACHE_USAGE) is None
    assert value(capture, sc.METRIC_SCHEDULER_REQUESTS, **{sc.LLM_REQUEST_STATE: "running"}) == 2
    assert state_of(object()) == {}  # a SchedulerStats of another shape: nothing, no error


def test_engine_state_goes_to_one_tracker_the_first_requests(capture: MetricCapture) -> None:
    """Two endpoints, two trackers, one engine: its state is reported once, not once per tracker."""
    trackers = {
        op: RequestTracker(meter_provider=capture.meter_provider, operation_name=op)
        for op in ("chat", "text_completion")
    }
    adapter = VLLMAdapter(lambda model, operation: trackers[operation])
    for rid in ("chatcmpl-1", "cmpl-2"):
        adapter.request_added(SimpleNamespace(request_id=rid, arrival_time=time.time(), prompt_token_ids=[1]))
    assert len(adapter._trackers) == 2
    adapter.engine_stats(stats(prefix_cache_stats=prefix(8, 4)))
    points = capture.points(sc.METRIC_PREFIX_CACHE_QUERIES)
    assert [(p.value, p.attributes[sc.GEN_AI_OPERATION_NAME]) for p in points] == [(8, "chat")]


def test_no_request_yet_means_nothing_to_report_to(caplog: pytest.LogCaptureFixture) -> None:
    adapter = VLLMAdapter(lambda model, operation: pytest.fail("no tracker is needed"))
    with caplog.at_level(logging.WARNING):
        adapter.engine_stats(stats(num_running_reqs=1))
    assert not caplog.records
