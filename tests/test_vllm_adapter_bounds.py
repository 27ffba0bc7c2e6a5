"""The vLLM adapter forgets what the tracker evicted, so its maps stay as bounded as the tracker.

vLLM itself is not needed here: the adapter reads vLLM's requests, outputs and events by attribute name,
so plain objects with those attributes stand in for them; the tracker is real.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from otel_llm import RequestTracker
from otel_llm.integrations.vllm.adapter import VLLMAdapter


def request(rid: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, arrival_time=time.time(), prompt_token_ids=[1, 2, 3])


def queued_output(rid: str) -> SimpleNamespace:
    event = SimpleNamespace(type=SimpleNamespace(name="QUEUED"), timestamp=time.monotonic())
    return SimpleNamespace(request_id=rid, events=[event], new_token_ids=[])


def test_requests_the_tracker_evicts_are_forgotten() -> None:
    tracker = RequestTracker(max_in_flight=4)
    adapter = VLLMAdapter(lambda model, operation: tracker)
    for k in range(50):  # never finished: the tracker evicts the oldest past 4 in flight
        rid = f"r{k}"
        adapter.request_added(request(rid))
        adapter.outputs([queued_output(rid)], batch_ts=time.monotonic())
    assert tracker.in_flight == 4
    assert len(adapter._live) <= 5 and len(adapter._pending) == 0


def test_registrations_that_never_queue_expire_with_the_trackers_age_limit() -> None:
    tracker = RequestTracker(max_age_s=0.05)
    adapter = VLLMAdapter(lambda model, operation: tracker)
    for k in range(20):
        adapter.request_added(request(f"lost{k}"))  # no output ever arrives for these
    time.sleep(0.1)
    adapter.request_added(request("new"))
    assert list(adapter._pending) == ["new"]
