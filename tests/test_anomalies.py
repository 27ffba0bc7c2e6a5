"""docs/lifecycle.md, "Odd input": no hook raises, each kind is counted."""

from __future__ import annotations

import math

import pytest

from otel_llm import semconv as sc
from otel_llm.hooks import anomalies as an

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

T0 = 100.0


def anomalies_metric(harness):
    return {p.attributes[sc.LLM_ANOMALY_KIND]: p.value for p in harness.metrics()[sc.METRIC_ANOMALIES]}


def assert_well_formed(harness):
    """No negative duration, children inside their parent."""
    spans = {s.context.span_id: s for s in harness.finished_spans()}
    for s in spans.values():
        assert s.end_time >= s.start_time, s.name
        if s.parent is not None and s.parent.span_id in spans:
            parent = spans[s.parent.span_id]
            assert parent.start_time <= s.start_time and s.end_time <= parent.end_time, (s.name, parent.name)


def test_events_for_unknown_or_finished_requests(harness):
    t = harness.tracker
    t.scheduled(["ghost"])
    t.tokens(["ghost"])
    t.preempted(["ghost"])
    t.finished("ghost")
    t.queued("r")
    t.finished("r")
    t.tokens(["r"])  # after finish
    assert t.anomaly_counts == {an.UNKNOWN_REQUEST: 5}
    assert anomalies_metric(harness) == {an.UNKNOWN_REQUEST: 5}
    assert len(harness.roots()) == 1


def test_second_queued_is_ignored(harness):
    t = harness.tracker
    t.queued("r", ts=T0, prompt_tokens=3)
    t.queued("r", ts=T0 + 1, prompt_tokens=9)
    t.finished("r", ts=T0 + 2)
    root = harness.trace("r", T0).root
    assert root.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert t.anomaly_counts == {an.DUPLICATE_QUEUED: 1}


def test_tokens_before_scheduled_counts_as_scheduled_then(harness):
    t = harness.tracker
    t.queued("r", ts=T0)
    t.tokens(["r"], ts=T0 + 0.5)
    t.finished("r", ts=T0 + 0.6)
    tr = harness.trace("r", T0)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), T0, T0 + 0.5)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_PREFILL), T0 + 0.5, T0 + 0.5)
    assert t.anomaly_counts == {an.TOKENS_BEFORE_SCHEDULED: 1}


def test_tokens_while_preempted_resume_the_request(harness):
    t = harness.tracker
    t.queued("r", ts=T0)
    t.scheduled(["r"], ts=T0 + 0.1)
    t.tokens(["r"], ts=T0 + 0.2)
    t.preempted(["r"], ts=T0 + 0.3)
    t.tokens(["r"], ts=T0 + 0.4)
    t.finished("r", ts=T0 + 0.5)
    tr = harness.trace("r", T0)
    decode = tr.child(tr.root, sc.SPAN_DECODE)
    tr.assert_interval(tr.child(decode, sc.SPAN_PREEMPTED), T0 + 0.3, T0 + 0.4)
    assert t.anomaly_counts == {an.TOKENS_BEFORE_SCHEDULED: 1}


def test_scheduled_while_running_and_preempted_while_not_running(harness):
    t = harness.tracker
    t.queued("r", ts=T0)
    t.preempted(["r"], ts=T0 + 0.05)  # still waiting
    t.scheduled(["r"], ts=T0 + 0.1)
    t.scheduled(["r"], ts=T0 + 0.2)  # already running
    t.tokens(["r"], ts=T0 + 0.3)
    t.finished("r", ts=T0 + 0.4)
    tr = harness.trace("r", T0)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), T0, T0 + 0.1)
    assert tr.root.attributes[sc.LLM_PREEMPTIONS] == 0
    assert t.anomaly_counts == {an.PREEMPTED_WHILE_NOT_RUNNING: 1, an.SCHEDULED_WHILE_RUNNING: 1}


def test_timestamps_going_backwards_are_clamped(harness):
    t = harness.tracker
    t.queued("r", ts=T0)
    t.scheduled(["r"], ts=T0 - 5)  # earlier than queued
    t.tokens(["r"], ts=T0 + 1)
    t.tokens(["r"], ts=T0 + 0.5)  # earlier than the previous token
    t.finished("r", ts=T0 - 1)
    tr = harness.trace("r", T0)
    assert_well_formed(harness)
    # Each late timestamp moved up to the request's previous event: S1 = Q = T0, F = T0 + 1, and the
    # second tokens event and the finish both at F. So L = E = T0 + 1.
    tr.assert_interval(tr.root, T0, T0 + 1)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), T0, T0)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_PREFILL), T0, T0 + 1)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_DECODE), T0 + 1, T0 + 1)
    a = tr.root.attributes
    want = {
        sc.LLM_LATENCY_QUEUE: 0.0,
        sc.LLM_LATENCY_PREFILL: 1.0,
        sc.LLM_LATENCY_DECODE: 0.0,
        sc.LLM_LATENCY_INFERENCE: 1.0,
        sc.LLM_LATENCY_TTFT: 1.0,
        sc.LLM_LATENCY_E2E: 1.0,
    }
    assert {key: a[key] for key in want} == pytest.approx(want, abs=1e-9)
    assert t.anomaly_counts[an.TIMESTAMP_REGRESSION] == 3
    (itl,) = harness.metrics()[sc.METRIC_ITL]  # one gap: the second tokens event, moved up to the first
    assert (itl.count, itl.min, itl.max) == (1, 0.0, 0.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinite_timestamps_become_now(harness, bad):
    import time

    t = harness.tracker
    before = time.monotonic()
    t.queued("r", ts=bad)
    t.scheduled(["r"], ts=bad)
    t.tokens(["r"], ts=bad)
    t.finished("r", ts=bad)
    after = time.monotonic()
    a = harness.trace("r", 0).root.attributes
    assert 0 <= a[sc.LLM_LATENCY_E2E] <= after - before
    assert t.anomaly_counts == {an.BAD_TIMESTAMP: 4}


def test_arrival_after_queued_is_clamped(harness):
    t = harness.tracker
    t.queued("r", ts=T0, arrival_ts=T0 + 3)
    t.finished("r", ts=T0 + 1)
    assert harness.trace("r", T0).root.attributes[sc.LLM_LATENCY_E2E] == pytest.approx(1.0)
    assert t.anomaly_counts == {an.ARRIVAL_AFTER_QUEUED: 1}


@pytest.mark.parametrize("count", [0, -3, 2.5, None])
def test_absurd_token_counts_are_skipped(harness, count):
    t = harness.tracker
    t.queued("r", ts=T0)
    t.scheduled(["r"], ts=T0 + 0.1)
    t.tokens(["r"], ts=T0 + 0.2, counts=[count])
    t.tokens(["r"], ts=T0 + 0.3, counts=[10**9])  # huge but valid
    t.finished("r", ts=T0 + 0.4)
    assert harness.trace("r", T0).root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 10**9
    assert t.anomaly_counts == {an.BAD_TOKEN_COUNT: 1}


def test_request_ids_of_any_hashable_type(harness):
    t = harness.tracker
    ids = [7, ("tenant", 3), b"raw", 2.5, frozenset({1})]
    for rid in ids:
        t.queued(rid)
    t.scheduled(ids)
    t.tokens(ids)
    for rid in ids:
        t.finished(rid)
    assert {r.attributes[sc.LLM_REQUEST_ID] for r in harness.roots()} == {str(r) for r in ids}
    assert t.anomaly_counts == {}


def test_programmer_misuse_raises_with_a_helpful_message(harness):
    t = harness.tracker
    with pytest.raises(TypeError, match="sequence of request ids"):
        t.scheduled("r1")
    with pytest.raises(TypeError, match="sequence of request ids"):
        t.tokens(None)
    with pytest.raises(ValueError, match="counts has 1 entries for 2"):
        t.tokens(["a", "b"], counts=[1])
    with pytest.raises(TypeError, match="monotonic"):
        t.tokens(["a"], ts="now")
    with pytest.raises(TypeError, match="reason must be a str"):
        t.finished("r", reason=None)
    with pytest.raises(TypeError, match="prompt_tokens"):
        t.queued("r", prompt_tokens="12")
    with pytest.raises(ValueError, match="max_in_flight"):
        type(t)(max_in_flight=0)


def test_eviction_by_count(make_harness):
    h = make_harness(max_in_flight=3)
    t = h.tracker
    for i in range(5):
        t.queued(f"r{i}", ts=T0 + i)
    assert t.in_flight == 3
    evicted = [r for r in h.roots() if r.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS][0] == "abandoned"]
    assert sorted(r.attributes[sc.LLM_REQUEST_ID] for r in evicted) == ["r0", "r1"]
    assert all(r.status.status_code.name == "ERROR" for r in evicted)
    m = h.metrics()
    assert m[sc.METRIC_ABANDONED][0].value == 2
    assert sc.METRIC_TTFT not in m
    assert m[sc.METRIC_REQUEST_DURATION][0].attributes[sc.ERROR_TYPE] == "abandoned"


def test_eviction_by_age(make_harness):
    import time

    h = make_harness(max_age_s=0.5)
    t = h.tracker
    now = time.monotonic()
    t.queued("old", ts=now - 10)
    t.scheduled(["old"], ts=now - 9)
    t.queued("new", ts=now)
    assert t.in_flight == 1
    (root,) = h.roots()
    assert root.attributes[sc.LLM_REQUEST_ID] == "old"
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS][0] == "abandoned"


def test_user_attributes_are_limited_and_counted(harness):
    from otel_llm.hooks import attributes as limits

    t = harness.tracker
    attrs = {
        "ok.int": 3,
        "ok.list": ["a", "b"],
        "long": "x" * (limits.MAX_VALUE_LENGTH + 50),
        "bad.type": object(),
        "bad.mixed": [1, "a"],
        7: "non-str key",
    }
    attrs.update({f"extra.{i}": i for i in range(limits.MAX_ATTRIBUTES)})
    t.queued("r", attributes=attrs)
    t.finished("r")
    a = harness.trace("r", 0).root.attributes
    assert a["ok.int"] == 3 and tuple(a["ok.list"]) == ("a", "b")
    assert len(a["long"]) == limits.MAX_VALUE_LENGTH
    assert "bad.type" not in a and "bad.mixed" not in a
    user_keys = [k for k in a if k.startswith(("ok.", "long", "extra."))]
    assert len(user_keys) == limits.MAX_ATTRIBUTES
    counts = t.anomaly_counts
    assert counts[an.ATTRIBUTE_TRUNCATED] == 1
    # object, mixed list, non-str key, and the attributes past the limit
    assert counts[an.ATTRIBUTE_DROPPED] == 3 + (len(attrs) - 3 - limits.MAX_ATTRIBUTES)
    for points in harness.metrics().values():
        for p in points:
            assert not set(p.attributes) & set(attrs), "user attributes must never reach metrics"


def test_a_raising_span_hook_is_logged_once_and_the_trace_still_exported(make_harness, caplog):
    calls = []

    def hook(span, fin):
        calls.append(fin.request_id)
        span.set_attribute("tenant", "blue")
        raise RuntimeError("bug in user code")

    h = make_harness(span_hook=hook)
    for rid in ["a", "b"]:
        h.tracker.queued(rid)
        h.tracker.finished(rid)
    assert calls == ["a", "b"]
    roots = h.roots()
    assert len(roots) == 2 and all(r.attributes["tenant"] == "blue" for r in roots)
    assert h.tracker.anomaly_counts == {an.SPAN_HOOK_FAILED: 2}
    assert sum("span_hook_failed" in r.getMessage() for r in caplog.records) == 1
