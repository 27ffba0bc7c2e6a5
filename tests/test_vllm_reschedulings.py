"""The vLLM adapter's recompute figures and prompt tokens by source, without vLLM.

Plain objects with vLLM 0.33's field names stand in for its ``SchedulerOutput``, ``Request``,
``EngineCoreOutput`` and ``PrefillStats`` (tests/vllm drives the real ones and compares with vLLM's own
numbers); the tracker, its providers and the SDK reader are real. Expected figures come from the
stand-ins' numbers.
"""

from __future__ import annotations

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
from otel_llm.integrations.vllm import rescheduling
from otel_llm.integrations.vllm.adapter import VLLMAdapter
from otel_llm.integrations.vllm.rescheduling import Reschedulings

PROMPT = 40


def event(name: str, ts: float) -> SimpleNamespace:
    return SimpleNamespace(type=SimpleNamespace(name=name), timestamp=ts)


def output(rid: str, tokens: int, events: list[Any] | None = None, **fields: Any) -> SimpleNamespace:
    out = {"request_id": rid, "new_token_ids": [7] * tokens, "events": events, "finish_reason": None}
    out.setdefault("prefill_stats", None)
    out.update(fields)
    return SimpleNamespace(**out)


def prefill_stats(computed: int, local: int, external: int) -> SimpleNamespace:
    return SimpleNamespace(
        num_prompt_tokens=computed + local + external,
        num_computed_tokens=computed,
        num_cached_tokens=local + external,
        num_local_cached_tokens=local,
        num_external_cached_tokens=external,
    )


class Scheduler:
    """vLLM's scheduler as the rescheduling record reads it: its requests, each with its events."""

    def __init__(self) -> None:
        self.requests: dict[str, SimpleNamespace] = {}

    def resume(self, rid: str, ts: float, preemptions: int = 1) -> None:
        request = self.requests.setdefault(rid, SimpleNamespace(events=[], num_preemptions=0))
        request.num_preemptions = preemptions
        request.events.append(event("SCHEDULED", ts))


def v1_output(resumed: dict[str, int], running: dict[str, int] | None = None) -> SimpleNamespace:
    """A SchedulerOutput of the V1 model runner's path: resumed requests among the cached ones."""
    cached = {**(running or {}), **resumed}
    return SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(cached), resumed_req_ids=set(resumed), num_computed_tokens=list(cached.values())
        ),
    )


def v2_output(new: dict[str, int]) -> SimpleNamespace:
    """The V2 model runner's path: resumed requests among the new ones."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=n) for r, n in new.items()],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
    )


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


def added(adapter: VLLMAdapter, rid: str) -> None:
    adapter.request_added(
        SimpleNamespace(request_id=rid, arrival_time=time.time(), prompt_token_ids=[1] * PROMPT)
    )


def recompute_figures(spans: InMemorySpanExporter) -> list[tuple[int | None, int | None]]:
    found = sorted(
        (s for s in spans.get_finished_spans() if s.name == sc.SPAN_RECOMPUTE), key=lambda s: s.start_time
    )
    return [
        (s.attributes.get(sc.LLM_RECOMPUTE_CACHED_TOKENS), s.attributes.get(sc.LLM_RECOMPUTE_TOKENS))
        for s in found
    ]


def test_a_rescheduling_gets_what_the_scheduler_found_cached(
    tracker: RequestTracker, spans: InMemorySpanExporter
) -> None:
    figures = Reschedulings()
    adapter = VLLMAdapter(lambda *_: tracker, reschedulings=figures)
    scheduler = Scheduler()
    added(adapter, "r")
    t = time.monotonic()
    # First output: QUEUED, S1 with 16 prompt tokens cached, P1 and R1 before any token (a preemption
    # in prefill), then the first token.
    scheduler.resume("r", t + 0.03)
    figures.record(scheduler, v1_output({"r": 32}, running={"other": 5}))
    first = output(
        "r",
        1,
        [
            event("QUEUED", t),
            event("SCHEDULED", t + 0.01),
            event("PREEMPTED", t + 0.02),
            event("SCHEDULED", t + 0.03),
        ],
        prefill_stats=prefill_stats(24, 16, 0),
    )
    adapter.outputs([first], t + 0.04)
    for k in range(4):
        adapter.outputs([output("r", 1)], t + 0.05 + k * 0.01)
    # After 5 tokens: preempted again, rescheduled on the V2 runner's path with 8 cached.
    scheduler.resume("r", t + 0.2, preemptions=2)
    figures.record(scheduler, v2_output({"r": 8}))
    adapter.outputs([output("r", 1, [event("PREEMPTED", t + 0.1), event("SCHEDULED", t + 0.2)])], t + 0.21)
    adapter.settle([output("r", 0, finish_reason=SimpleNamespace(name="LENGTH"))], still_open=())
    assert recompute_figures(spans) == [(32, PROMPT - 32), (8, PROMPT + 5 - 8)]
    (root,) = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    assert root.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 16  # the first scheduling's
    assert len(figures) == 0  # both taken


def test_without_the_scheduler_reschedulings_carry_no_figures(
    tracker: RequestTracker, spans: InMemorySpanExporter
) -> None:
    """The engine core in another process: nothing recorded. An older vLLM repeating its first
    scheduling's num_cached_tokens on every output must not pass for a rescheduling's figure."""
    adapter = VLLMAdapter(lambda *_: tracker, reschedulings=Reschedulings())
    added(adapter, "r")
    t = time.monotonic()
    adapter.outputs(
        [output("r", 1, [event("QUEUED", t), event("SCHEDULED", t + 0.01)], num_cached_tokens=16)], t + 0.02
    )
    adapter.outputs(
        [output("r", 1, [event("PREEMPTED", t + 0.03), event("SCHEDULED", t + 0.04)], num_cached_tokens=16)],
        t + 0.05,
    )
    adapter.settle([output("r", 0, finish_reason=SimpleNamespace(name="STOP"))], still_open=())
    assert recompute_figures(spans) == [(None, None)]
    (root,) = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    assert root.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 16


def test_prompt_tokens_by_source_are_vllms_split_of_the_steps_first_outputs(
    tracker: RequestTracker, capture: MetricCapture
) -> None:
    adapter = VLLMAdapter(lambda *_: tracker)
    t = time.monotonic()
    for rid in ("a", "b", "c"):
        added(adapter, rid)
    adapter.outputs(
        [
            output(
                "a", 1, [event("QUEUED", t), event("SCHEDULED", t)], prefill_stats=prefill_stats(24, 16, 0)
            ),
            output(
                "b", 1, [event("QUEUED", t), event("SCHEDULED", t)], prefill_stats=prefill_stats(1, 0, 39)
            ),
        ],
        t + 0.01,
    )
    adapter.engine_stats(None)
    adapter.outputs(
        [
            output("a", 1),  # not a first output: no prefill_stats, nothing counted
            output(
                "c", 1, [event("QUEUED", t), event("SCHEDULED", t)], prefill_stats=prefill_stats(8, 32, 0)
            ),
        ],
        t + 0.02,
    )
    adapter.engine_stats(None)
    by_source = {
        p.attributes[sc.LLM_PROMPT_TOKENS_SOURCE]: p.value for p in capture.points(sc.METRIC_PROMPT_TOKENS)
    }
    assert by_source == {
        sc.PROMPT_SOURCE_COMPUTED: 24 + 1 + 8,
        sc.PROMPT_SOURCE_PREFIX_CACHE: 16 + 0 + 32,
        sc.PROMPT_SOURCE_KV_TRANSFER: 0 + 39 + 0,
    }


def test_a_vllm_without_the_split_reports_no_prompt_sources(
    tracker: RequestTracker, capture: MetricCapture
) -> None:
    adapter = VLLMAdapter(lambda *_: tracker)
    added(adapter, "a")
    t = time.monotonic()
    old = SimpleNamespace(num_prompt_tokens=PROMPT, num_cached_tokens=16, num_computed_tokens=PROMPT - 16)
    adapter.outputs([output("a", 1, [event("QUEUED", t), event("SCHEDULED", t)], prefill_stats=old)], t)
    adapter.engine_stats(None)
    assert capture.points(sc.METRIC_PROMPT_TOKENS) == []


def test_the_record_keeps_only_resumed_requests_with_a_scheduled_event() -> None:
    scheduler = Scheduler()
    scheduler.resume("v1", 5.0)
    scheduler.resume("v2", 5.0)
    scheduler.requests["fresh"] = SimpleNamespace(events=[event("SCHEDULED", 5.0)], num_preemptions=0)
    scheduler.requests["quiet"] = SimpleNamespace(events=[], num_preemptions=1)  # stats logging off
    figures = Reschedulings()
    figures.record(scheduler, v1_output({"v1": 12, "quiet": 3}, running={"running": 7}))
    figures.record(scheduler, v2_output({"v2": 20, "fresh": 0}))
    assert len(figures) == 2
    assert figures.take("v1", 4.0) is None  # another rescheduling's timestamp
    assert figures.take("v1", 5.0) == 12
    assert figures.take("v1", 5.0) is None  # taken once
    figures.forget("v2")
    assert figures.take("v2", 5.0) is None and len(figures) == 0


def test_the_record_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rescheduling, "MAX_REQUESTS", 3)
    scheduler = Scheduler()
    figures = Reschedulings()
    for k in range(5):
        scheduler.resume(f"r{k}", float(k))
        figures.record(scheduler, v1_output({f"r{k}": k}))
    assert len(figures) == 3
    assert figures.take("r0", 0.0) is None and figures.take("r4", 4.0) == 4
