"""Property-based: random interleavings of the five hooks, valid and invalid ids and timestamps.

Whatever the order, no hook raises, no span has a negative duration, children nest in their parents,
every request is exported at most once (exactly once if it finished), and the anomaly counter adds up.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_llm import semconv as sc

IDS = ["a", "b", "c", "d"]
timestamps = st.one_of(
    st.none(),
    st.floats(min_value=0, max_value=50),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
hook = st.tuples(
    st.sampled_from(["queued", "scheduled", "tokens", "preempted", "finished"]),
    st.lists(st.sampled_from([*IDS, "ghost"]), min_size=1, max_size=4, unique=True),
    timestamps,
    st.sampled_from([None, 1, 2, 0, -1]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hook, max_size=40))
def test_random_event_sequences_keep_the_invariants(make_harness, events):
    h = make_harness()
    t = h.tracker
    finished: list[str] = []
    for name, ids, ts, count in events:
        if name == "queued":
            t.queued(ids[0], ts=ts, prompt_tokens=3)
        elif name == "finished":
            if ids[0] in t._inflight:
                finished.append(str(ids[0]))
            t.finished(ids[0], ts=ts, reason="stop")
        elif name == "tokens":
            t.tokens(ids, ts=ts, counts=None if count is None else [count] * len(ids))
        else:
            getattr(t, name)(ids, ts=ts)
    spans = {s.context.span_id: s for s in h.finished_spans()}
    for s in spans.values():
        assert s.end_time >= s.start_time, s.name
        if s.parent is not None and s.parent.span_id in spans:
            parent = spans[s.parent.span_id]
            assert parent.start_time <= s.start_time <= s.end_time <= parent.end_time
    roots = [s.attributes[sc.LLM_REQUEST_ID] for s in spans.values() if s.name == sc.SPAN_REQUEST]
    assert sorted(roots) == sorted(finished)
    for s in spans.values():
        if s.name == sc.SPAN_REQUEST:
            for key in (
                sc.LLM_LATENCY_QUEUE,
                sc.LLM_LATENCY_PREFILL,
                sc.LLM_LATENCY_DECODE,
                sc.LLM_LATENCY_INFERENCE,
                sc.LLM_LATENCY_TTFT,
                sc.LLM_LATENCY_E2E,
            ):
                assert s.attributes.get(key, 0) >= 0, key
    metrics = h.metrics()
    exported = {p.attributes[sc.LLM_ANOMALY_KIND]: p.value for p in metrics.get(sc.METRIC_ANOMALIES, [])}
    assert exported == t.anomaly_counts
    for p in metrics.get(sc.METRIC_ITL, []):
        assert sum(p.bucket_counts) == p.count and (p.count == 0 or p.min >= 0)
    active = sum(p.value for p in metrics[sc.METRIC_ACTIVE])
    assert active == t.in_flight
