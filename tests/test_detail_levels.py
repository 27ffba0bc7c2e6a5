"""Each trace detail level gives the span set docs/telemetry.md documents, for a scenario with a preemption in
decode: ``request`` only llm.request (same attributes and events), ``phases`` the lifecycle tree,
``steps`` that tree plus at most MAX_STEP_SPANS llm.engine.step spans, the longest steps, inside the
phase each belongs to."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.hooks.steps import ENV_TRACE_DETAIL
from otel_llm.record import MAX_STEP_SPANS

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

PHASE_SET = Counter(
    {
        sc.SPAN_REQUEST: 1,
        sc.SPAN_QUEUE: 1,
        sc.SPAN_PREFILL: 1,
        sc.SPAN_DECODE: 1,
        sc.SPAN_PREEMPTED: 1,
        sc.SPAN_RECOMPUTE: 1,
    }
)


def scenario(tracker: Any, steps: int = 6, slow: tuple[int, ...] = ()) -> list[float]:
    """r1 queued at 1.0, scheduled at 1.1 with 2 cached tokens, one token per step (10 ms, 50 ms for the
    steps in ``slow``), preempted after the 3rd token and rescheduled 100 ms later. Returns the tokens
    events' timestamps."""
    tracker.queued("r1", ts=1.0, prompt_tokens=9)
    tracker.queued("other", ts=1.0)  # shares every other step with r1, never finishes here
    tracker.scheduled(["r1"], ts=1.1, cached_tokens=[2])
    tracker.scheduled(["other"], ts=1.1)
    ts, stamps = 1.1, []
    for i in range(steps):
        ts += 0.05 if i in slow else 0.01
        tracker.tokens(["r1", "other"] if i % 2 else ["r1"], ts=ts)
        tracker.engine_state(step_tokens=9 if i == 0 else 1, kv_cache_usage=0.25)
        stamps.append(ts)
        if i == 2:
            tracker.preempted(["r1"], ts=ts + 0.001)
            ts += 0.1
            tracker.scheduled(["r1"], ts=ts)
    tracker.finished("r1", ts=ts + 0.001)
    return stamps


def spans_by_name(h: Any) -> Counter[str]:
    return Counter(s.name for s in h.finished_spans())


def test_request_level_is_one_span_with_the_latency_attributes_and_events(make_harness) -> None:
    phases = make_harness(trace_detail="phases")
    request = make_harness(trace_detail="request")
    scenario(phases.tracker)
    scenario(request.tracker)

    assert spans_by_name(request) == Counter({sc.SPAN_REQUEST: 1})
    (root,) = request.roots()
    (full,) = phases.roots()
    assert dict(root.attributes) == dict(full.attributes)
    assert root.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 2
    assert sc.LLM_LATENCY_TTFT in root.attributes and sc.LLM_LATENCY_E2E in root.attributes

    # Each tracker has its own monotonic-to-wall offset: compare event times from the span's start.
    def events(span: Any) -> list[tuple[str, int]]:
        return [(e.name, e.timestamp - span.start_time) for e in span.events]

    assert events(root) == events(full) and len(events(root)) == 5


def test_phases_level_is_the_lifecycle_tree(make_harness) -> None:
    h = make_harness(trace_detail="phases")
    scenario(h.tracker)
    assert spans_by_name(h) == PHASE_SET


def test_steps_level_adds_the_steps_the_request_ran_in_under_their_phase(make_harness) -> None:
    h = make_harness(trace_detail="steps")
    stamps = scenario(h.tracker)

    trace = h.trace("r1", 1.0)
    # The request's trace; the engine's own steps are in a trace of their own (tests/test_engine_steps.py).
    assert Counter(s.name for s in trace.spans) == PHASE_SET + Counter({sc.SPAN_ENGINE_STEP: len(stamps)})
    prefill = trace.child(trace.root, sc.SPAN_PREFILL)
    decode = trace.child(trace.root, sc.SPAN_DECODE)
    in_prefill = trace.children(prefill, sc.SPAN_ENGINE_STEP)
    in_decode = trace.children(decode, sc.SPAN_ENGINE_STEP)
    assert len(in_prefill) == 1 and len(in_decode) == len(stamps) - 1
    # The first step runs from the first scheduling to the first token; each later one from the
    # previous step, except the first after the preemption, which starts at the rescheduling.
    trace.assert_interval(in_prefill[0], 1.1, stamps[0])
    trace.assert_interval(in_decode[0], stamps[0], stamps[1])
    trace.assert_interval(in_decode[2], stamps[2] + 0.1, stamps[3])
    assert in_prefill[0].attributes[sc.LLM_STEP_TOKENS] == 9
    assert in_prefill[0].attributes[sc.LLM_STEP_KV_CACHE_USAGE] == 0.25
    assert [s.attributes[sc.LLM_STEP_BATCH_SIZE] for s in in_prefill + in_decode] == [1, 2, 1, 2, 1, 2]
    assert trace.root.attributes[sc.LLM_STEPS] == len(stamps)
    assert trace.root.attributes[sc.LLM_STEPS_UNSPANNED] == 0


def test_steps_level_keeps_only_the_longest_steps_past_the_cap(make_harness) -> None:
    h = make_harness(trace_detail="steps")
    total, slow = MAX_STEP_SPANS + 14, (5, 11, 23)
    scenario(h.tracker, steps=total, slow=slow)

    trace = h.trace("r1", 1.0)
    steps = [s for s in trace.spans if s.name == sc.SPAN_ENGINE_STEP]
    assert len(steps) == MAX_STEP_SPANS
    root = trace.root
    assert root.attributes[sc.LLM_STEPS] == total
    assert root.attributes[sc.LLM_STEPS_UNSPANNED] == total - MAX_STEP_SPANS
    indices = {s.attributes[sc.LLM_STEP_INDEX] for s in steps}
    assert {5, 11, 23} <= indices  # the 50 ms steps are among the kept


def test_detail_level_from_the_environment(monkeypatch: pytest.MonkeyPatch, make_harness) -> None:
    monkeypatch.setenv(ENV_TRACE_DETAIL, "request")
    h = make_harness()
    scenario(h.tracker)
    assert spans_by_name(h) == Counter({sc.SPAN_REQUEST: 1})
    monkeypatch.setenv(ENV_TRACE_DETAIL, "everything")
    with pytest.raises(ValueError, match=ENV_TRACE_DETAIL):
        RequestTracker()
    with pytest.raises(ValueError, match="request, phases, steps"):
        RequestTracker(trace_detail="spans")
