"""One request served by a prefill tracker and a decode tracker: one trace, the documented spans on each
side, the intervals by the documented rules, metrics per role. Timestamps are explicit monotonic seconds,
so every number below follows from the definitions (lifecycle terms in docs/disaggregated.md)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from otel_llm import RequestTracker
from otel_llm import semconv as sc

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

# The request's events: A arrival, prefill instance Q/S/F, preempted at P before F, rescheduled R,
# K_p sent; decode instance Q_d (transfer metadata arrived), K_d received, S1_d, tokens, preemption
# after the first delivered token, E.
A, Q, S1, P, R, F, KP = 100.0, 100.5, 101.0, 101.2, 101.7, 102.0, 102.3
QD, KD, SD, T1, PD, RD, T2, T3, E = 102.1, 102.4, 102.6, 102.8, 103.0, 103.5, 103.9, 104.0, 104.0


def points(h: Any, name: str) -> list[Any]:
    return h.metrics().get(name, [])


def serve_one(make_harness: Any, **kwargs: Any) -> tuple[Any, Any]:
    pre, dec = make_harness(role="prefill"), make_harness(role="decode")
    pre.tracker.queued("r1", ts=Q, arrival_ts=A, prompt_tokens=40, **kwargs)
    pre.tracker.scheduled(["r1"], ts=S1)
    pre.tracker.preempted(["r1"], ts=P)
    pre.tracker.scheduled(["r1"], ts=R)
    pre.tracker.tokens(["r1"], ts=F)
    carrier = pre.tracker.handoff_carrier("r1")
    assert carrier is not None and carrier["traceparent"] == pre.tracker.traceparent("r1")
    dec.tracker.queued("r1", ts=QD, prompt_tokens=40, carrier=carrier)
    pre.tracker.kv_sent("r1", ts=KP, num_bytes=4096)
    dec.tracker.kv_received("r1", ts=KD, num_bytes=4096)
    dec.tracker.scheduled(["r1"], ts=SD)
    dec.tracker.tokens(["r1"], ts=T1, counts=[2])  # the prefill instance's token, delivered with the next
    dec.tracker.preempted(["r1"], ts=PD)
    dec.tracker.scheduled(["r1"], ts=RD)
    dec.tracker.tokens(["r1"], ts=T2)
    dec.tracker.tokens(["r1"], ts=T3)
    dec.tracker.finished("r1", reason="length", ts=E)
    return pre, dec


def by_name(spans: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for s in sorted(spans, key=lambda s: s.start_time):
        out.setdefault(s.name, []).append(s)
    return out


def close(ns: int, mono: float, anchor_ns: int, anchor: float) -> bool:
    return abs(ns - (anchor_ns + round((mono - anchor) * 1e9))) <= 5_000  # 5 µs: two processes' offsets


def test_one_trace_with_both_instances_under_one_request(make_harness: Any) -> None:
    pre, dec = serve_one(make_harness)
    pre_spans, dec_spans = pre.finished_spans(), dec.finished_spans()
    assert {s.context.trace_id for s in pre_spans + dec_spans} == {dec_spans[0].context.trace_id}
    assert not [s for s in pre_spans if s.name == sc.SPAN_REQUEST], "the decode instance emits it"
    (root,) = [s for s in dec_spans if s.name == sc.SPAN_REQUEST]
    assert root.parent is None
    assert dec.tracker.handoff_carrier("r1") is None  # finished
    pre_named, dec_named = by_name(pre_spans), by_name(dec_spans)
    (p_inst,) = pre_named[sc.SPAN_INSTANCE_PREFILL]
    (d_inst,) = dec_named[sc.SPAN_INSTANCE_DECODE]
    assert p_inst.parent.span_id == root.context.span_id and p_inst.parent.is_remote
    assert d_inst.parent.span_id == root.context.span_id
    assert (
        p_inst.attributes[sc.LLM_ROLE] == sc.ROLE_PREFILL and d_inst.attributes[sc.LLM_ROLE] == sc.ROLE_DECODE
    )

    at = root.start_time
    for span, t0, t1 in (
        (root, A, E),
        (p_inst, A, KP),
        (d_inst, QD, E),
    ):
        assert close(span.start_time, t0, at, A) and close(span.end_time, t1, at, A), span.name

    def kids(parent: Any) -> list[tuple[str, float, float]]:
        found = [s for s in pre_spans + dec_spans if s.parent and s.parent.span_id == parent.context.span_id]
        return [(s.name, (s.start_time - at) / 1e9 + A, (s.end_time - at) / 1e9 + A) for s in found]

    expect_prefill = [
        (sc.SPAN_ADMISSION, A, Q),
        (sc.SPAN_QUEUE, Q, S1),
        (sc.SPAN_PREFILL, S1, F),
        (sc.SPAN_KV_TRANSFER, F, KP),
    ]
    expect_decode = [(sc.SPAN_KV_TRANSFER, QD, KD), (sc.SPAN_QUEUE, KD, SD), (sc.SPAN_DECODE, SD, E)]
    for parent, expected in ((p_inst, expect_prefill), (d_inst, expect_decode)):
        got = sorted(kids(parent), key=lambda k: k[1])
        assert [g[0] for g in got] == [e[0] for e in expected]
        for (_, g0, g1), (_, e0, e1) in zip(got, expected):
            assert g0 == pytest.approx(e0, abs=1e-5) and g1 == pytest.approx(e1, abs=1e-5)
        for before, after in itertools.pairwise(got):  # contiguous: no gap, no overlap
            assert before[2] == pytest.approx(after[1], abs=1e-6)
    # Each side's preemption sits in its own phase.
    (prefill,) = pre_named[sc.SPAN_PREFILL]
    (decode,) = dec_named[sc.SPAN_DECODE]
    assert sorted(n for n, _, _ in kids(prefill)) == [sc.SPAN_PREEMPTED, sc.SPAN_RECOMPUTE]
    assert sorted(n for n, _, _ in kids(decode)) == [sc.SPAN_PREEMPTED, sc.SPAN_RECOMPUTE]
    for span in pre_named[sc.SPAN_KV_TRANSFER] + dec_named[sc.SPAN_KV_TRANSFER]:
        assert span.attributes[sc.LLM_KV_TRANSFER_BYTES] == 4096
    assert [e.name for e in p_inst.events][-1] == sc.EVENT_KV_SENT
    assert sc.EVENT_KV_RECEIVED in [e.name for e in d_inst.events]


def test_intervals_follow_the_documented_rules(make_harness: Any) -> None:
    pre, dec = serve_one(make_harness)
    (root,) = [s for s in dec.finished_spans() if s.name == sc.SPAN_REQUEST]
    (p_inst,) = [s for s in pre.finished_spans() if s.name == sc.SPAN_INSTANCE_PREFILL]
    a, p = root.attributes, p_inst.attributes
    assert a[sc.LLM_LATENCY_TTFT] == pytest.approx(T1 - A)  # first token delivered - arrival
    assert a[sc.LLM_LATENCY_E2E] == pytest.approx(E - A)
    assert a[sc.LLM_LATENCY_KV_TRANSFER] == pytest.approx(KD - QD)
    assert a[sc.LLM_LATENCY_QUEUE] == pytest.approx(SD - KD)
    assert a[sc.LLM_LATENCY_DECODE] == pytest.approx(T3 - SD)
    assert sc.LLM_LATENCY_PREFILL not in a
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert p[sc.LLM_LATENCY_QUEUE] == pytest.approx(S1 - Q)
    assert p[sc.LLM_LATENCY_PREFILL] == pytest.approx(F - S1)  # lengthened by its preemption
    assert p[sc.LLM_LATENCY_KV_TRANSFER] == pytest.approx(KP - F)
    assert sc.LLM_LATENCY_TTFT not in p and sc.LLM_LATENCY_E2E not in p


def test_metrics_per_role(make_harness: Any) -> None:
    pre, dec = serve_one(make_harness)

    def one(h: Any, name: str) -> Any:
        (point,) = points(h, name)
        return point

    for h, role in ((pre, sc.ROLE_PREFILL), (dec, sc.ROLE_DECODE)):
        transfer = one(h, sc.METRIC_KV_TRANSFER)
        assert transfer.attributes[sc.LLM_ROLE] == role and transfer.count == 1
        assert one(h, sc.METRIC_KV_TRANSFER_BYTES).value == 4096
        assert one(h, sc.METRIC_PREEMPTIONS).value == 1
        assert one(h, sc.METRIC_QUEUE).count == 1
    assert one(pre, sc.METRIC_KV_TRANSFER).sum == pytest.approx(KP - F)
    assert one(dec, sc.METRIC_KV_TRANSFER).sum == pytest.approx(KD - QD)
    assert one(pre, sc.METRIC_PREFILL).sum == pytest.approx(F - S1)
    # Request-level values are recorded once, by the instance where the request ends.
    for name in (sc.METRIC_TTFT, sc.METRIC_REQUEST_DURATION, sc.METRIC_REQUESTS, sc.METRIC_TOKENS):
        assert points(pre, name) == [] or all(getattr(p, "count", 1) == 0 for p in points(pre, name)), name
    assert one(dec, sc.METRIC_TTFT).sum == pytest.approx(T1 - A)
    assert one(dec, sc.METRIC_DECODE).sum == pytest.approx(T3 - SD)
    assert one(dec, sc.METRIC_ITL).count == 2


def test_a_caller_parent_and_sampling_travel_with_the_transfer(make_harness: Any) -> None:
    caller = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    pre, dec = serve_one(make_harness, carrier={"traceparent": caller})
    assert pre.finished_spans()[0].context.trace_id == int("ab" * 16, 16)
    (root,) = [s for s in dec.finished_spans() if s.name == sc.SPAN_REQUEST]
    assert f"{root.context.trace_id:032x}" == "ab" * 16
    assert root.parent is not None and f"{root.parent.span_id:016x}" == "cd" * 8


def test_unsampled_on_the_prefill_side_is_unsampled_on_both(make_harness: Any) -> None:
    caller = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-00"
    pre, dec = serve_one(make_harness, carrier={"traceparent": caller})
    assert pre.finished_spans() == [] and dec.finished_spans() == []


def test_role_is_checked_and_both_is_unchanged(make_harness: Any) -> None:
    with pytest.raises(ValueError, match="role"):
        RequestTracker(role="prefil")
    h = make_harness()
    h.tracker.queued(
        "r", ts=1.0, carrier={"llm-arrival": "0.5", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    )
    h.tracker.scheduled(["r"], ts=2.0)
    h.tracker.tokens(["r"], ts=3.0)
    h.tracker.finished("r", ts=4.0)
    (root,) = h.roots()
    assert sc.LLM_ROLE not in root.attributes
    assert root.start_time == root.start_time and root.parent.span_id == int("2" * 16, 16)  # a plain parent


def _decode_from(make_harness: Any, carrier: dict[str, str]) -> Any:
    """A decode tracker that continues ``carrier`` and delivers the first tokens at T1."""
    dec = make_harness(role="decode")
    dec.tracker.queued("r1", ts=QD, prompt_tokens=40, carrier=carrier)
    dec.tracker.kv_received("r1", ts=KD, num_bytes=4096)
    dec.tracker.scheduled(["r1"], ts=SD)
    dec.tracker.tokens(["r1"], ts=T1, counts=[2])
    dec.tracker.finished("r1", reason="length", ts=E)
    (root,) = dec.roots()
    return root


def _prefill_carrier(make_harness: Any) -> dict[str, str]:
    pre = make_harness(role="prefill")
    pre.tracker.queued("r1", ts=Q, arrival_ts=A, prompt_tokens=40)
    pre.tracker.scheduled(["r1"], ts=S1)
    pre.tracker.tokens(["r1"], ts=F)
    carrier = pre.tracker.handoff_carrier("r1")
    assert carrier is not None
    return carrier


def test_the_arrival_crosses_hosts_on_the_wall_clock(make_harness: Any) -> None:
    """A decode instance on another host cannot read the prefill host's monotonic clock. Two hosts cannot
    run here, so the carrier is made on this one and then changed as the other host's would read: its
    clock id differs and its monotonic arrival is a number from another clock. The arrival comes from
    the wall-clock value, so TTFT still follows the rule (within the precision of two clock readings)."""
    carrier = _prefill_carrier(make_harness)
    assert set(carrier) >= {"llm-arrival", "llm-arrival-unix-nano", "llm-tail-sampling", "traceparent"}
    other_host = {**carrier, "llm-clock": "another-boot-id", "llm-arrival": "7.25"}
    root = _decode_from(make_harness, other_host)
    assert root.attributes[sc.LLM_LATENCY_TTFT] == pytest.approx(T1 - A, abs=1e-4)


def test_on_one_host_the_monotonic_arrival_is_used_as_it_is(make_harness: Any) -> None:
    """Same clock id: the monotonic value wins, even when the wall-clock value disagrees (a clock step
    between the two instances' readings must not move the arrival)."""
    carrier = _prefill_carrier(make_harness)
    if "llm-clock" not in carrier:
        pytest.fail("this host has a boot id (Linux): the carrier must name its monotonic clock")
    stepped = {**carrier, "llm-arrival-unix-nano": str(int(carrier["llm-arrival-unix-nano"]) + 10**12)}
    root = _decode_from(make_harness, stepped)
    assert root.attributes[sc.LLM_LATENCY_TTFT] == pytest.approx(T1 - A, abs=1e-9)


def test_a_carrier_from_an_older_version_keeps_its_monotonic_arrival(make_harness: Any) -> None:
    carrier = _prefill_carrier(make_harness)
    old = {k: v for k, v in carrier.items() if k not in ("llm-clock", "llm-arrival-unix-nano")}
    root = _decode_from(make_harness, old)
    assert root.attributes[sc.LLM_LATENCY_TTFT] == pytest.approx(T1 - A, abs=1e-9)
