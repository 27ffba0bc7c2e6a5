"""The trace as a trace UI shows it: events in time order, no uncovered stretch, bounded span counts.

Each scenario drives a real tracker into real SDK providers (tests/conftest.py) and checks the spans
against the timestamps it reported.
"""

from __future__ import annotations

import itertools
import logging

import pytest

from otel_llm import semconv as sc
from otel_llm.hooks import anomalies as an
from otel_llm.record import MAX_PREEMPTION_SPANS

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

T0 = 7000.0  # an arbitrary monotonic origin


def test_events_are_added_in_time_order(harness):
    # A preemption before the first token: F comes after P1 and R1. Events must be sent in that order,
    # not grouped by kind (trace UIs list them as sent).
    t = harness.tracker
    Q, S1, P1, R1, F, E = T0, T0 + 0.01, T0 + 0.02, T0 + 0.05, T0 + 0.08, T0 + 0.1
    t.queued("r1", ts=Q)
    t.scheduled(["r1"], ts=S1)
    t.preempted(["r1"], ts=P1)
    t.scheduled(["r1"], ts=R1)
    t.tokens(["r1"], ts=F)
    t.finished("r1", ts=E)
    root = harness.trace("r1", Q).root
    sent = [e.name for e in root.events]
    assert sent == [
        sc.EVENT_QUEUED,
        sc.EVENT_SCHEDULED,
        sc.EVENT_PREEMPTED,
        sc.EVENT_SCHEDULED,
        sc.EVENT_FIRST_TOKEN,
    ]
    stamps = [e.timestamp for e in root.events]
    assert stamps == sorted(stamps)


def test_arrival_to_queued_is_the_admission_span(harness):
    t = harness.tracker
    A, Q, S1, F, E = T0, T0 + 0.2, T0 + 0.25, T0 + 0.3, T0 + 0.4
    t.queued("r1", ts=Q, arrival_ts=A)
    t.scheduled(["r1"], ts=S1)
    t.tokens(["r1"], ts=F)
    t.finished("r1", ts=E)
    tr = harness.trace("r1", A)
    admission = tr.child(tr.root, sc.SPAN_ADMISSION)
    tr.assert_interval(admission, A, Q)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), Q, S1)  # queue time is still S1 - Q
    assert tr.root.attributes[sc.LLM_LATENCY_QUEUE] == pytest.approx(S1 - Q)
    # The phases cover the request from arrival to finish without a gap.
    phases = sorted(tr.children(tr.root), key=lambda s: s.start_time)
    assert phases[0].start_time == tr.root.start_time and phases[-1].end_time == tr.root.end_time
    for a, b in itertools.pairwise(phases):
        assert a.end_time == b.start_time, (a.name, b.name)


def test_no_admission_span_when_arrival_is_queued(harness):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.finished("r1", ts=T0 + 1)
    tr = harness.trace("r1", T0)
    assert tr.children(tr.root, sc.SPAN_ADMISSION) == []


def test_preemption_spans_are_capped_and_the_rest_summarised(harness):
    t = harness.tracker
    n = MAX_PREEMPTION_SPANS + 10
    ts = T0
    t.queued("r1", ts=ts)
    t.scheduled(["r1"], ts=ts)
    t.tokens(["r1"], ts=ts + 0.001)
    ts += 0.001
    expected_preempted = expected_recompute = 0.0
    for k in range(n):
        t.preempted(["r1"], ts=ts + 0.001)
        t.scheduled(["r1"], ts=ts + 0.004)  # 3 ms evicted
        t.tokens(["r1"], ts=ts + 0.006)  # 2 ms recomputing
        if k >= MAX_PREEMPTION_SPANS:
            expected_preempted += 0.003
            expected_recompute += 0.002
        ts += 0.006
    t.finished("r1", ts=ts + 0.001)
    tr = harness.trace("r1", T0)
    assert len([s for s in tr.spans if s.name == sc.SPAN_PREEMPTED]) == MAX_PREEMPTION_SPANS
    assert len([s for s in tr.spans if s.name == sc.SPAN_RECOMPUTE]) == MAX_PREEMPTION_SPANS
    assert len(tr.events(sc.EVENT_PREEMPTED)) == MAX_PREEMPTION_SPANS
    a = tr.root.attributes
    assert a[sc.LLM_PREEMPTIONS] == n
    assert a[sc.LLM_PREEMPTIONS_UNSPANNED] == 10
    assert a[sc.LLM_PREEMPTIONS_UNSPANNED_PREEMPTED] == pytest.approx(expected_preempted)
    assert a[sc.LLM_PREEMPTIONS_UNSPANNED_RECOMPUTE] == pytest.approx(expected_recompute)
    assert t.anomaly_counts == {an.PREEMPTION_SPANS_CAPPED: 1}


def test_anomalies_are_logged_without_the_tracker_lock(harness, caplog):
    t = harness.tracker
    held: list[bool] = []

    class LockProbe(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            free = t._lock.acquire(blocking=False)
            if free:
                t._lock.release()
            held.append(not free)

    probe = LockProbe()
    logging.getLogger("otel_llm").addHandler(probe)
    try:
        t.scheduled(["nobody"])  # unknown request
        t.queued("r1", ts=T0)
        t.queued("r1", ts=T0)  # duplicate queued
        t.preempted(["r1"])  # preempted while not running
        t.finished("ghost")  # unknown request, second of its kind: counted, not logged
    finally:
        logging.getLogger("otel_llm").removeHandler(probe)
    assert held == [False, False, False]
