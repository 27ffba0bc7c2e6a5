"""The phase a request was in when it was aborted or failed is marked, not only ``llm.request``.

docs/lifecycle.md, "The trace": the phase span ending at E (and the preemption span open at E) gets
``llm.cut_short`` = true and, for a failure, the request's ERROR status; nothing else is marked, and a
request that ended as it should marks nothing. Each case drives a real tracker into real SDK providers,
in both export modes.
"""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from otel_llm import semconv as sc

pytestmark = pytest.mark.both_modes

T0 = 9000.0  # an arbitrary monotonic origin


def marked(trace) -> dict[str, tuple[StatusCode, str | None]]:
    """Span name -> (status, description) of every span carrying ``llm.cut_short``."""
    found = {}
    for span in trace.spans:
        if span.attributes.get(sc.LLM_CUT_SHORT) is True:
            assert span.name not in found, f"two {span.name} spans marked"
            found[span.name] = (span.status.status_code, span.status.description)
    return found


def unmarked_statuses(trace) -> set[StatusCode]:
    """The statuses of every span below ``llm.request`` that is not marked."""
    return {
        s.status.status_code
        for s in trace.spans
        if s is not trace.root and s.attributes.get(sc.LLM_CUT_SHORT) is None
    }


def test_an_abort_in_the_queue_marks_the_queue_without_an_error(harness):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.finished("r1", reason=sc.REASON_ABORT, ts=T0 + 0.3)
    tr = harness.trace("r1", T0)
    assert marked(tr) == {sc.SPAN_QUEUE: (StatusCode.UNSET, None)}
    assert tr.root.status.status_code is StatusCode.UNSET  # a client's abort is not a failure


def test_an_error_in_prefill_marks_prefill_with_the_requests_status(harness):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    t.finished("r1", reason=sc.REASON_ERROR, ts=T0 + 0.2, error=RuntimeError("CUDA out of memory"))
    tr = harness.trace("r1", T0)
    assert tr.root.status.status_code is StatusCode.ERROR
    assert "CUDA out of memory" in tr.root.status.description
    assert marked(tr) == {sc.SPAN_PREFILL: (StatusCode.ERROR, tr.root.status.description)}
    assert unmarked_statuses(tr) == {StatusCode.UNSET}  # the queue span is not blamed


def test_an_abort_in_decode_marks_decode_only(harness):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    t.tokens(["r1"], ts=T0 + 0.2)
    t.tokens(["r1"], ts=T0 + 0.3)
    t.finished("r1", reason=sc.REASON_ABORT, ts=T0 + 0.35)
    tr = harness.trace("r1", T0)
    assert marked(tr) == {sc.SPAN_DECODE: (StatusCode.UNSET, None)}
    tr.assert_interval(tr.child(tr.root, sc.SPAN_DECODE), T0 + 0.2, T0 + 0.35)


def test_a_failure_while_evicted_marks_decode_and_the_open_preemption(harness):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    t.tokens(["r1"], ts=T0 + 0.2)
    t.preempted(["r1"], ts=T0 + 0.3)  # an earlier preemption, whole: not marked
    t.scheduled(["r1"], ts=T0 + 0.4)
    t.tokens(["r1"], ts=T0 + 0.5)
    t.preempted(["r1"], ts=T0 + 0.6)  # never rescheduled
    t.finished("r1", reason=sc.REASON_ERROR, ts=T0 + 0.9, error="engine lost the KV cache")
    tr = harness.trace("r1", T0)
    status = tr.root.status.description
    assert marked(tr) == {
        sc.SPAN_DECODE: (StatusCode.ERROR, status),
        sc.SPAN_PREEMPTED: (StatusCode.ERROR, status),
    }
    decode = tr.child(tr.root, sc.SPAN_DECODE)
    preempted = tr.children(decode, sc.SPAN_PREEMPTED)
    assert [s.attributes.get(sc.LLM_CUT_SHORT) for s in preempted] == [None, True]
    tr.assert_interval(preempted[1], T0 + 0.6, T0 + 0.9)
    assert tr.child(decode, sc.SPAN_RECOMPUTE).attributes.get(sc.LLM_CUT_SHORT) is None


def test_a_failure_while_recomputing_marks_the_recompute(harness):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    t.preempted(["r1"], ts=T0 + 0.2)  # before the first token: in prefill
    t.scheduled(["r1"], ts=T0 + 0.3)
    t.finished("r1", reason=sc.REASON_ERROR, ts=T0 + 0.5, error=ValueError("bad logits"))
    tr = harness.trace("r1", T0)
    status = tr.root.status.description
    assert marked(tr) == {
        sc.SPAN_PREFILL: (StatusCode.ERROR, status),
        sc.SPAN_RECOMPUTE: (StatusCode.ERROR, status),
    }
    prefill = tr.child(tr.root, sc.SPAN_PREFILL)
    tr.assert_interval(tr.child(prefill, sc.SPAN_RECOMPUTE), T0 + 0.3, T0 + 0.5)
    assert tr.child(prefill, sc.SPAN_PREEMPTED).attributes.get(sc.LLM_CUT_SHORT) is None


def test_a_request_the_tracker_gave_up_on_marks_its_phase(make_harness):
    h = make_harness(max_in_flight=1)
    t = h.tracker
    t.queued("old", ts=T0)
    t.scheduled(["old"], ts=T0 + 0.1)
    t.tokens(["old"], ts=T0 + 0.2)
    t.queued("new", ts=T0 + 0.3)  # over the limit: "old" is abandoned in decode
    (root,) = h.roots()
    tr = h.trace("old", T0)
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS][0] == sc.REASON_ABANDONED
    assert marked(tr) == {sc.SPAN_DECODE: (StatusCode.ERROR, tr.root.status.description)}


@pytest.mark.parametrize("reason", [sc.REASON_STOP, sc.REASON_LENGTH, "content_filter"])
def test_a_request_that_ended_as_it_should_marks_nothing(harness, reason):
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    t.preempted(["r1"], ts=T0 + 0.15)
    t.scheduled(["r1"], ts=T0 + 0.2)
    t.tokens(["r1"], ts=T0 + 0.3)
    t.finished("r1", reason=reason, ts=T0 + 0.4)
    tr = harness.trace("r1", T0)
    assert len(tr.spans) >= 5  # queue, prefill, preempted, recompute, decode under llm.request
    assert marked(tr) == {}
    assert unmarked_statuses(tr) == {StatusCode.UNSET}


def test_at_detail_steps_only_the_phase_is_marked(make_harness):
    h = make_harness(trace_detail="steps")
    t = h.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    for k in range(3):
        t.tokens(["r1"], ts=T0 + 0.2 + 0.1 * k)
        t.engine_state(step_tokens=4 if k == 0 else 1)
    t.finished("r1", reason=sc.REASON_ABORT, ts=T0 + 0.45)
    tr = h.trace("r1", T0)
    assert len([s for s in tr.spans if s.name == sc.SPAN_ENGINE_STEP]) == 3
    assert marked(tr) == {sc.SPAN_DECODE: (StatusCode.UNSET, None)}


def test_at_detail_request_the_root_alone_carries_the_failure(make_harness):
    h = make_harness(trace_detail="request")
    t = h.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0 + 0.1)
    t.finished("r1", reason=sc.REASON_ERROR, ts=T0 + 0.2, error="boom")
    tr = h.trace("r1", T0)
    assert [s.name for s in tr.spans] == [sc.SPAN_REQUEST]
    assert tr.root.status.status_code is StatusCode.ERROR
    assert sc.LLM_CUT_SHORT not in tr.root.attributes
