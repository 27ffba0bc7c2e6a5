"""The engine's own steps as spans (trace detail ``steps``, docs/telemetry.md "Engine steps"): a trace per
engine and window of time, each step linked to the requests in it and each request's step span linked
back, in both export modes.

The engine story is told with explicit timestamps; what each step held is the test's own bookkeeping of
what it fed the tracker, not read back from the code under test.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.hooks.step_windows import MAX_STEP_LINKS, STEP_SPANS_PER_WINDOW, STEP_WINDOW_S

pytestmark = pytest.mark.both_modes

T0 = 500.0


def run(
    t: Any, steps: int, step_s: float, report_batches: bool = False, slow: frozenset[int] = frozenset()
) -> dict[int, set[str]]:
    """``a`` and ``b`` decode from T0 while ``c`` prefills its prompt in three 64-token chunks (steps 0
    to 2, batch() says so when ``report_batches``), then decodes with them. Returns, per step index, the
    requests the step held; all three finish after the last step. Steps in ``slow`` take 3 ``step_s``."""
    for rid in ("a", "b", "c"):
        t.queued(rid, ts=T0, prompt_tokens=192)
    t.scheduled(["a", "b", "c"], ts=T0)
    held: dict[int, set[str]] = {}
    ts = T0
    for i in range(steps):
        chunk = i < 3
        if report_batches:
            t.batch({"a": 1, "b": 1, "c": 64 if chunk else 1}, ts=ts)
        ts += 3 * step_s if i in slow else step_s
        producing = ["a", "b"] if chunk else ["a", "b", "c"]
        t.tokens(producing, ts=ts)
        # Requests producing a token are linked always; c's chunks only when batch() told of them.
        held[i] = set(producing) | ({"c"} if chunk and report_batches else set())
    for rid in ("a", "b", "c"):
        t.finished(rid, ts=ts + 0.001)
    return held


def spans_of(h: Any) -> list[Any]:
    assert h.tracker.force_flush(), "the tracker's flush did not finish"
    return h.finished_spans()


def by_id(spans: list[Any]) -> dict[tuple[int, int], Any]:
    return {(s.context.trace_id, s.context.span_id): s for s in spans}


def engine_steps(spans: list[Any]) -> list[Any]:
    windows = {s.context.trace_id for s in spans if s.name == sc.SPAN_ENGINE_WINDOW}
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and s.context.trace_id in windows]
    return sorted(steps, key=lambda s: s.attributes[sc.LLM_STEP_INDEX])


def test_each_step_links_to_every_request_in_it_and_back(make_harness) -> None:
    h = make_harness(trace_detail="steps")
    held = run(h.tracker, steps=12, step_s=0.01, report_batches=True)
    spans = spans_of(h)
    ids = by_id(spans)

    (window,) = [s for s in spans if s.name == sc.SPAN_ENGINE_WINDOW]
    assert window.parent is None
    assert window.attributes[sc.LLM_STEPS] == 12 and window.attributes[sc.LLM_STEPS_UNSPANNED] == 0
    steps = engine_steps(spans)
    assert [s.attributes[sc.LLM_STEP_INDEX] for s in steps] == list(range(12))
    requests = {
        s.context.span_id: s.attributes[sc.LLM_REQUEST_ID] for s in spans if s.name == sc.SPAN_REQUEST
    }
    for step in steps:
        assert step.parent.span_id == window.context.span_id
        linked = {requests[link.context.span_id] for link in step.links}
        assert linked == held[step.attributes[sc.LLM_STEP_INDEX]]
        # The step's span runs from its batch() call to its tokens event: 10 ms.
        assert abs(step.end_time - step.start_time - 10_000_000) <= 1_000
    # What the engine said each step computed: c's chunks in the first three.
    assert [s.attributes[sc.LLM_STEP_PREFILL_TOKENS] for s in steps] == [64] * 3 + [0] * 9
    assert [s.attributes[sc.LLM_STEP_DECODE_TOKENS] for s in steps] == [2] * 3 + [3] * 9

    # Back: each request's own step spans link to the engine's span of the same step.
    engine_by_index = {s.attributes[sc.LLM_STEP_INDEX]: s for s in steps}
    own = [
        s for s in spans if s.name == sc.SPAN_ENGINE_STEP and s.context.trace_id != window.context.trace_id
    ]
    assert len(own) == 3 * 12  # each ran in all 12 (c in the first three prefilling)
    for span in own:
        (link,) = span.links
        target = ids[(link.context.trace_id, link.context.span_id)]
        assert target is engine_by_index[span.attributes[sc.LLM_STEP_INDEX]]
        # The same tokens event ends both; a request's first step starts at its scheduling instead.
        assert span.end_time == target.end_time and span.start_time >= target.start_time


def test_windows_close_by_time_and_bound_their_spans(make_harness) -> None:
    h = make_harness(trace_detail="steps")
    # 2.5 windows of steps, at a pace that gives each window more steps than it spans.
    step_s = STEP_WINDOW_S / (STEP_SPANS_PER_WINDOW + 72)
    steps = int(2.5 * (STEP_SPANS_PER_WINDOW + 72))
    # The requests' longest steps, so their own step spans, are past the first window's bound.
    slow = frozenset(range(STEP_SPANS_PER_WINDOW + 10, STEP_SPANS_PER_WINDOW + 14))
    run(h.tracker, steps=steps, step_s=step_s, slow=slow)
    spans = spans_of(h)
    ids = by_id(spans)

    windows = sorted((s for s in spans if s.name == sc.SPAN_ENGINE_WINDOW), key=lambda s: s.start_time)
    assert len(windows) == 3  # two closed by time, the third by the flush
    counts = [w.attributes[sc.LLM_STEPS] for w in windows]
    assert sum(counts) == steps
    for w in windows:
        spanned = [
            s for s in spans if s.context.trace_id == w.context.trace_id and s.name == sc.SPAN_ENGINE_STEP
        ]
        assert len(spanned) == min(w.attributes[sc.LLM_STEPS], STEP_SPANS_PER_WINDOW)
        assert w.attributes[sc.LLM_STEPS_UNSPANNED] == w.attributes[sc.LLM_STEPS] - len(spanned)
        # Its tokens events within STEP_WINDOW_S of its first; its first step began one step earlier.
        assert w.end_time - w.start_time <= (STEP_WINDOW_S + step_s) * 1e9 + 1_000
        # Windows take the steps in order: each spans its first steps.
        first = min(s.attributes[sc.LLM_STEP_INDEX] for s in spanned)
        assert sorted(s.attributes[sc.LLM_STEP_INDEX] for s in spanned) == list(
            range(first, first + len(spanned))
        )
    assert counts[0] > STEP_SPANS_PER_WINDOW  # the bound was reached
    # A request's step span links to the engine's span of that step when it got one, and only then.
    in_windows = {w.context.trace_id for w in windows}
    spanned = {
        s.attributes[sc.LLM_STEP_INDEX]: s
        for s in spans
        if s.name == sc.SPAN_ENGINE_STEP and s.context.trace_id in in_windows
    }
    own = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and s.context.trace_id not in in_windows]
    assert slow <= {s.attributes[sc.LLM_STEP_INDEX] for s in own} and not slow & set(spanned)
    for span in own:
        index = span.attributes[sc.LLM_STEP_INDEX]
        if index in spanned:
            (link,) = span.links
            assert ids[(link.context.trace_id, link.context.span_id)] is spanned[index]
        else:
            assert not span.links


def test_without_batches_the_steps_say_what_they_held_from_tokens_alone(make_harness) -> None:
    h = make_harness(trace_detail="steps")
    held = run(h.tracker, steps=6, step_s=0.01)
    steps = engine_steps(spans_of(h))
    assert [len(s.links) for s in steps] == [len(held[i]) for i in range(6)] == [2, 2, 2, 3, 3, 3]
    assert sc.LLM_STEP_PREFILL_TOKENS not in steps[0].attributes


@pytest.mark.parametrize("detail", ["phases", "request"])
def test_other_detail_levels_have_no_engine_traces(make_harness, detail: str) -> None:
    h = make_harness(trace_detail=detail)
    run(h.tracker, steps=6, step_s=0.01, report_batches=True)
    names = Counter(s.name for s in spans_of(h))
    assert names[sc.SPAN_ENGINE_WINDOW] == 0 and names[sc.SPAN_ENGINE_STEP] == 0
    assert names[sc.SPAN_REQUEST] == 3


def test_past_the_link_cap_the_prefilling_request_is_still_linked(make_harness) -> None:
    h = make_harness(trace_detail="steps")
    t = h.tracker
    decoding = [f"d{i}" for i in range(MAX_STEP_LINKS + 40)]
    for rid in [*decoding, "long"]:
        t.queued(rid, ts=T0, prompt_tokens=512)
    t.scheduled([*decoding, "long"], ts=T0)
    t.batch({**dict.fromkeys(decoding, 1), "long": 512}, ts=T0)
    t.tokens(decoding, ts=T0 + 0.02)
    for rid in [*decoding, "long"]:
        t.finished(rid, ts=T0 + 0.03)
    spans = spans_of(h)
    (step,) = engine_steps(spans)
    requests = {
        s.context.span_id: s.attributes[sc.LLM_REQUEST_ID] for s in spans if s.name == sc.SPAN_REQUEST
    }
    linked = [requests[link.context.span_id] for link in step.links]
    assert len(linked) == MAX_STEP_LINKS == len(set(linked))
    assert "long" in linked and set(linked) - {"long"} <= set(decoding)
