"""Tail sampling across a prefill and a decode instance: the prefill instance's decision travels in the
hand-off carrier and the decode instance keeps what it kept (rule ``prefill_kept``); the decode instance
may keep more on its own rules (then the trace has only its half); it never drops what prefill kept.
"""

from __future__ import annotations

from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.emit.sampling import TailSampling
from otel_llm.hooks.handoff import KEY_TAIL

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

NEVER = TailSampling(ratio=0.0)  # keeps only on the rules (no share of the rest)
CALLER_UNSAMPLED = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-00"}


def hand_over(
    make_harness: Any,
    prefill_tail: TailSampling | bool,
    decode_tail: TailSampling | bool,
    *,
    preempt_prefill: bool = False,
    preempt_decode: bool = False,
) -> tuple[Any, Any, dict[str, str]]:
    """One request through a prefill and a decode tracker (monotonic seconds 100..104); the carrier."""
    pre = make_harness(role="prefill", tail_sampling=prefill_tail)
    dec = make_harness(role="decode", tail_sampling=decode_tail)
    pre.tracker.queued("r", ts=100.0, prompt_tokens=20)
    pre.tracker.scheduled(["r"], ts=100.1)
    if preempt_prefill:
        pre.tracker.preempted(["r"], ts=100.2)
        pre.tracker.scheduled(["r"], ts=100.3)
    pre.tracker.tokens(["r"], ts=100.5)
    carrier = pre.tracker.handoff_carrier("r")
    assert carrier is not None
    dec.tracker.queued("r", ts=100.6, prompt_tokens=20, carrier=carrier)
    pre.tracker.kv_sent("r", ts=100.7, num_bytes=1024)
    dec.tracker.kv_received("r", ts=100.8, num_bytes=1024)
    dec.tracker.scheduled(["r"], ts=101.0)
    dec.tracker.tokens(["r"], ts=101.1, counts=[2])
    if preempt_decode:
        dec.tracker.preempted(["r"], ts=101.2)
        dec.tracker.scheduled(["r"], ts=101.3)
    dec.tracker.tokens(["r"], ts=101.5)
    dec.tracker.finished("r", reason="length", ts=104.0)
    return pre, dec, carrier


def names(h: Any) -> set[str]:
    return {s.name for s in h.finished_spans()}


def decisions(h: Any) -> dict[tuple[str, str], int]:
    return {
        (p.attributes[sc.LLM_SAMPLING_DECISION], p.attributes[sc.LLM_SAMPLING_REASON]): p.value
        for p in h.metrics().get(sc.METRIC_SAMPLING_DECISIONS, [])
    }


def test_what_prefill_kept_decode_keeps(make_harness: Any) -> None:
    pre, dec, carrier = hand_over(make_harness, NEVER, NEVER, preempt_prefill=True)
    assert carrier[KEY_TAIL] == "keep"
    assert sc.SPAN_INSTANCE_PREFILL in names(pre)
    assert {sc.SPAN_REQUEST, sc.SPAN_INSTANCE_DECODE} <= names(dec)
    assert decisions(pre) == {("keep", "preempted"): 1}
    assert decisions(dec) == {("keep", "prefill_kept"): 1}


def test_what_both_drop_leaves_no_span_on_either_side(make_harness: Any) -> None:
    pre, dec, carrier = hand_over(make_harness, NEVER, NEVER)
    assert carrier[KEY_TAIL] == "drop"
    assert pre.finished_spans() == [] and dec.finished_spans() == []
    assert decisions(pre) == {("drop", "ratio"): 1} == decisions(dec)


def test_decode_keeps_on_its_own_rules_when_prefill_dropped(make_harness: Any) -> None:
    pre, dec, carrier = hand_over(make_harness, NEVER, NEVER, preempt_decode=True)
    assert carrier[KEY_TAIL] == "drop"
    assert pre.finished_spans() == []  # the prefill half was never built
    assert {sc.SPAN_REQUEST, sc.SPAN_INSTANCE_DECODE, sc.SPAN_PREEMPTED} <= names(dec)
    assert decisions(dec) == {("keep", "preempted"): 1}


def test_a_prefill_instance_without_tail_sampling_makes_decode_keep_everything(make_harness: Any) -> None:
    pre, dec, carrier = hand_over(make_harness, False, NEVER)
    assert carrier[KEY_TAIL] == "keep"
    assert sc.SPAN_INSTANCE_PREFILL in names(pre) and sc.SPAN_INSTANCE_DECODE in names(dec)
    assert decisions(dec) == {("keep", "prefill_kept"): 1}


def test_the_e2e_rule_on_a_prefill_instance_does_not_break_its_hand_off(make_harness: Any) -> None:
    # A handed-off request has no e2e on the prefill side; the rule must pass over it, not raise.
    pre, _dec, carrier = hand_over(make_harness, TailSampling(ratio=0.0, e2e_s=0.5), NEVER)
    assert carrier[KEY_TAIL] == "drop" and not pre.tracker.anomaly_counts
    assert pre.metrics()[sc.METRIC_KV_TRANSFER]


@pytest.mark.parametrize("value", ["keep", "drop", "garbage", None])
def test_decode_reads_the_carried_decision_and_ignores_nonsense(make_harness: Any, value: str | None) -> None:
    pre = make_harness(role="prefill")
    dec = make_harness(role="decode", tail_sampling=NEVER)
    pre.tracker.queued("r", ts=1.0)
    carrier = dict(pre.tracker.handoff_carrier("r") or {})
    carrier.pop(KEY_TAIL)
    if value is not None:
        carrier[KEY_TAIL] = value
    dec.tracker.queued("r", ts=1.1, carrier=carrier)
    dec.tracker.finished("r", reason="length", ts=1.2)
    kept = value == "keep"
    assert bool(dec.finished_spans()) is kept
