"""docs/lifecycle.md, scenario by scenario: one engine story, the trace and the metric values it must give.

Expected numbers are written from the contract's definitions (queue = S1 - Q, prefill = F - S1, ...)
applied to each scenario's timestamps, not taken from the code under test.
"""

from __future__ import annotations

import itertools

import pytest

from otel_llm import semconv as sc

# Every scenario in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

T0 = 5000.0  # an arbitrary monotonic origin


def point(points, **attrs):
    found = [p for p in points if all(p.attributes.get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, (attrs, [dict(p.attributes) for p in points])
    return found[0]


def hist(m, name, **attrs):
    p = point(m[name], **attrs)
    return p.count, p.sum


def test_plain_request(harness):
    t = harness.tracker
    A, Q, S1, F = T0, T0 + 0.010, T0 + 0.030, T0 + 0.080
    steps = [F, F + 0.02, F + 0.05, F + 0.06]
    E = F + 0.061
    t.queued("r1", ts=Q, arrival_ts=A, prompt_tokens=7, attributes={"gen_ai.request.max_tokens": 4})
    t.scheduled(["r1"], ts=S1)
    for ts in steps:
        t.tokens(["r1"], ts=ts)
    t.finished("r1", reason="length", ts=E)
    L = steps[-1]

    tr = harness.trace("r1", A)
    tr.assert_interval(tr.root, A, E)
    assert tr.root.kind.name == "SERVER" and tr.root.parent is None
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), Q, S1)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_PREFILL), S1, F)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_DECODE), F, E)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_ADMISSION), A, Q)  # A < Q: covered, not queue time
    assert len(tr.spans) == 5
    a = tr.root.attributes
    assert a[sc.LLM_REQUEST_ID] == "r1" and a[sc.GEN_AI_REQUEST_MODEL] == "test-model"
    assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 7 and a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert tuple(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("length",)
    assert a["gen_ai.request.max_tokens"] == 4 and a[sc.LLM_PREEMPTIONS] == 0
    assert a[sc.LLM_LATENCY_QUEUE] == pytest.approx(S1 - Q)
    assert a[sc.LLM_LATENCY_PREFILL] == pytest.approx(F - S1)
    assert a[sc.LLM_LATENCY_DECODE] == pytest.approx(L - F)
    assert a[sc.LLM_LATENCY_INFERENCE] == pytest.approx(L - S1)
    assert a[sc.LLM_LATENCY_TTFT] == pytest.approx(F - A)
    assert a[sc.LLM_LATENCY_E2E] == pytest.approx(E - A)
    assert tr.root.status.status_code.name == "UNSET"
    assert [e.name for e in sorted(tr.root.events, key=lambda e: e.timestamp)] == [
        sc.EVENT_QUEUED,
        sc.EVENT_SCHEDULED,
        sc.EVENT_FIRST_TOKEN,
    ]
    assert tr.events(sc.EVENT_SCHEDULED)[0].attributes[sc.LLM_RESUMED] is False
    assert abs(tr.events(sc.EVENT_FIRST_TOKEN)[0].timestamp - tr.at(F)) <= 1000

    m = harness.metrics()
    assert hist(m, sc.METRIC_QUEUE) == pytest.approx((1, S1 - Q))
    assert hist(m, sc.METRIC_PREFILL) == pytest.approx((1, F - S1))
    assert hist(m, sc.METRIC_DECODE) == pytest.approx((1, L - F))
    assert hist(m, sc.METRIC_INFERENCE) == pytest.approx((1, L - S1))
    assert hist(m, sc.METRIC_TTFT) == pytest.approx((1, F - A))
    assert hist(m, sc.METRIC_TPOT) == pytest.approx((1, (L - F) / 3))
    assert hist(m, sc.METRIC_REQUEST_DURATION) == pytest.approx((1, E - A))
    itl = point(m[sc.METRIC_ITL])
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert itl.count == 3 and itl.sum == pytest.approx(sum(gaps))
    assert itl.min == pytest.approx(min(gaps)) and itl.max == pytest.approx(max(gaps))
    assert point(m[sc.METRIC_REQUESTS], **{sc.LLM_FINISH_REASON: "length"}).value == 1
    assert point(m[sc.METRIC_TOKENS], **{sc.GEN_AI_TOKEN_TYPE: "input"}).value == 7
    assert point(m[sc.METRIC_TOKENS], **{sc.GEN_AI_TOKEN_TYPE: "output"}).value == 4
    assert sc.METRIC_PREEMPTIONS not in m
    for name in (sc.METRIC_TTFT, sc.METRIC_QUEUE, sc.METRIC_ITL, sc.METRIC_REQUESTS):
        for p in m[name]:
            assert p.attributes[sc.GEN_AI_PROVIDER_NAME] and p.attributes[sc.GEN_AI_OPERATION_NAME]
            assert p.attributes[sc.GEN_AI_REQUEST_MODEL] == "test-model"
            assert sc.LLM_REQUEST_ID not in p.attributes


def test_preemption_during_decode(harness):
    """First token already streamed: the preemption lengthens one gap, decode and inference."""
    t = harness.tracker
    Q, S1, F, t2 = T0, T0 + 0.01, T0 + 0.05, T0 + 0.07
    P, R, T, E = T0 + 0.08, T0 + 0.30, T0 + 0.36, T0 + 0.40
    t.queued("r", ts=Q, prompt_tokens=3)
    t.scheduled(["r"], ts=S1)
    t.tokens(["r"], ts=F)
    t.tokens(["r"], ts=t2)
    t.preempted(["r"], ts=P)
    t.scheduled(["r"], ts=R)
    t.tokens(["r"], ts=T)
    t.finished("r", ts=E)

    tr = harness.trace("r", Q)
    decode = tr.child(tr.root, sc.SPAN_DECODE)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), Q, S1)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_PREFILL), S1, F)
    tr.assert_interval(decode, F, E)
    tr.assert_interval(tr.child(decode, sc.SPAN_PREEMPTED), P, R)
    tr.assert_interval(tr.child(decode, sc.SPAN_RECOMPUTE), R, T)
    assert tr.children(tr.child(tr.root, sc.SPAN_PREFILL)) == []
    a = tr.root.attributes
    assert a[sc.LLM_PREEMPTIONS] == 1
    assert a[sc.LLM_LATENCY_QUEUE] == pytest.approx(S1 - Q)  # waiting after P is never queue time
    assert a[sc.LLM_LATENCY_TTFT] == pytest.approx(F - Q)  # first token never reset
    assert a[sc.LLM_LATENCY_DECODE] == pytest.approx(T - F)
    preempted = tr.events(sc.EVENT_PREEMPTED)
    assert len(preempted) == 1 and preempted[0].attributes[sc.LLM_OUTPUT_TOKENS] == 2
    resumed = [
        e.attributes[sc.LLM_RESUMED] for e in sorted(tr.events(sc.EVENT_SCHEDULED), key=lambda e: e.timestamp)
    ]
    assert resumed == [False, True]

    m = harness.metrics()
    itl = point(m[sc.METRIC_ITL])
    assert itl.count == 2 and itl.sum == pytest.approx((t2 - F) + (T - t2))
    assert itl.max == pytest.approx(T - t2)  # the one lengthened gap
    assert hist(m, sc.METRIC_PREEMPTED) == pytest.approx((1, R - P))
    assert hist(m, sc.METRIC_RECOMPUTE) == pytest.approx((1, T - R))
    assert point(m[sc.METRIC_PREEMPTIONS]).value == 1
    assert hist(m, sc.METRIC_TPOT) == pytest.approx((1, (T - F) / 2))


def test_preemption_during_prefill(harness):
    """No token yet: the preemption lengthens prefill and TTFT, and T_k is the first token."""
    t = harness.tracker
    Q, S1, P, R, F, E = T0, T0 + 0.02, T0 + 0.03, T0 + 0.20, T0 + 0.26, T0 + 0.27
    t.queued("r", ts=Q)
    t.scheduled(["r"], ts=S1)
    t.preempted(["r"], ts=P)
    t.scheduled(["r"], ts=R)
    t.tokens(["r"], ts=F)
    t.finished("r", ts=E)

    tr = harness.trace("r", Q)
    prefill = tr.child(tr.root, sc.SPAN_PREFILL)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), Q, S1)
    tr.assert_interval(prefill, S1, F)
    tr.assert_interval(tr.child(prefill, sc.SPAN_PREEMPTED), P, R)
    tr.assert_interval(tr.child(prefill, sc.SPAN_RECOMPUTE), R, F)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_DECODE), F, E)
    assert tr.events(sc.EVENT_PREEMPTED)[0].attributes[sc.LLM_OUTPUT_TOKENS] == 0
    m = harness.metrics()
    assert hist(m, sc.METRIC_QUEUE) == pytest.approx((1, S1 - Q))
    assert hist(m, sc.METRIC_PREFILL) == pytest.approx((1, F - S1))
    assert hist(m, sc.METRIC_TTFT) == pytest.approx((1, F - Q))
    assert hist(m, sc.METRIC_DECODE) == pytest.approx((1, 0.0))
    assert sc.METRIC_TPOT not in m  # one output token: no TPOT
    assert point(m[sc.METRIC_ITL]).count == 0


def test_several_preemptions(harness):
    """One preemption before F and two after it, the last one never rescheduled."""
    t = harness.tracker
    Q, S1, P1, R1, F = T0, T0 + 0.01, T0 + 0.02, T0 + 0.05, T0 + 0.08
    t2, P2, R2, T2, t4, P3, E = T0 + 0.10, T0 + 0.11, T0 + 0.20, T0 + 0.25, T0 + 0.27, T0 + 0.30, T0 + 0.50
    t.queued("r", ts=Q)
    t.scheduled(["r"], ts=S1)
    t.preempted(["r"], ts=P1)
    t.scheduled(["r"], ts=R1)
    t.tokens(["r"], ts=F)
    t.tokens(["r"], ts=t2)
    t.preempted(["r"], ts=P2)
    t.scheduled(["r"], ts=R2)
    t.tokens(["r"], ts=T2)
    t.tokens(["r"], ts=t4)
    t.preempted(["r"], ts=P3)
    t.finished("r", reason="abort", ts=E)

    tr = harness.trace("r", Q)
    prefill, decode = tr.child(tr.root, sc.SPAN_PREFILL), tr.child(tr.root, sc.SPAN_DECODE)
    tr.assert_interval(tr.child(prefill, sc.SPAN_PREEMPTED), P1, R1)
    tr.assert_interval(tr.child(prefill, sc.SPAN_RECOMPUTE), R1, F)
    pre, rec = tr.children(decode, sc.SPAN_PREEMPTED), tr.children(decode, sc.SPAN_RECOMPUTE)
    assert len(pre) == 2 and len(rec) == 1
    tr.assert_interval(pre[0], P2, R2)
    tr.assert_interval(rec[0], R2, T2)
    tr.assert_interval(pre[1], P3, E)  # never rescheduled: evicted until the end
    assert tr.root.attributes[sc.LLM_PREEMPTIONS] == 3
    assert [
        e.attributes[sc.LLM_OUTPUT_TOKENS]
        for e in sorted(tr.events(sc.EVENT_PREEMPTED), key=lambda e: e.timestamp)
    ] == [0, 2, 4]
    assert tr.root.status.status_code.name == "UNSET"  # a client abort is not a failure
    m = harness.metrics()
    assert point(m[sc.METRIC_PREEMPTIONS]).value == 3
    assert hist(m, sc.METRIC_PREEMPTED) == pytest.approx((3, (R1 - P1) + (R2 - P2) + (E - P3)))
    assert hist(m, sc.METRIC_RECOMPUTE) == pytest.approx((2, (F - R1) + (T2 - R2)))
    assert hist(m, sc.METRIC_DECODE) == pytest.approx((1, t4 - F))
    assert hist(m, sc.METRIC_TTFT) == pytest.approx((1, F - Q))  # abort still records TTFT
    itl = point(m[sc.METRIC_ITL])
    assert itl.count == 3 and itl.sum == pytest.approx(t4 - F)


def test_preempted_again_while_recomputing(harness):
    """A recompute cut short by the next preemption ends there; only completed recomputes are timed."""
    t = harness.tracker
    Q, S1, P1, R1, P2, R2, F, E = (T0 + x for x in (0, 0.01, 0.02, 0.05, 0.06, 0.10, 0.15, 0.16))
    t.queued("r", ts=Q)
    t.scheduled(["r"], ts=S1)
    t.preempted(["r"], ts=P1)
    t.scheduled(["r"], ts=R1)
    t.preempted(["r"], ts=P2)
    t.scheduled(["r"], ts=R2)
    t.tokens(["r"], ts=F)
    t.finished("r", ts=E)
    tr = harness.trace("r", Q)
    prefill = tr.child(tr.root, sc.SPAN_PREFILL)
    tr.assert_interval(prefill, S1, F)
    pre, rec = tr.children(prefill, sc.SPAN_PREEMPTED), tr.children(prefill, sc.SPAN_RECOMPUTE)
    tr.assert_interval(pre[0], P1, R1)
    tr.assert_interval(rec[0], R1, P2)
    tr.assert_interval(pre[1], P2, R2)
    tr.assert_interval(rec[1], R2, F)
    m = harness.metrics()
    assert hist(m, sc.METRIC_PREEMPTED) == pytest.approx((2, (R1 - P1) + (R2 - P2)))
    assert hist(m, sc.METRIC_RECOMPUTE) == pytest.approx((1, F - R2))
    assert hist(m, sc.METRIC_PREFILL) == pytest.approx((1, F - S1))


def test_abort_while_queued(harness):
    t = harness.tracker
    Q, E = T0, T0 + 0.4
    t.queued("r", ts=Q, prompt_tokens=5)
    t.finished("r", reason="abort", ts=E)
    tr = harness.trace("r", Q)
    tr.assert_interval(tr.child(tr.root, sc.SPAN_QUEUE), Q, E)
    assert {s.name for s in tr.spans} == {sc.SPAN_REQUEST, sc.SPAN_QUEUE}
    for key in (sc.LLM_LATENCY_QUEUE, sc.LLM_LATENCY_TTFT, sc.LLM_LATENCY_PREFILL):
        assert key not in tr.root.attributes
    assert tr.root.attributes[sc.LLM_LATENCY_E2E] == pytest.approx(E - Q)
    m = harness.metrics()
    assert hist(m, sc.METRIC_REQUEST_DURATION) == pytest.approx((1, E - Q))
    assert sc.ERROR_TYPE not in m[sc.METRIC_REQUEST_DURATION][0].attributes
    for name in (sc.METRIC_QUEUE, sc.METRIC_TTFT, sc.METRIC_PREFILL):
        assert name not in m
    assert point(m[sc.METRIC_REQUESTS], **{sc.LLM_FINISH_REASON: "abort"}).value == 1


def test_abort_while_preempted(harness):
    t = harness.tracker
    Q, S1, F, P, E = T0, T0 + 0.01, T0 + 0.03, T0 + 0.04, T0 + 0.09
    t.queued("r", ts=Q)
    t.scheduled(["r"], ts=S1)
    t.tokens(["r"], ts=F)
    t.preempted(["r"], ts=P)
    t.finished("r", reason="abort", ts=E)
    tr = harness.trace("r", Q)
    decode = tr.child(tr.root, sc.SPAN_DECODE)
    tr.assert_interval(decode, F, E)
    tr.assert_interval(tr.child(decode, sc.SPAN_PREEMPTED), P, E)
    assert tr.children(decode, sc.SPAN_RECOMPUTE) == []
    m = harness.metrics()
    assert hist(m, sc.METRIC_PREEMPTED) == pytest.approx((1, E - P))
    assert sc.METRIC_RECOMPUTE not in m


def test_error(harness):
    t = harness.tracker
    Q, S1, F, t2, E = T0, T0 + 0.01, T0 + 0.02, T0 + 0.03, T0 + 0.05
    t.queued("r", ts=Q)
    t.scheduled(["r"], ts=S1)
    t.tokens(["r"], ts=F)
    t.tokens(["r"], ts=t2)
    t.finished("r", reason="error", ts=E, error=RuntimeError("CUDA out of memory"))
    tr = harness.trace("r", Q)
    assert tr.root.status.status_code.name == "ERROR"
    assert "CUDA out of memory" in tr.root.status.description
    assert tr.root.attributes[sc.ERROR_TYPE] == "RuntimeError"
    m = harness.metrics()
    # Failed requests skip the two semantic-convention latency histograms, and only those.
    assert sc.METRIC_TTFT not in m and sc.METRIC_TPOT not in m
    assert hist(m, sc.METRIC_PREFILL) == pytest.approx((1, F - S1))
    duration = point(m[sc.METRIC_REQUEST_DURATION])
    assert duration.attributes[sc.ERROR_TYPE] == "RuntimeError" and duration.sum == pytest.approx(E - Q)


def test_speculative_decoding_counts(harness):
    t = harness.tracker
    Q, S1, steps, E = T0, T0 + 0.01, [T0 + 0.02, T0 + 0.03, T0 + 0.05], T0 + 0.06
    t.queued("r", ts=Q)
    t.scheduled(["r"], ts=S1)
    for ts, n in zip(steps, [1, 3, 2]):
        t.tokens(["r"], ts=ts, counts=[n])
    t.finished("r", ts=E)
    tr = harness.trace("r", Q)
    assert tr.root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    m = harness.metrics()
    assert hist(m, sc.METRIC_TPOT) == pytest.approx((1, (steps[-1] - steps[0]) / 5))
    assert point(m[sc.METRIC_ITL]).count == 2  # one sample per tokens event, not per token
    assert point(m[sc.METRIC_TOKENS], **{sc.GEN_AI_TOKEN_TYPE: "output"}).value == 6


def test_batches_share_steps(harness):
    """Three requests in one batch: shared step timestamps, one joins late, one is preempted."""
    t = harness.tracker
    for i, rid in enumerate(["a", "b", "c"]):
        t.queued(rid, ts=T0 + i * 0.001)
    t.scheduled(["a", "b"], ts=T0 + 0.01)
    t.tokens(["a", "b"], ts=T0 + 0.02)
    t.scheduled(["c"], ts=T0 + 0.025)
    t.tokens(["a", "b", "c"], ts=T0 + 0.03)
    t.preempted(["b"], ts=T0 + 0.035)
    t.tokens(["a", "c"], ts=T0 + 0.04)
    t.scheduled(["b"], ts=T0 + 0.045)
    t.tokens(["a", "b", "c"], ts=T0 + 0.06)
    for rid in ["a", "b", "c"]:
        t.finished(rid, ts=T0 + 0.07)
    roots = harness.roots()
    assert len(roots) == 3 and len({r.context.trace_id for r in roots}) == 3
    tb = harness.trace("b", T0 + 0.001)
    tr_c = harness.trace("c", T0 + 0.002)
    assert tb.root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert tr_c.root.attributes[sc.LLM_LATENCY_QUEUE] == pytest.approx(0.025 - 0.002)
    tr_c.assert_interval(tr_c.child(tr_c.root, sc.SPAN_PREFILL), T0 + 0.025, T0 + 0.03)
    decode_b = tb.child(tb.root, sc.SPAN_DECODE)
    tb.assert_interval(tb.child(decode_b, sc.SPAN_PREEMPTED), T0 + 0.035, T0 + 0.045)
    tb.assert_interval(tb.child(decode_b, sc.SPAN_RECOMPUTE), T0 + 0.045, T0 + 0.06)
    m = harness.metrics()
    # Every ITL sample, from the lifecycle definition: consecutive tokens events per request.
    gaps = {"a": [0.01, 0.01, 0.02], "b": [0.01, 0.03], "c": [0.01, 0.02]}
    itl = point(m[sc.METRIC_ITL])
    assert itl.count == 7 and itl.sum == pytest.approx(sum(sum(g) for g in gaps.values()))
    assert hist(m, sc.METRIC_TTFT)[0] == 3


def test_itl_histogram_buckets_match_per_sample_recording(harness):
    """The pre-aggregated histogram equals what recording every sample would give, bucket by bucket."""
    from bisect import bisect_left

    t = harness.tracker
    ids = [f"r{i}" for i in range(20)]
    for rid in ids:
        t.queued(rid, ts=T0)
    t.scheduled(ids, ts=T0 + 0.001)
    ts = T0 + 0.002
    samples: list[float] = []
    last: dict[str, float] = {}
    for step in range(50):
        batch = [rid for k, rid in enumerate(ids) if (k + step) % 7 != 0]  # some skip a step
        ts += 0.0005 * (1 + step % 9)
        t.tokens(batch, ts=ts)
        for rid in batch:
            if rid in last:
                samples.append(ts - last[rid])
            last[rid] = ts
    for rid in ids:
        t.finished(rid, ts=ts + 0.01)
    itl = point(harness.metrics()[sc.METRIC_ITL])
    expected = [0] * (len(sc.BUCKETS_ITL) + 1)
    for s in samples:
        expected[bisect_left(sc.BUCKETS_ITL, s)] += 1
    assert list(itl.bucket_counts) == expected
    assert tuple(itl.explicit_bounds) == sc.BUCKETS_ITL
    assert itl.sum == pytest.approx(sum(samples))


def test_exemplars_link_histograms_to_the_request_span(harness):
    t = harness.tracker
    t.queued("r", ts=T0)
    t.scheduled(["r"], ts=T0 + 0.01)
    t.tokens(["r"], ts=T0 + 0.02)
    t.finished("r", ts=T0 + 0.03)
    root = harness.trace("r", T0).root
    ttft = point(harness.metrics()[sc.METRIC_TTFT])
    assert ttft.exemplars, "the TTFT point should carry an exemplar of the request"
    assert ttft.exemplars[0].trace_id == root.context.trace_id
    assert ttft.exemplars[0].span_id == root.context.span_id


def test_integration_attributes_reach_spans_and_metrics_without_overriding_ours(make_harness):
    server = {sc.SERVER_ADDRESS: "10.0.0.7", sc.SERVER_PORT: 8000, sc.GEN_AI_RESPONSE_MODEL: "served"}
    h = make_harness(attributes={**server, sc.GEN_AI_REQUEST_MODEL: "not-this"})
    h.tracker.queued("r", ts=1.0, prompt_tokens=4)
    h.tracker.scheduled(["r"], ts=1.1)
    h.tracker.tokens(["r"], ts=1.2)
    h.tracker.finished("r", ts=1.3)
    (root,) = h.roots()
    assert {k: root.attributes[k] for k in server} == server
    assert root.attributes[sc.GEN_AI_REQUEST_MODEL] == "test-model"  # the tracker's own wins
    (point,) = h.metrics()[sc.METRIC_TTFT]
    assert {k: point.attributes[k] for k in server} == server
    with pytest.raises(TypeError, match="attributes"):
        make_harness(attributes={sc.SERVER_PORT: [8000]})


# Names the GenAI semantic conventions retired, and what replaced them (semconv-genai #440: the prompt
# tokens written into a cache are ``cache_write``). otel-llm emits none of the retired ones.
RETIRED = {"gen_ai.usage.cache_creation.input_tokens": "gen_ai.usage.cache_write.input_tokens"}


def test_no_attribute_under_a_retired_semantic_conventions_name(harness):
    t = harness.tracker
    t.queued("r1", ts=T0, prompt_tokens=12)
    t.scheduled(["r1"], ts=T0 + 0.01, cached_tokens=[8])
    t.tokens(["r1"], ts=T0 + 0.02)
    t.engine_state(prefix_cache_queries=12, prefix_cache_hits=8, kv_cache_usage=0.5)
    t.finished("r1", ts=T0 + 0.03)
    keys = set()
    for span in harness.finished_spans():
        keys |= set(span.attributes)
        for event in span.events:
            keys |= set(event.attributes or {})
    for points in harness.metrics().values():
        for p in points:
            keys |= set(p.attributes)
    assert sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS in keys  # the cache figures are there, by their names
    assert not keys & set(RETIRED), keys & set(RETIRED)
    names = {v for k, v in vars(sc).items() if k.isupper() and isinstance(v, str)}
    assert not names & set(RETIRED)
