"""The vLLM scenarios that go beyond ``mixed``: a preemption before the first token, speculative decoding.

``prefill_preemption``: under chunked prefill on a tiny KV cache, vLLM evicts a request whose prompt is
still being computed. By the lifecycle rules that preemption lengthens prefill and time to first token,
and its llm.preempted / llm.recompute spans belong under llm.prefill. ``speculative``: vLLM's scheduler
verifies draft tokens, so one engine step gives a request several tokens. The generic equalities with
vLLM's FinishedRequestStats (every scenario) are in test_vllm_integration.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from otel_llm import semconv as sc
from tests.vllm.conftest import ABS, needs_vllm, roots, seconds, trace_of, vllm_preemptions, vllm_stats

pytestmark = needs_vllm


@pytest.fixture
def prefill_run(vllm_runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return vllm_runs["prefill_preemption"]


@pytest.fixture
def evicted_in_prefill(prefill_run: dict[str, Any]) -> str:
    """The request vLLM preempted before its first token (the scenario exists to produce one)."""
    found = [
        rid
        for rid in prefill_run["requests"]
        if any(p.before_first_token for p in vllm_preemptions(prefill_run, rid))
    ]
    assert len(found) == 1, prefill_run["vllm_timeline"]
    return found[0]


def test_vllm_preempted_a_request_before_its_first_token(
    prefill_run: dict[str, Any], evicted_in_prefill: str
) -> None:
    kinds = [
        kind for kind, *_ in sorted(prefill_run["vllm_timeline"][evicted_in_prefill], key=lambda e: e[1])
    ]
    # vLLM's own record: scheduled, evicted mid-prompt, rescheduled, and only then a first token.
    assert kinds[:5] == ["QUEUED", "SCHEDULED", "PREEMPTED", "SCHEDULED", "TOKENS"]
    assert vllm_stats(prefill_run)[evicted_in_prefill]["num_preemptions"] == 1


def test_prefill_preemption_spans_are_under_prefill(
    prefill_run: dict[str, Any], evicted_in_prefill: str
) -> None:
    root = roots(prefill_run)[evicted_in_prefill]
    spans = trace_of(prefill_run, root)
    (prefill,) = [s for s in spans if s["name"] == sc.SPAN_PREFILL]
    (decode,) = [s for s in spans if s["name"] == sc.SPAN_DECODE]
    (waited,) = [s for s in spans if s["name"] == sc.SPAN_PREEMPTED]
    (redone,) = [s for s in spans if s["name"] == sc.SPAN_RECOMPUTE]
    assert waited["parent_id"] == redone["parent_id"] == prefill["span_id"]
    assert not [s for s in spans if s["parent_id"] == decode["span_id"]]
    # The recompute ends where the prefill does: at the first token.
    assert (
        prefill["start"]
        < waited["start"]
        < waited["end"]
        == redone["start"]
        < redone["end"]
        == prefill["end"]
    )
    (first_token,) = [e for e in root["events"] if e["name"] == sc.EVENT_FIRST_TOKEN]
    assert first_token["ts"] == prefill["end"]
    (preempted_event,) = [e for e in root["events"] if e["name"] == sc.EVENT_PREEMPTED]
    assert preempted_event["attributes"][sc.LLM_OUTPUT_TOKENS] == 0
    resumed = [
        e["attributes"].get(sc.LLM_RESUMED, False) for e in root["events"] if e["name"] == sc.EVENT_SCHEDULED
    ]
    assert resumed == [False, True]


def test_prefill_preemption_lengthens_prefill_and_ttft(
    prefill_run: dict[str, Any], evicted_in_prefill: str
) -> None:
    attributes = roots(prefill_run)[evicted_in_prefill]["attributes"]
    vllm = vllm_stats(prefill_run)[evicted_in_prefill]
    (preemption,) = vllm_preemptions(prefill_run, evicted_in_prefill)
    evicted = preemption.next_tokens - preemption.preempted  # waiting plus recomputing, vLLM's timestamps
    assert attributes[sc.LLM_LATENCY_PREFILL] == pytest.approx(vllm["prefill_time"], abs=ABS)
    assert attributes[sc.LLM_LATENCY_PREFILL] > evicted
    assert attributes[sc.LLM_LATENCY_QUEUE] == pytest.approx(
        vllm["queued_time"], abs=ABS
    )  # queue stays S1 - Q
    # TTFT runs from arrival, at or before queued: it holds queue and the lengthened prefill.
    ttft = attributes[sc.LLM_LATENCY_TTFT]
    assert ttft >= attributes[sc.LLM_LATENCY_QUEUE] + attributes[sc.LLM_LATENCY_PREFILL] - ABS


def test_prefill_preemption_metrics(prefill_run: dict[str, Any], evicted_in_prefill: str) -> None:
    (preemption,) = vllm_preemptions(prefill_run, evicted_in_prefill)
    spans = trace_of(prefill_run, roots(prefill_run)[evicted_in_prefill])
    (waited,) = [s for s in spans if s["name"] == sc.SPAN_PREEMPTED]
    assert seconds(waited) == pytest.approx(preemption.rescheduled - preemption.preempted, abs=ABS)
    by_name = {
        m["name"]: m
        for m in prefill_run["metrics"]
        if m["name"] in (sc.METRIC_PREEMPTED, sc.METRIC_RECOMPUTE)
    }
    assert by_name[sc.METRIC_PREEMPTED]["count"] == 1
    assert by_name[sc.METRIC_PREEMPTED]["sum"] == pytest.approx(
        preemption.rescheduled - preemption.preempted, abs=ABS
    )
    assert by_name[sc.METRIC_RECOMPUTE]["count"] == 1
    assert by_name[sc.METRIC_RECOMPUTE]["sum"] == pytest.approx(
        preemption.next_tokens - preemption.rescheduled, abs=ABS
    )


def test_speculative_steps_carry_several_tokens(vllm_runs: dict[str, dict[str, Any]]) -> None:
    run = vllm_runs["speculative"]
    batches = {
        rid: [n for kind, _, _, n in entries if kind == "TOKENS"]
        for rid, entries in run["vllm_timeline"].items()
    }
    assert any(n > 1 for counts in batches.values() for n in counts), batches  # vLLM accepted drafts
    by_id = roots(run)
    stats = vllm_stats(run)
    for request_id, counts in batches.items():
        assert by_id[request_id]["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == sum(counts)
        assert stats[request_id]["num_generation_tokens"] == sum(counts)
