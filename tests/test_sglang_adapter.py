"""SGLangAdapter on its own, in the development virtualenv, where SGLang cannot be imported.

SGLang pins a CUDA torch, so it lives only in ``.venv-sglang`` (tests/sglang/, where the same adapter
runs inside SGLang's real scheduler). Here the adapter is driven with plain objects shaped like SGLang
0.5.23's ``Req`` (the attributes the adapter reads: ``rid``, ``origin_input_ids``, ``output_ids``,
``retraction_count``, ``prefix_len`` (where a test sets it), ``finished()``, ``finished_reason``,
``finished_len``, ``finished_output`` and ``time_stats`` with SchedulerReqTimeStats'
``wait_queue_entry_time`` / ``last_forward_entry_time``), into a real RequestTracker on SDK providers
with in-memory exporters. Stamps are perf_counter seconds, the same clock as ``time.monotonic()`` on
Linux.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.integrations.sglang import SGLangAdapter, finish_reason
from otel_llm.integrations.sglang.adapter import CARRIED, SAME_CLOCK

pytestmark = pytest.mark.skipif(not SAME_CLOCK, reason="perf_counter and monotonic differ on this OS")

PROMPT = 7
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Reason:
    """Like SGLang's FINISH_* classes: ``to_json()`` gives the OpenAI-style type."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind}


class Req:
    """The part of SGLang's ``Req`` the adapter reads."""

    def __init__(self, rid: str, created: float, carrier: dict[str, str] | None = None) -> None:
        self.rid = rid
        self.origin_input_ids = list(range(PROMPT))
        self.output_ids: list[int] = []
        self.retraction_count = 0
        self.finished_reason: Reason | None = None
        self.finished_len: int | None = None
        self.finished_output = False
        carried = {"created": created, "carrier": carrier}
        self.time_stats = SimpleNamespace(wait_queue_entry_time=0.0, last_forward_entry_time=0.0)
        setattr(self.time_stats, CARRIED, carried)

    def finished(self) -> bool:
        return self.finished_reason is not None


def anomalies(harness: Any) -> int:
    return sum(p.value for p in harness.metrics().get(sc.METRIC_ANOMALIES, []))


def test_a_retracted_request_has_the_vllm_trace_shape(harness: Any) -> None:
    adapter = SGLangAdapter(harness.tracker)
    t = time.monotonic() - 10.0  # A; every stamp below is in the past, on the perf_counter clock
    req = Req("r1", created=t, carrier={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    req.time_stats.wait_queue_entry_time = t + 0.1  # Q
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.3  # S1
    adapter.admitted([req])
    req.output_ids = [1]
    adapter.streamed([req], ts=t + 0.5)  # F: prefill's token
    req.output_ids = [1, 2, 3]
    adapter.streamed([req], ts=t + 0.6)  # two tokens in one step (counted as 2)
    # Retraction: SGLang frees the KV cache, counts it, re-queues with a new stamp (P1).
    req.retraction_count = 1
    req.time_stats.last_forward_entry_time = 0.0
    req.time_stats.wait_queue_entry_time = t + 0.7
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.9  # R1: admitted again, recomputes prompt + 3
    adapter.admitted([req])
    req.output_ids = [1, 2, 3, 4]
    adapter.streamed([req], ts=t + 1.0)  # T1
    req.finished_reason, req.finished_len = Reason("length"), 4
    adapter.streamed([req], ts=t + 1.1)  # E
    assert adapter.in_flight == 0

    trace = harness.trace("r1", arrival=t)
    root = trace.root
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_ID
    assert root.attributes[sc.LLM_PREEMPTIONS] == 1
    assert root.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == PROMPT
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert list(root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["length"]
    trace.assert_interval(trace.child(root, sc.SPAN_ADMISSION), t, t + 0.1)
    trace.assert_interval(trace.child(root, sc.SPAN_QUEUE), t + 0.1, t + 0.3)
    trace.assert_interval(trace.child(root, sc.SPAN_PREFILL), t + 0.3, t + 0.5)
    decode = trace.child(root, sc.SPAN_DECODE)
    trace.assert_interval(decode, t + 0.5, t + 1.1)
    trace.assert_interval(trace.child(decode, sc.SPAN_PREEMPTED), t + 0.7, t + 0.9)
    trace.assert_interval(trace.child(decode, sc.SPAN_RECOMPUTE), t + 0.9, t + 1.0)
    assert root.attributes[sc.LLM_LATENCY_QUEUE] == pytest.approx(0.2)
    assert anomalies(harness) == 0


def test_chunked_prefill_admitting_again_with_one_stamp_is_one_scheduled(harness: Any) -> None:
    adapter = SGLangAdapter(harness.tracker)
    t = time.monotonic() - 5.0
    req = Req("chunked", created=t)
    req.time_stats.wait_queue_entry_time = t + 0.1
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.2
    for _ in range(3):  # one prefill per chunk, the same admission stamp
        adapter.admitted([req])
    req.output_ids = [1]
    req.finished_reason, req.finished_len = Reason("length"), 1
    adapter.streamed([req], ts=t + 0.4)
    trace = harness.trace("chunked", arrival=t)
    assert len(trace.events(sc.EVENT_SCHEDULED)) == 1
    assert anomalies(harness) == 0


def test_prefix_len_is_the_cache_hit_and_what_each_recompute_reused(harness: Any) -> None:
    # SGLang's Req.prefix_len right after get_new_batch_prefill: tokens of what it is about to prefill
    # that its radix cache matched (a later chunk of one admission has a larger one, same stamp).
    adapter = SGLangAdapter(harness.tracker)
    t = time.monotonic() - 5.0
    req = Req("hit", created=t)
    req.time_stats.wait_queue_entry_time = t + 0.1
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.2
    req.prefix_len = 3  # of the 7-token prompt
    adapter.admitted([req])
    req.prefix_len = 5  # a later chunk of the same admission: not a second figure
    adapter.admitted([req])
    req.output_ids = [1, 2, 3]
    adapter.streamed([req], ts=t + 0.3)
    req.retraction_count = 1
    req.time_stats.last_forward_entry_time = 0.0
    req.time_stats.wait_queue_entry_time = t + 0.4
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.5
    req.prefix_len = 8  # of its 10-token context: recomputes 2
    adapter.admitted([req])
    req.output_ids = [1, 2, 3, 4]
    req.finished_reason, req.finished_len = Reason("length"), 4
    adapter.streamed([req], ts=t + 0.6)

    root = harness.trace("hit", arrival=t).root
    assert root.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 3
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS] == 2
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] == 8
    by_source = {
        p.attributes[sc.LLM_PROMPT_TOKENS_SOURCE]: p.value for p in harness.metrics()[sc.METRIC_PROMPT_TOKENS]
    }
    assert by_source[sc.PROMPT_SOURCE_COMPUTED] == 4
    assert by_source[sc.PROMPT_SOURCE_PREFIX_CACHE] == 3
    assert anomalies(harness) == 0


def test_a_finish_streamed_twice_is_reported_once(harness: Any) -> None:
    # SGLang's overlap scheduler streams a request that stopped on EOS again with the next batch.
    adapter = SGLangAdapter(harness.tracker)
    t = time.monotonic() - 5.0
    req = Req("eos", created=t)
    req.time_stats.wait_queue_entry_time = t + 0.1
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.2
    adapter.admitted([req])
    req.output_ids = [1, 2, 3]  # the overlap step may have appended past EOS; finished_len is the truth
    req.finished_reason, req.finished_len = Reason("stop"), 2
    adapter.streamed([req], ts=t + 0.3)
    req.finished_output = True  # what SGLang sets once it streamed the finish
    adapter.streamed([req], ts=t + 0.4)
    req.finished_output = False  # even without SGLang's flag: no longer in flight here
    adapter.streamed([req], ts=t + 0.5)
    (root,) = harness.roots()
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert list(root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["stop"]
    assert anomalies(harness) == 0


def test_rejected_requests_health_probes_and_strangers_are_not_tracked(harness: Any) -> None:
    adapter = SGLangAdapter(harness.tracker)
    t = time.monotonic() - 5.0
    rejected = Req("rejected", created=t)  # never entered the queue: no wait_queue_entry_time
    adapter.requeued(rejected)
    probe = Req("HEALTH_CHECK_0123", created=t)
    probe.time_stats.wait_queue_entry_time = t + 0.1
    adapter.requeued(probe)
    stranger = Req("stranger", created=t)  # queued before instrument(): never seen by requeued
    stranger.output_ids = [1]
    stranger.finished_reason = Reason("stop")
    adapter.streamed([probe, stranger], ts=t + 0.2)
    adapter.admitted([probe, stranger])
    assert adapter.in_flight == 0
    assert harness.roots() == []
    assert anomalies(harness) == 0


def test_an_abort_is_the_finish_reason(harness: Any) -> None:
    adapter = SGLangAdapter(harness.tracker)
    t = time.monotonic() - 5.0
    req = Req("gone", created=t)
    req.time_stats.wait_queue_entry_time = t + 0.1
    adapter.requeued(req)
    req.time_stats.last_forward_entry_time = t + 0.2
    adapter.admitted([req])
    req.output_ids = [1, 2]
    adapter.streamed([req], ts=t + 0.3)
    req.finished_reason = Reason("abort")  # the client went away: SGLang aborts, finished_len unset
    adapter.streamed([req], ts=t + 0.4)
    (root,) = harness.roots()
    assert list(root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == [sc.REASON_ABORT]
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


def test_finish_reason_reads_sglang_types_and_tolerates_others() -> None:
    def req(reason: Any) -> Any:
        return SimpleNamespace(finished_reason=reason)

    assert finish_reason(req(Reason("length"))) == "length"
    assert finish_reason(req(None)) == sc.REASON_STOP

    class FINISH_SOMETHING_NEW:  # SGLang names its finish reasons so
        pass

    assert finish_reason(req(FINISH_SOMETHING_NEW())) == "finish_something_new"
