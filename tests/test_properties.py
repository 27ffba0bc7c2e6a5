"""Property-based: random interleavings of the five hooks, valid and invalid ids and timestamps.

Whatever the order, no hook raises, no span has a negative duration, children nest in their parents,
every request is exported at most once (exactly once if it finished), and the anomaly counter adds up.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_llm import semconv as sc

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

IDS = ["a", "b"]  # few ids, so one request sees many events
# A step of the clock: mostly forward (so phases really have length), sometimes backwards, sometimes
# left out ("now"), sometimes not a number at all.
clock_steps = st.one_of(
    st.floats(min_value=0, max_value=2),
    st.floats(min_value=0, max_value=2),
    st.floats(min_value=-3, max_value=0),
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
hook = st.tuples(
    st.sampled_from(["queued", "scheduled", "tokens", "preempted", "finished"]),
    st.lists(st.sampled_from([*IDS, "ghost"]), min_size=1, max_size=3, unique=True),
    clock_steps,
    st.sampled_from([None, 1, 2, 0, -1]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hook, max_size=60))
# Found by the reference engine: preempted again while recomputing, before the first token.
@example(
    [(name, ["a"], 1.0, None) for name in ("queued", "scheduled", "preempted", "scheduled", "preempted")]
    + [(name, ["a"], 1.0, None) for name in ("scheduled", "tokens", "finished")]
)
@pytest.mark.in_process_only("300 examples; the export process runs its own below")
def test_random_event_sequences_keep_the_invariants(make_harness, events):
    check_invariants(make_harness(max_age_s=1e9), events)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hook, max_size=60))
def test_random_event_sequences_keep_the_invariants_through_the_export_process(events):
    """The same invariants with the export process between the tracker and the checks (fewer examples:
    each starts one)."""
    from export_harness import ExportHarness

    h = ExportHarness(max_age_s=1e9)
    try:
        check_invariants(h, events)
    finally:
        h.close()


def check_invariants(h, events):
    """``h``'s tracker driven by ``events``; timestamps mix 1000.0 with now, so nothing may age out."""
    t = h.tracker
    finished: list[str] = []
    now = 1000.0
    for name, ids, step, count in events:
        if step is None or not math.isfinite(step):
            ts = step
        else:
            now += step
            ts = now
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
        ancestor = s
        while ancestor.parent is not None and ancestor.parent.span_id in spans:
            ancestor = spans[ancestor.parent.span_id]
            assert ancestor.start_time <= s.start_time <= s.end_time <= ancestor.end_time, (
                s.name,
                ancestor.name,
            )
    # Within a phase, the preempted / recompute spans follow each other without overlapping.
    by_parent: dict[int, list] = {}
    for s in spans.values():
        if s.name in (sc.SPAN_PREEMPTED, sc.SPAN_RECOMPUTE):
            by_parent.setdefault(s.parent.span_id, []).append(s)
    for siblings in by_parent.values():
        siblings.sort(key=lambda s: (s.start_time, s.end_time))
        for a, b in itertools.pairwise(siblings):
            assert a.end_time <= b.start_time, (a.name, b.name)
    roots = [s.attributes[sc.LLM_REQUEST_ID] for s in spans.values() if s.name == sc.SPAN_REQUEST]
    assert sorted(roots) == sorted(finished)
    for s in spans.values():
        if s.name == sc.SPAN_REQUEST:
            check_latencies(
                s, [c for c in spans.values() if c.parent and c.parent.span_id == s.context.span_id]
            )
    metrics = h.metrics()
    exported = {p.attributes[sc.LLM_ANOMALY_KIND]: p.value for p in metrics.get(sc.METRIC_ANOMALIES, [])}
    assert exported == t.anomaly_counts
    for p in metrics.get(sc.METRIC_ITL, []):
        assert sum(p.bucket_counts) == p.count and (p.count == 0 or p.min >= 0)
    active = sum(p.value for p in metrics[sc.METRIC_ACTIVE])
    assert active == t.in_flight


TOLERANCE_S = 1e-6  # span times are whole nanoseconds of the wall clock; the values are float seconds


def check_latencies(root, children) -> None:
    """The ``llm.latency.*`` values of one ``llm.request`` are the ones docs/lifecycle.md defines, read back
    from its spans: the request span is [A, E], ``llm.queue`` [Q, S1], ``llm.prefill`` [S1, F] and
    ``llm.decode`` [F, E]; so e2e = E - A, queue = S1 - Q, prefill = F - S1, TTFT = F - A,
    inference = prefill + decode, and decode = L - F lies within [0, E - F]."""
    a = root.attributes
    kids = {}
    for child in sorted(children, key=lambda c: c.start_time):
        kids.setdefault(child.name, child)  # the first of each name: a request has one phase span each

    def seconds(start_ns: int, end_ns: int) -> float:
        return (end_ns - start_ns) / 1e9

    assert a[sc.LLM_LATENCY_E2E] == pytest.approx(seconds(root.start_time, root.end_time), abs=TOLERANCE_S)
    if sc.LLM_LATENCY_QUEUE in a:  # it was scheduled
        queue = kids[sc.SPAN_QUEUE]
        assert a[sc.LLM_LATENCY_QUEUE] == pytest.approx(
            seconds(queue.start_time, queue.end_time), abs=TOLERANCE_S
        )
    first_token = [
        sc.LLM_LATENCY_PREFILL,
        sc.LLM_LATENCY_DECODE,
        sc.LLM_LATENCY_INFERENCE,
        sc.LLM_LATENCY_TTFT,
    ]
    if sc.LLM_LATENCY_TTFT not in a:  # no token came: none of the values a first token defines
        assert not [key for key in first_token if key in a], dict(a)
        return
    assert all(key in a for key in first_token) and sc.LLM_LATENCY_QUEUE in a, dict(a)
    decode = kids[sc.SPAN_DECODE]  # starts at F
    prefill = kids.get(sc.SPAN_PREFILL)
    if prefill is not None:
        assert prefill.end_time == decode.start_time
    s1 = prefill.start_time if prefill is not None else decode.start_time  # no prefill span: S1 = F
    assert a[sc.LLM_LATENCY_PREFILL] == pytest.approx(seconds(s1, decode.start_time), abs=TOLERANCE_S)
    assert a[sc.LLM_LATENCY_TTFT] == pytest.approx(
        seconds(root.start_time, decode.start_time), abs=TOLERANCE_S
    )
    inference = a[sc.LLM_LATENCY_PREFILL] + a[sc.LLM_LATENCY_DECODE]
    assert a[sc.LLM_LATENCY_INFERENCE] == pytest.approx(inference, abs=TOLERANCE_S)
    assert (
        -TOLERANCE_S <= a[sc.LLM_LATENCY_DECODE] <= seconds(decode.start_time, decode.end_time) + TOLERANCE_S
    )
